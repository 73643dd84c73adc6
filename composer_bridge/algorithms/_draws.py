"""Random draws from a run's generator, shared by the data-augmenting algorithms.

MixUp and CutMix draw a mixing coefficient (:func:`sample_beta`) and a pairing
(:func:`random_permutation`); CutMix, CutOut and ProgressiveResizing draw positions
(:func:`random_int`). Scalars come from a CPU generator as plain Python numbers, with no device
round trip; permutations are drawn where the generator lives and moved to the batch's device.

Example:
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

__all__ = ["random_int", "random_permutation", "sample_beta"]


def _uniform(generator: torch.Generator | None) -> float:
    """A draw from U(0, 1] (never 0, so its logarithm is finite)."""
    device = generator.device if generator is not None else "cpu"
    return 1.0 - float(torch.rand((), generator=generator, device=device, dtype=torch.float64))


def _normal(generator: torch.Generator | None) -> float:
    device = generator.device if generator is not None else "cpu"
    return float(torch.randn((), generator=generator, device=device, dtype=torch.float64))


def _log_gamma(shape: float, generator: torch.Generator | None) -> float:
    """The logarithm of a Gamma(shape, 1) draw (Marsaglia and Tsang's method; boosted for shape < 1)."""
    boost = 0.0
    if shape < 1.0:
        # Gamma(k) = Gamma(k + 1) * U ** (1 / k); kept in log space so tiny shapes do not underflow.
        boost = math.log(_uniform(generator)) / shape
        shape += 1.0
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        x = _normal(generator)
        v = (1.0 + c * x) ** 3
        if v <= 0.0:
            continue
        if math.log(_uniform(generator)) < 0.5 * x * x + d - d * v + d * math.log(v):
            return math.log(d * v) + boost


def sample_beta(alpha: float, generator: torch.Generator | None = None) -> float:
    """A draw from Beta(alpha, alpha) using only ``generator`` (``alpha == 0`` gives 0, as in Composer)."""
    if alpha == 0:
        return 0.0
    difference = _log_gamma(alpha, generator) - _log_gamma(alpha, generator)  # log(X / Y)
    # X / (X + Y) = sigmoid(log X - log Y), written to avoid overflow either side.
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
