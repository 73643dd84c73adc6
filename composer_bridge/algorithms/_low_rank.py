"""Low-rank fits of linear maps and convolutions to data (the maths behind ``Factorize.set_rank``).

:func:`factorize_matrix` finds ``Wa`` (``D x k``), ``Wb`` (``k x M``) and a bias ``b`` with
``X @ Wa @ Wb + b`` close to ``Y`` in the least-squares sense: it starts from the truncated SVD
of the current weight and alternates exact least-squares solves for ``Wb`` and ``Wa``, each of
which can only lower the error. :func:`factorize_conv2d` does the same for a convolution by
writing it as a matrix product over unfolded input patches. Both take Composer's arguments in
Composer's order and return a :class:`LowRankSolution`.

Examples:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(200, 16, generator=g)
    >>> W = torch.randn(16, 4, generator=g) @ torch.randn(4, 12, generator=g)  # rank 4
    >>> solution = factorize_matrix(X, X @ W, W, rank=4)
    >>> solution.Wa.shape, solution.Wb.shape, solution.rank, solution.nmse < 1e-8
    (torch.Size([16, 4]), torch.Size([4, 12]), 4, True)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.utils import _pair

__all__ = ["LowRankSolution", "factorize_conv2d", "factorize_matrix"]


@dataclasses.dataclass
class LowRankSolution:
    """The factors of a low-rank fit: the output is ``(X @ Wa) @ Wb + bias``.

    Attributes:
        Wa: the first factor (``D x rank`` for a matrix, ``(rank, C_in, kh, kw)`` for a convolution).
            When no factorisation was needed (``rank == -1``), the whole map, and ``Wb`` is ``None``
            or the unchanged second factor.
        Wb: the second factor (``rank x M``, or ``(C_out, rank, 1, 1)``).
        bias: the bias added after ``Wb`` (length ``M``).
        rank: the latent size, or ``-1`` when the requested rank called for no factorisation.
        nmse: mean squared error of the fit on the given data divided by the variance of the
            target: 0 is exact, 1 is no better than predicting the mean.
    """

    Wa: torch.Tensor | None = None
    Wb: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    rank: int = -1
    nmse: float = 0.0


def _solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The minimum-norm least-squares ``x`` of ``a @ x = b`` (robust to rank-deficient ``a``)."""
    return torch.linalg.pinv(a) @ b


def _relative_error(target: torch.Tensor, fit: torch.Tensor) -> float:
    variance = target.var()
    if variance == 0:
        return 0.0 if torch.equal(target, fit) else float("inf")
    return float((target - fit).pow(2).mean() / variance)


def _as_rank(rank: float, in_size: int, current: int, where: str) -> int:
    if isinstance(rank, bool) or not isinstance(rank, (int, float)) or rank <= 0:
        raise ValueError(
            f"{where}(rank={rank!r}): give a whole number of latent units >= 1, or a fraction in (0, 1) of the "
            "input size."
        )
    if rank < 1:
        return max(1, min(int(rank * in_size), current))
    if rank != int(rank):
        raise ValueError(f"{where}(rank={rank!r}): a rank >= 1 must be a whole number.")
    return int(rank)


def factorize_matrix(
    X: torch.Tensor,  # noqa: N803 - Composer's argument names
    Y: torch.Tensor,  # noqa: N803
    Wa: torch.Tensor,  # noqa: N803
    Wb: torch.Tensor | None = None,  # noqa: N803
    bias: torch.Tensor | None = None,
    rank: float = 0.25,
    n_iters: int = 3,
) -> LowRankSolution:
    """Fit ``Y`` by ``X @ Wa' @ Wb' + bias'`` with ``Wa'`` of ``rank`` columns, starting from the current weights.

    The map being approximated is ``Wa`` (``D x M``), or ``Wa @ Wb`` (``D x d``, ``d x M``) when
    it is already factorised, which lets a factorised layer shrink its rank further.

    Args:
        X: inputs, ``N x D``.
        Y: the outputs to preserve, ``N x M`` (usually the current map applied to ``X``, bias included).
        Wa: the weight (``D x M``) or its first factor (``D x d``).
        Wb: the second factor (``d x M``), or ``None``.
        bias: the bias included in ``Y``, or ``None``.
        rank: the latent size: a whole number, or a fraction in (0, 1) of ``D`` (capped at the
            current latent size).
        n_iters: alternating least-squares rounds after the SVD start; each one can only lower the error.

    Returns:
        A :class:`LowRankSolution`. When ``rank`` is at least ``D`` or ``M``, factorising cannot
        help: ``Wa`` is then the plain least-squares map and ``Wb`` is ``None``; when it is at least
        the current latent size, the current factors come back unchanged. In both cases ``rank`` is ``-1``.

    Examples:
        >>> import torch
        >>> X, W = torch.randn(64, 8), torch.randn(8, 8)
        >>> factorize_matrix(X, X @ W, W, rank=2).Wb.shape
        torch.Size([2, 8])
    """
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0]:
        raise ValueError(
            f"factorize_matrix needs X (N, D) and Y (N, M) with the same N, got {tuple(X.shape)} and {tuple(Y.shape)}."
        )
    if isinstance(n_iters, bool) or not isinstance(n_iters, int) or n_iters < 0:
        raise ValueError(f"factorize_matrix(n_iters={n_iters!r}): needs an int >= 0.")
    X, Y, Wa = X.detach(), Y.detach(), Wa.detach()  # noqa: N806
    Wb = Wb.detach() if Wb is not None else None  # noqa: N806
    k = _as_rank(rank, X.shape[1], Wa.shape[1], "factorize_matrix")
    bias = bias.detach() if bias is not None else None
    target = Y - bias if bias is not None else Y
    if k >= X.shape[1] or k >= Y.shape[1]:
        return LowRankSolution(Wa=_solve(X, target), bias=bias, rank=-1)
    if Wb is not None and k >= Wa.shape[1]:
        return LowRankSolution(Wa=Wa, Wb=Wb, bias=bias, rank=-1)

    weight = Wa @ Wb if Wb is not None else Wa
    u, s, vh = torch.linalg.svd(weight, full_matrices=False)
    root = s[:k].sqrt()
    first, second = u[:, :k] * root, root[:, None] * vh[:k]
    # The unconstrained regression of target on X; for a fixed second factor the best first factor
    # is this map times the second factor's pseudo-inverse (the normal equations of the full problem).
    unconstrained = _solve(X, target)
    for _ in range(n_iters):
        second = _solve(X @ first, target)
        first = unconstrained @ torch.linalg.pinv(second)
    fit = X @ first @ second
    new_bias = (target - fit).mean(dim=0)
    if bias is not None:
        new_bias = new_bias + bias
    return LowRankSolution(Wa=first, Wb=second, bias=new_bias, rank=k, nmse=_relative_error(Y, fit + new_bias))


def _padding_for(padding: Any, kernel: tuple[int, int], dilation: tuple[int, int]) -> tuple[int, int]:
    if padding == "valid":
        return (0, 0)
    if padding == "same":
        totals = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
        if any(t % 2 for t in totals):
            raise ValueError("factorize_conv2d supports padding='same' only where it pads both sides equally.")
        return (totals[0] // 2, totals[1] // 2)
    return _pair(padding)


def _patches(X: torch.Tensor, kernel: tuple[int, int], conv2d_kwargs: dict[str, Any]) -> torch.Tensor:  # noqa: N803
    """``X`` as rows of input patches (``N * positions x C_in * kh * kw``): the convolution is a matrix product on them."""
    unknown = set(conv2d_kwargs) - {"stride", "padding", "dilation", "groups", "padding_mode"}
    if unknown:
        raise TypeError(f"factorize_conv2d got unexpected convolution arguments {sorted(unknown)}.")
    if conv2d_kwargs.get("groups", 1) != 1:
        raise NotImplementedError(
            f"factorize_conv2d cannot factorise a grouped convolution (groups={conv2d_kwargs['groups']})."
        )
    stride, dilation = _pair(conv2d_kwargs.get("stride", 1)), _pair(conv2d_kwargs.get("dilation", 1))
    padding = _padding_for(conv2d_kwargs.get("padding", 0), kernel, dilation)
    mode = conv2d_kwargs.get("padding_mode", "zeros")
    if mode != "zeros" and any(padding):
        X = F.pad(X, (padding[1], padding[1], padding[0], padding[0]), mode=mode)  # noqa: N806
        padding = (0, 0)
    columns = F.unfold(X, kernel, dilation=dilation, padding=padding, stride=stride)  # N, fan_in, positions
    return columns.transpose(1, 2).reshape(-1, columns.shape[1])


def _conv_to_matrix(weight: torch.Tensor) -> torch.Tensor:
    return weight.reshape(weight.shape[0], -1).T  # fan_in x out_channels


def _matrix_to_conv(matrix: torch.Tensor | None, kernel: tuple[int, int]) -> torch.Tensor | None:
    return None if matrix is None else matrix.T.reshape(matrix.shape[1], -1, *kernel)


def factorize_conv2d(
    X: torch.Tensor,  # noqa: N803 - Composer's argument names
    Wa: torch.Tensor,  # noqa: N803
    Wb: torch.Tensor | None = None,  # noqa: N803
    rank: float = 0.25,
    biasA: torch.Tensor | None = None,  # noqa: N803
    biasB: torch.Tensor | None = None,  # noqa: N803
    n_iters: int = 3,
    **conv2d_kwargs: Any,
) -> LowRankSolution:
    """Fit a ``KxK`` convolution by a ``KxK`` convolution to ``rank`` channels followed by a ``1x1`` convolution.

    The convolution being approximated is ``Wa`` (``(C_out, C_in, kh, kw)``) with bias ``biasA``,
    or, when already factorised, ``Wa`` (``(d, C_in, kh, kw)``, bias ``biasA``) followed by ``Wb``
    (``(C_out, d, 1, 1)``, bias ``biasB``). Its outputs on ``X`` are the target of
    :func:`factorize_matrix` applied to ``X``'s unfolded patches.

    Args:
        X: inputs ``(N, C_in, H, W)``.
        Wa: the convolution's weight, or the first convolution's when already factorised.
        Wb: the second (``1x1``) convolution's weight, or ``None``.
        rank: the latent channel count, or a fraction in (0, 1) of the patch size ``C_in * kh * kw``.
        biasA: the bias of the convolution ``Wa``, or ``None``.
        biasB: the bias of the convolution ``Wb``, or ``None``.
        n_iters: alternating least-squares rounds.
        **conv2d_kwargs: the original convolution's ``stride``, ``padding``, ``dilation``,
            ``padding_mode`` (``groups`` must be 1). Strides and dilations are supported (Composer
            supports only 1).

    Returns:
        A :class:`LowRankSolution` with ``Wa`` ``(rank, C_in, kh, kw)``, ``Wb`` ``(C_out, rank, 1, 1)``
        and ``bias`` for the second convolution.

    Examples:
        >>> import torch
        >>> X, W = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3)
        >>> solution = factorize_conv2d(X, W, rank=2, padding=1)
        >>> solution.Wa.shape, solution.Wb.shape
        (torch.Size([2, 4, 3, 3]), torch.Size([6, 2, 1, 1]))
    """
    if X.ndim != 4 or Wa.ndim != 4 or X.shape[1] != Wa.shape[1]:
        raise ValueError(
            f"factorize_conv2d needs X (N, C_in, H, W) and Wa (C, C_in, kh, kw) with the same C_in, got "
            f"{tuple(X.shape)} and {tuple(Wa.shape)}."
        )
    if Wb is None and biasB is not None:
        raise RuntimeError("factorize_conv2d got biasB but no Wb: biasB is the bias of the second convolution Wb.")
    kernel = (int(Wa.shape[2]), int(Wa.shape[3]))
    patches = _patches(X.detach(), kernel, conv2d_kwargs)
    first = _conv_to_matrix(Wa.detach())
    second = _conv_to_matrix(Wb.detach()) if Wb is not None else None
    # The biases add a constant to every output; handing it to factorize_matrix as the bias keeps the
    # factors from spending rank on reproducing it.
    offset = biasA.detach() if biasA is not None else None
    if offset is not None and second is not None:
        offset = offset @ second
    if biasB is not None:
        offset = biasB.detach() if offset is None else offset + biasB.detach()
    outputs = patches @ first if second is None else patches @ first @ second
    if offset is not None:
        outputs = outputs + offset
    solution = factorize_matrix(patches, outputs, first, second, bias=offset, rank=rank, n_iters=n_iters)
    solution.Wa = _matrix_to_conv(solution.Wa, kernel)
    solution.Wb = _matrix_to_conv(solution.Wb, (1, 1))
    return solution
