"""How far float rounding may legitimately move a compared result: what the numerical tests derive their bounds from.

Two computations of the same function in the same float dtype may round differently: another CPU's vector width
reorders a sum (ATen's kernels and inductor's C++ code pick theirs by the CPU), inductor fuses and reorders, MKL and
oneDNN block by the CPU and by alignment. A sum of n terms computed in any order is off by at most n x eps x the sum
of the terms' magnitudes; a result whose chain of sums, end to end, adds up to ``reductions`` terms is therefore off
by at most about ``reductions x eps x`` the magnitudes it sums (to first order), and two such computations differ
by at most twice that.
"""

from __future__ import annotations

import torch

EPS32 = torch.finfo(torch.float32).eps  # 2**-23
EPS_BF16 = torch.finfo(torch.bfloat16).eps  # 2**-7: bf16 keeps 8 significant bits


def rounding_bound(reductions: int, scale: float | torch.Tensor, dtype: torch.dtype = torch.float32) -> float | torch.Tensor:
    """The most a chain of sums of ``reductions`` terms in all, of magnitudes up to ``scale``, rounds away."""
    return reductions * torch.finfo(dtype).eps * scale


def assert_within(got: torch.Tensor, want: torch.Tensor, bound: float | torch.Tensor, what: str = "") -> None:
    """Every element of ``got`` within ``bound`` of ``want`` (computed in float64); the message says by how much."""
    off = (got.double() - want.double()).abs()
    bound = torch.as_tensor(bound, dtype=torch.float64)
    assert (off <= bound).all(), f"{what}: off by {off.max():.3g}, {(off / bound).max():.3g} x the bound"


def assert_float32_runs_near_float64(runs: dict[str, dict[str, torch.Tensor]], exact: dict[str, torch.Tensor],
                                     start: dict[str, torch.Tensor], reductions: int, steps: int) -> None:
    """Each float32 run's weights within what rounding may move them of the same training in float64 (``exact``).

    Two float32 runs of the same function computed another way (another vector width, a fused or compiled graph,
    another formula of the same maths) round differently, so they are compared with a float64 run rather than with
    each other. A step's gradient is a chain of float32 sums of about ``reductions`` terms end to end, each off by
    at most its length x eps x the magnitudes summed; SGD moves a weight by the learning rate x its gradient, so a
    weight is off by at most ``reductions`` x eps x the run's largest move (from ``start``), plus one ulp of the
    weight a step.

    Example:
        >>> w = {"w": torch.ones(2, dtype=torch.float64)}
        >>> assert_float32_runs_near_float64({"f32": {"w": torch.ones(2)}}, w, {"w": torch.zeros(2)}, 10, 1)
    """
    largest_move = max((weight.double() - start[name].double()).abs().max().item() for name, weight in exact.items())
    for run, weights in runs.items():
        for name, reference in exact.items():
            bound = rounding_bound(reductions, largest_move) + rounding_bound(steps, reference.double().abs())
            assert_within(weights[name], reference, bound, f"{run} {name}")


def normalization_bound(x_max: torch.Tensor, xhat: torch.Tensor, sd: torch.Tensor, gamma: torch.Tensor,
                        beta: torch.Tensor, statistics_error: float, rounding: float) -> torch.Tensor:
    """Per element, the most ``y = gamma * xhat + beta``, ``xhat = (x - mean) / sd``, moves when computed another way.

    The float64 pieces: ``x_max`` (the largest ``|x|`` of each normalised group), ``xhat``, ``sd``, broadcast against
    each other. ``statistics_error``: how far, relative to ``x_max``, the inputs, the mean and the deviation may move:
    2 x the unit roundoff when ``x`` is rounded to a low precision (each value by its own rounding, the mean by the
    largest), or ``n x eps`` when a float32 mean over ``n`` values is summed in another order. That moves ``x - mean``
    by at most ``statistics_error x x_max`` and ``sd`` by as much, so ``xhat`` by at most that ``/ sd x (1 + |xhat|)``
    (to first order). ``rounding``: the relative rounding of ``gamma``, ``beta`` and ``y`` (the unit roundoff of the
    dtype they are held in).
    """
    y = gamma * xhat + beta
    moved = statistics_error * x_max / sd * (1 + xhat.abs()) * gamma.abs()
    return moved + rounding * ((gamma * xhat).abs() + beta.abs() + y.abs())
