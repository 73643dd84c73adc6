"""Muon's variants from the speedrun since Muon: Polar Express coefficients, NorMuon, cautious weight decay.

:class:`MuonVariants` is ``torch.optim.Muon`` (its arguments, state and step, operation for operation)
with three options, each off by default:

* **Polar Express** (Amsel, Persson, Musco and Gower 2025, arXiv:2505.16932): ``ns_coefficients`` may
  be a sequence of ``(a, b, c)`` triples, one per Newton-Schulz iteration, instead of one triple used
  ``ns_steps`` times; ``"polar_express"`` names the published five (``num_iters=5``, safety factor
  ``2e-2``, cushion 2), with the input's norm inflated by 1.01 as the authors do.
* **NorMuon** (Li et al. 2025, arXiv:2510.05491): after the orthogonalisation ``O``, each output
  neuron's (row's) mean square is tracked, ``v <- beta2 v + (1 - beta2) mean_j O_ij^2``, and ``O`` is
  divided row by row by ``sqrt(v) + eps`` and rescaled to ``O``'s own Frobenius norm (so ``lr`` and
  ``adjust_lr_fn`` keep their meaning; the paper sets the step's RMS instead).
* **Cautious weight decay** (Chen et al. 2025, arXiv:2510.12402): the decay applies only where the
  update and the weight have the same sign (``update * weight >= 0``), shrinking the weight where
  the update would shrink it too.

Examples:
    >>> w = torch.nn.Parameter(torch.randn(4, 3))
    >>> optimizer = MuonVariants([w], lr=0.02, ns_coefficients="polar_express", normuon=True)
    >>> len(optimizer.param_groups[0]["ns_coefficients"])  # one triple per iteration
    5
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["POLAR_EXPRESS", "MuonVariants", "orthogonalise", "resolve_coefficients"]

#: Polar Express's coefficients for five iterations (num_iters=5, safety factor 2e-2, cushion 2), as published.
POLAR_EXPRESS: tuple[tuple[float, float, float], ...] = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
#: The factor Polar Express inflates the input's norm by before its first iteration.
POLAR_EXPRESS_NORM = 1.01


def resolve_coefficients(ns_coefficients: Any, ns_steps: int) -> tuple[list[tuple[float, float, float]], float]:
    """``(one (a, b, c) per iteration, norm factor)`` from a triple, a sequence of triples or ``"polar_express"``.

    Examples:
        >>> resolve_coefficients((3.4445, -4.775, 2.0315), 2)
        ([(3.4445, -4.775, 2.0315), (3.4445, -4.775, 2.0315)], 1.0)
        >>> len(resolve_coefficients("polar_express", 5)[0]), resolve_coefficients("polar_express", 5)[1]
        (5, 1.01)
    """
    if ns_coefficients == "polar_express":
        return [tuple(c) for c in POLAR_EXPRESS], POLAR_EXPRESS_NORM  # type: ignore[misc]
    if isinstance(ns_coefficients, str):
        raise ValueError(f"Muon(ns_coefficients={ns_coefficients!r}): expected an (a, b, c) triple, a sequence of "
                         "triples (one per Newton-Schulz iteration) or 'polar_express'.")
    values = list(ns_coefficients)
    if len(values) == 3 and all(isinstance(v, (int, float)) for v in values):
        return [tuple(float(v) for v in values)] * ns_steps, 1.0  # type: ignore[list-item]
    triples = [tuple(float(v) for v in t) for t in values]
    if not triples or any(len(t) != 3 for t in triples):
        raise ValueError(f"Muon(ns_coefficients={ns_coefficients!r}): expected an (a, b, c) triple, a sequence of "
                         "triples (one per Newton-Schulz iteration) or 'polar_express'.")
    return triples, 1.0  # type: ignore[return-value]


def orthogonalise(update: torch.Tensor, coefficients: Sequence[tuple[float, float, float]], eps: float,
                  norm_factor: float = 1.0, use_addmm: bool = True) -> torch.Tensor:
    """The Newton-Schulz iterations of ``torch.optim.Muon`` (bfloat16, the wide orientation), one triple per iteration.

    ``use_addmm``: group the products as ``torch.addmm`` (torch 2.9-2.13 always do; later releases have
    a ``use_addmm`` option), else as ``a X + (b A + c A^2) X``; the same maths, rounded differently.
    """
    x = update.bfloat16()
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() * norm_factor).clamp(min=eps) if norm_factor != 1.0 else x.div_(x.norm().clamp(min=eps))
    for a, b, c in coefficients:
        gram = x @ x.T
        if use_addmm:
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        else:
            x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def _adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / cols))
    return lr * 0.2 * math.sqrt(max(rows, cols))  # "match_rms_adamw"


#: torch.optim.Muon where torch has it (2.9 and later); before, Muon itself refuses at set-up, naming the version.
_MUON_BASE: type = getattr(torch.optim, "Muon", torch.optim.Optimizer)


class MuonVariants(_MUON_BASE):  # type: ignore[misc,valid-type]
    """``torch.optim.Muon`` with Polar Express coefficients, NorMuon and cautious weight decay as options.

    With none of them it computes what ``torch.optim.Muon`` computes (tested bit for bit).

    Args:
        ns_coefficients: one ``(a, b, c)`` triple (``ns_steps`` iterations), a sequence of triples (one
            iteration each) or ``"polar_express"``.
        normuon: normalise each output neuron's update by its running RMS (NorMuon).
        normuon_beta2: the running mean square's decay. Default ``0.95``.
        normuon_eps: added to the RMS. Default ``1e-8``.
        cautious_weight_decay: decay only where the update and the weight agree in sign.
        **kwargs: the other arguments of ``torch.optim.Muon``.
    """

    def __init__(self, params: Any, *, ns_coefficients: Any = (3.4445, -4.775, 2.0315), ns_steps: int = 5,
                 normuon: bool = False, normuon_beta2: float = 0.95, normuon_eps: float = 1e-8,
                 cautious_weight_decay: bool = False, **kwargs: Any) -> None:
        coefficients, norm_factor = resolve_coefficients(ns_coefficients, ns_steps)
        if not 0.0 <= normuon_beta2 < 1.0:
            raise ValueError(f"Muon(normuon_beta2={normuon_beta2!r}): must be in [0, 1), e.g. 0.95.")
        super().__init__(params, ns_steps=len(coefficients), **kwargs)
        for group in self.param_groups:
            group.update(ns_coefficients=coefficients, ns_norm_factor=norm_factor, normuon=normuon,
                         normuon_beta2=normuon_beta2, normuon_eps=normuon_eps,
                         cautious_weight_decay=cautious_weight_decay)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, decay, momentum = float(group["lr"]), group["weight_decay"], group["momentum"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad, state = param.grad, self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
                buffer = state["momentum_buffer"]
                buffer.lerp_(grad, 1 - momentum)
                update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                update = orthogonalise(update, group["ns_coefficients"], group["eps"], group["ns_norm_factor"],
                                       group.get("use_addmm", True))
                if group["normuon"]:
                    update = self._normalise_neurons(update, state, group)
                adjusted = _adjusted_lr(lr, group["adjust_lr_fn"], param.shape)
                if group["cautious_weight_decay"]:
                    agree = (update * param >= 0).to(param.dtype)
                    param.sub_(param * agree, alpha=lr * decay)
                else:
                    param.mul_(1 - lr * decay)
                param.add_(update, alpha=-adjusted)
        return loss

    @staticmethod
    def _normalise_neurons(update: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> torch.Tensor:
        o = update.float()
        square = o.square().mean(dim=1)
        if "neuron_mean_square" not in state:
            state["neuron_mean_square"] = torch.zeros_like(square)
        v = state["neuron_mean_square"]
        v.lerp_(square, 1 - group["normuon_beta2"])
        normalised = o / (v.sqrt() + group["normuon_eps"]).unsqueeze(1)
        scale = o.norm() / normalised.norm().clamp(min=1e-12)
        return (normalised * scale).to(update.dtype)
