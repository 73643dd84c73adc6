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
