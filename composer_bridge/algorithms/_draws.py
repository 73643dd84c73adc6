"""Random draws from a run's generator, shared by the data-augmenting algorithms.

MixUp and CutMix draw a mixing coefficient (:func:`sample_beta`, from the library's one gamma
sampler, :func:`log_gamma`, which AugMix's mixing weights use too) and a pairing
(:func:`random_permutation`); CutMix, CutOut and ProgressiveResizing draw positions
(:func:`random_int`). Scalars come from a CPU generator as plain Python numbers, with no device
round trip; permutations are drawn where the generator lives and moved to the batch's device.

Examples:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> 0 <= random_int(0, 10, g) < 10, 0.0 <= sample_beta(0.5, g) <= 1.0
    (True, True)
    >>> sorted(random_permutation(4, torch.device("cpu"), g).tolist())
    [0, 1, 2, 3]
"""

from __future__ import annotations

import math

import torch

__all__ = ["log_gamma", "random_int", "random_permutation", "sample_beta"]


_CANDIDATES = 8  # proposals per draw; all rejected has probability < 0.05 ** 8


def log_gamma(shape: float, size: tuple[int, ...], generator: torch.Generator | None,
              device: torch.device | str = "cpu") -> torch.Tensor:
    """Logarithms of Gamma(shape, 1) draws (Marsaglia and Tsang), a fixed number of proposals per draw.

    The one gamma sampler of the library: :func:`sample_beta` (MixUp, CutMix) and AugMix's
    Dirichlet and Beta weights read it. Taking the first accepted of a fixed number of proposals
    keeps the sampler on the generator's device with no data-dependent loop, and every call takes
    the same number of draws from ``generator``; shapes below 1 are boosted
    (``Gamma(k) = Gamma(k + 1) * U ** (1 / k)``), in log space so small shapes do not underflow.
    The draws are made where ``generator`` lives (``device`` without one), in float64.

    Examples:
        >>> g = torch.Generator().manual_seed(0)
        >>> draws = log_gamma(2.0, (20000,), g).exp()
        >>> round(float(draws.mean()), 1), round(float(draws.var()), 1)  # Gamma(2, 1): mean 2, variance 2
        (2.0, 2.0)
    """
    where = generator.device if generator is not None else device
    boost = torch.zeros(size, device=where, dtype=torch.float64)
    if shape < 1:
        boost = torch.log1p(-torch.rand(size, generator=generator, device=where, dtype=torch.float64)) / shape
        shape += 1.0
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    x = torch.randn(*size, _CANDIDATES, generator=generator, device=where, dtype=torch.float64)
    u = torch.rand(*size, _CANDIDATES, generator=generator, device=where, dtype=torch.float64)
    v = (1 + c * x) ** 3
    log_v = torch.log(v.clamp(min=1e-300))
    accepted = (v > 0) & (torch.log1p(-u) < 0.5 * x * x + d - d * v + d * log_v)
    first = accepted.to(torch.int8).argmax(dim=-1, keepdim=True)
    chosen = torch.where(accepted.any(dim=-1), log_v.gather(-1, first).squeeze(-1), torch.zeros_like(boost))
    return math.log(d) + chosen + boost


def sample_beta(alpha: float, generator: torch.Generator | None = None) -> float:
    """A draw from Beta(alpha, alpha) using only ``generator`` (``alpha == 0`` gives 0, as in Composer)."""
    if alpha == 0:
        return 0.0
    log_x, log_y = log_gamma(alpha, (2,), generator).tolist()
    # X / (X + Y) = sigmoid(log X - log Y), written to avoid overflow either side.
    difference = log_x - log_y
    if difference >= 0:
        return 1.0 / (1.0 + math.exp(-difference))
    ratio = math.exp(difference)
    return ratio / (1.0 + ratio)


def random_permutation(n: int, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """A permutation of ``range(n)`` on ``device``, drawn from ``generator`` (moved if it lives elsewhere)."""
    if generator is None:
        return torch.randperm(n, device=device)
    return torch.randperm(n, generator=generator, device=generator.device).to(device)


def random_int(low: int, high: int, generator: torch.Generator | None) -> int:
    """A uniform int in ``[low, high)`` drawn from ``generator`` (a CPU generator involves no device)."""
    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(low, high, (), generator=generator, device=device))
