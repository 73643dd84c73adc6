"""BlurPool (Zhang, 2019): low-pass filter before every downsampling, for shift invariance.

Strided convolutions become :class:`BlurConv2d` (a 3x3 binomial blur, then the original
convolution, whose weights are kept) and max-pools become :class:`BlurMaxPool2d` (max with
stride 1, then a strided blur).

Examples:
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.MaxPool2d(2))
    >>> apply_blurpool(net)
    2
    >>> [type(m).__name__ for m in net]
    ['BlurConv2d', 'BlurMaxPool2d']
    >>> net(torch.randn(1, 16, 8, 8)).shape
    torch.Size([1, 16, 2, 2])
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.utils import _pair

from composer_bridge.algorithms._surgery import Optimizers, SurgeryAlgorithm, replace_modules, warn_no_effect

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = ["BlurConv2d", "BlurMaxPool2d", "BlurPool", "BlurPool2d", "apply_blurpool", "blur_2d", "blurmax_pool2d"]


def _binomial_filter(channels: int) -> torch.Tensor:
    """The 3x3 filter [1 2 1]^T [1 2 1] / 16, one copy per channel: shape (channels, 1, 3, 3)."""
    row = torch.tensor([1.0, 2.0, 1.0])
    return (torch.outer(row, row) / 16.0).expand(channels, 1, 3, 3).contiguous()


def blur_2d(
    input: torch.Tensor,
    channels: int = -1,
    stride: int | tuple[int, int] = 1,
    filter: torch.Tensor | None = None,
) -> torch.Tensor:
    """Blur every channel of an NCHW tensor with a 3x3 binomial filter ("same" padding), then subsample.

    Composer's arguments in Composer's order.

    Args:
        input: NCHW tensor.
        channels: the number of channels of ``input`` if known (checked), or ``-1`` (read from ``input``).
        stride: subsampling after the blur.
        filter: a ``(kH, kW)`` filter applied to every channel, or a ``(C, 1, kH, kW)`` depthwise
            filter, with odd sides (default: the binomial filter).

    Examples:
        >>> import torch
        >>> blur_2d(torch.ones(1, 2, 4, 4), stride=2)[0, 0].tolist()
        [[0.5625, 0.75], [0.75, 1.0]]
    """
    if channels > 0 and channels != input.shape[1]:
        raise ValueError(f"blur_2d(channels={channels}): the input has {input.shape[1]} channels (or pass -1).")
    channels = input.shape[1]
    if filter is None:
        filter = _binomial_filter(channels)
    elif filter.ndim == 2:
        filter = filter.expand(channels, 1, *filter.shape)
    filter = filter.to(device=input.device, dtype=input.dtype)
    kh, kw = filter.shape[-2:]
    if kh % 2 == 0 or kw % 2 == 0:
        raise ValueError(f"blur_2d needs a filter with odd height and width, got {kh}x{kw}.")
    return F.conv2d(input, filter, stride=_pair(stride), padding=(kh // 2, kw // 2), groups=channels)


def blurmax_pool2d(
    input: torch.Tensor,
    kernel_size: int | tuple[int, int] | None = None,
    stride: int | tuple[int, int] = 2,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    ceil_mode: bool = False,
    filter: torch.Tensor | None = None,
) -> torch.Tensor:
    """Max-pool with anti-aliasing: max over ``kernel_size`` windows at stride 1, then a strided blur.

    Composer's arguments and defaults: ``kernel_size`` ``None`` means 2, and ``stride`` defaults
    to 2 whatever the kernel size (:class:`BlurMaxPool2d`, like ``nn.MaxPool2d``, defaults the
    stride to the kernel size instead).

    Examples:
        >>> import torch
        >>> blurmax_pool2d(torch.randn(1, 3, 8, 8), kernel_size=3).shape
        torch.Size([1, 3, 3, 3])
    """
    kernel_size = 2 if kernel_size is None else kernel_size
    maxes = F.max_pool2d(input, kernel_size, stride=1, padding=padding, dilation=dilation, ceil_mode=ceil_mode)
    return blur_2d(maxes, stride=stride, filter=filter)


class BlurConv2d(nn.Module):
    """A blur followed by ``conv`` (``blur_first=True``), or ``conv`` at stride 1 followed by a strided blur.

    Built around an existing convolution, ``BlurConv2d(conv, blur_first=True)`` (the surgery's
    form: ``conv`` is kept, with its parameters, so optimizers stay valid), or from Composer's
    arguments, ``BlurConv2d(in_channels, out_channels, kernel_size, stride, padding, dilation,
    groups, bias, blur_first)``, which builds a fresh convolution. :meth:`from_conv2d` copies an
    existing convolution (Composer's conversion; the original is left untouched).

    Examples:
        >>> import torch
        >>> conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        >>> blurred = BlurConv2d.from_conv2d(conv)
        >>> blurred(torch.randn(1, 3, 8, 8)).shape, torch.equal(blurred.conv.weight, conv.weight)
        (torch.Size([1, 8, 4, 4]), True)
        >>> BlurConv2d(3, 8, 3, stride=2, padding=1).conv.stride
        (2, 2)
    """

    def __init__(
        self,
        conv: nn.Conv2d | int,
        out_channels: int | None = None,
        kernel_size: int | tuple[int, int] | None = None,
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        blur_first: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(out_channels, bool):  # BlurConv2d(conv, False): the surgery's positional blur_first
            blur_first, out_channels = out_channels, None
        if not isinstance(conv, nn.Conv2d):
            conv = self._new_conv(conv, out_channels=out_channels, kernel_size=kernel_size, stride=stride,
                                  padding=padding, dilation=dilation, groups=groups, bias=bias, blur_first=blur_first)
        self.blur_first = blur_first
        self.stride = _pair(conv.stride)
        if not blur_first:
            conv.stride = (1, 1)
        self.conv = conv
        channels = conv.in_channels if blur_first else conv.out_channels
        self.register_buffer("blur_filter", _binomial_filter(channels), persistent=False)

    @staticmethod
    def _new_conv(
        in_channels: object, *, out_channels: int | None, kernel_size: int | tuple[int, int] | None,
        stride: int | tuple[int, int] | None, padding: int | tuple[int, int], dilation: int | tuple[int, int],
        groups: int, bias: bool, blur_first: bool,
    ) -> nn.Conv2d:
        if isinstance(in_channels, bool) or not isinstance(in_channels, int) or out_channels is None or kernel_size is None:
            raise TypeError(
                f"BlurConv2d takes an nn.Conv2d to wrap, or in_channels, out_channels and kernel_size (Composer's "
                f"arguments); got {type(in_channels).__name__}, out_channels={out_channels!r}, "
                f"kernel_size={kernel_size!r}."
            )
        if stride is None:
            if blur_first:
                raise ValueError("BlurConv2d(stride=None, blur_first=True): give the convolution's stride.")
            stride = kernel_size  # Composer: the blur then strides by the kernel size
        return nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation,
                         groups=groups, bias=bias)

    @classmethod
    def from_conv2d(cls, module: nn.Conv2d, module_index: int = -1, blur_first: bool = True) -> BlurConv2d:
        """A blurred copy of ``module`` (same weights; ``module`` itself is not changed).

        ``module_index`` is accepted for Composer's signature and unused.
        """
        if not isinstance(module, nn.Conv2d):
            raise TypeError(f"BlurConv2d.from_conv2d needs an nn.Conv2d, got {type(module).__name__}.")
        return cls(copy.deepcopy(module), blur_first=blur_first)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blur_first:
            return self.conv(blur_2d(x, filter=self.blur_filter))
        return blur_2d(self.conv(x), stride=self.stride, filter=self.blur_filter)


class BlurMaxPool2d(nn.Module):
    """Drop-in anti-aliased :class:`torch.nn.MaxPool2d` (no ``return_indices``)."""

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding = padding
        self.dilation = dilation
        self.ceil_mode = ceil_mode

    @classmethod
    def from_maxpool2d(cls, pool: nn.MaxPool2d, module_index: int = -1) -> BlurMaxPool2d:
        """The blurred version of ``pool`` (``module_index`` is accepted for Composer's signature and unused)."""
        return cls(pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return blurmax_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)


class BlurPool2d(nn.Module):
    """:func:`blur_2d` as a module: blur every channel, then subsample by ``stride`` (Composer's layer).

    Args:
        channels: the input's channels if known (checked at each call), or ``0`` (any).
        stride: subsampling after the blur.
        padding: kept for Composer's signature; the blur always pads to keep the size before subsampling.

    Examples:
        >>> import torch
        >>> BlurPool2d(channels=3)(torch.randn(1, 3, 8, 8)).shape
        torch.Size([1, 3, 4, 4])
    """

    def __init__(self, channels: int = 0, stride: int | tuple[int, int] = 2, padding: int | tuple[int, int] = 1) -> None:
        super().__init__()
        self.channels = channels
        self.stride = stride
        self.padding = padding

    def extra_repr(self) -> str:
        return f"channels={self.channels}, stride={self.stride}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return blur_2d(x, channels=self.channels if self.channels > 0 else -1, stride=self.stride)


def _check(replace_convs: bool, replace_maxpools: bool, blur_first: bool, min_channels: int) -> None:
    for name, value in (("replace_convs", replace_convs), ("replace_maxpools", replace_maxpools),
                        ("blur_first", blur_first)):
        if not isinstance(value, bool):
            raise TypeError(f"BlurPool({name}={value!r}): must be True or False.")
    if not replace_convs and not replace_maxpools:
        raise ValueError(
            "BlurPool(replace_convs=False, replace_maxpools=False) would change nothing; set at least one to True."
        )
    if isinstance(min_channels, bool) or not isinstance(min_channels, int) or min_channels < 0:
        raise ValueError(f"BlurPool(min_channels={min_channels!r}): must be an int >= 0 (default 16).")


def apply_blurpool(
    model: nn.Module,
    replace_convs: bool = True,
    replace_maxpools: bool = True,
    blur_first: bool = True,
    min_channels: int = 16,
    optimizers: Optimizers = None,
) -> int:
    """Add anti-aliasing to strided convolutions and max-pools of ``model`` in place.

    Args:
        model: the model to change.
        replace_convs: wrap ``nn.Conv2d`` with stride > 1 in :class:`BlurConv2d`.
        replace_maxpools: replace ``nn.MaxPool2d`` with :class:`BlurMaxPool2d`.
        blur_first: blur before the convolution (cheap); ``False`` runs the convolution at stride 1
            and blurs after (closer to the paper, up to ``stride**2`` times the convolution's cost).
        min_channels: leave convolutions with fewer input channels alone (typically the stem).
        optimizers: optimizers already built over ``model`` (the kept weights need no change;
            accepted for symmetry with the other surgeries).

    Returns:
        The number of modules replaced (a warning is raised when it is zero).
    """
    _check(replace_convs, replace_maxpools, blur_first, min_channels)
    policies = {}
    if replace_maxpools:
        policies[nn.MaxPool2d] = lambda pool, index: BlurMaxPool2d.from_maxpool2d(pool)
    if replace_convs:
        def maybe_blur(conv: nn.Module, index: int) -> nn.Module | None:
            assert isinstance(conv, nn.Conv2d)
            if max(_pair(conv.stride)) > 1 and conv.in_channels >= min_channels:
                return BlurConv2d(conv, blur_first=blur_first)
            return None

        policies[nn.Conv2d] = maybe_blur
    replaced = len(replace_modules(model, policies, optimizers=optimizers, skip=(BlurConv2d, BlurMaxPool2d)))
    if replaced == 0:
        warn_no_effect("BlurPool", f"strided Conv2d with >= {min_channels} input channels nor MaxPool2d")
    return replaced


class BlurPool(SurgeryAlgorithm):
    """Anti-aliased downsampling (`Zhang, 2019 <https://arxiv.org/abs/1904.11486>`_), applied at ``Event.INIT``.

    Takes the arguments of :func:`apply_blurpool` (Composer's defaults).

    Examples:
        >>> BlurPool(min_channels=8)
        BlurPool(replace_convs=True, replace_maxpools=True, blur_first=True, min_channels=8)
    """

    def __init__(
        self, replace_convs: bool = True, replace_maxpools: bool = True, blur_first: bool = True, min_channels: int = 16
    ) -> None:
        _check(replace_convs, replace_maxpools, blur_first, min_channels)
        self.replace_convs = replace_convs
        self.replace_maxpools = replace_maxpools
        self.blur_first = blur_first
        self.min_channels = min_channels

    def surgery(self, state: State) -> int:
        return apply_blurpool(
            state.model, self.replace_convs, self.replace_maxpools, self.blur_first, self.min_channels,
            optimizers=state.optimizers,
        )

    def surgery_hparams(self, state: State, replaced: int) -> dict[str, int]:
        """Composer's keys: how many blur max-pools and blur convolutions the model now has."""
        modules = list(state.model.modules())
        return {
            "blurpool/num_blurpool_layers": sum(isinstance(m, BlurMaxPool2d) for m in modules),
            "blurpool/num_blurconv_layers": sum(isinstance(m, BlurConv2d) for m in modules),
        }
