"""How much the search's pick should give on seeds it never saw, corrected for having been chosen.

The pick is the configuration that scored best on the search seeds among everything the search tried.
With a few seeds, part of that score is luck: among twenty configurations of equal worth, the luckiest
one scores well above its true speed-up (the winner's curse). The correction here is the standard
empirical-Bayes one, computed from the search's own scores, with no extra fit:

* **Noise** ``sigma``: how much one configuration's speed-up varies from seed to seed, pooled over every
  configuration the search scored on two or more seeds (the baseline's own seed-to-seed spread, against
  the mean of its curves, is one of them).
* **Spread** ``tau``: how much the configurations truly differ: the variance of their mean scores, less the
  part the noise explains (``sigma^2 / n`` for a mean over ``n`` seeds), at least zero.
* **Shrunk mean**: the pick's mean over its ``n`` search seeds, pulled towards the mean of every
  configuration by the factor ``B = tau^2 / (tau^2 + sigma^2 / n)``: little when the configurations
  differ far more than the noise, almost all the way when they do not.
* **Interval**: the shrunk mean plus or minus ``z`` standard deviations of what a mean over ``new_seeds``
  unseen seeds would show (the uncertainty left about the pick's true speed-up, ``B sigma^2 / n``, plus
  the noise of the new seeds' mean, ``sigma^2 / new_seeds``), at the given confidence; ``z`` from Student's t
  with at most one degree of freedom fewer than the seeds (every configuration shares them: :func:`seed_df`).

Speed-ups are counted as the confirmation counts them (the baseline's time to the target over the
configuration's, a seed that never reaches the target as 0x); a curve the search stopped early because it
could not win counts at the most it could have scored (its bound), so the losers are not made worse than
they were.

Examples:
    >>> field = [[1.0, 1.1], [0.9, 1.0], [1.05, 0.95], [1.2, 1.3], [0.8, 0.9]]
    >>> e = estimate([1.2, 1.3], field, new_seeds=3, confidence=0.9)
    >>> e.raw, e.mean < e.raw, e.low < e.mean < e.high
    (1.25, True, True)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Estimate", "estimate", "held_out", "needed", "probability_better", "seed_df", "t_cdf", "t_quantile"]


@dataclass(frozen=True)
class Estimate:
    """The pick's expected speed-up on unseen seeds (``mean``), its interval, and what it rests on.

    Attributes:
        mean: the shrunk mean speed-up (what a mean over ``new_seeds`` unseen seeds should be near).
        low, high: the interval at ``confidence`` for that mean.
        raw: the pick's mean over the search seeds (biased upwards: it was chosen on them).
        confidence: the interval's coverage, 0.9 by default.
        noise_sd: the seed-to-seed spread of one configuration (``sigma``).
        spread_sd: how much the configurations truly differ (``tau``).
        shrink: ``B``, the fraction of the pick's lead over the field that is kept.
        configurations: how many configurations the correction was computed from.
        new_seeds: how many unseen seeds the interval is for.
    """

    mean: float
    low: float
    high: float
    raw: float
    confidence: float
    noise_sd: float
    spread_sd: float
    shrink: float
    configurations: int
    new_seeds: int

    def text(self) -> str:
        """``"1.31x (90 % interval 1.05x to 1.57x; 1.45x on the search seeds)"``."""
        return (f"{self.mean:.2f}x ({100 * self.confidence:g} % interval {self.low:.2f}x to {self.high:.2f}x; "
                f"{self.raw:.2f}x on the search seeds)")

    def as_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "raw": self.raw, "confidence": self.confidence,
                "noise_sd": self.noise_sd, "spread_sd": self.spread_sd, "shrink": self.shrink,
                "configurations": self.configurations, "new_seeds": self.new_seeds}


def _pooled(field: Sequence[Sequence[float]]) -> tuple[float, int]:
    """The pooled within-configuration variance over configurations with two or more seeds, and its degrees
    of freedom (``(0.0, 0)`` if none)."""
    num, df = 0.0, 0
    for scores in field:
        if len(scores) > 1:
            num += statistics.variance(scores) * (len(scores) - 1)
            df += len(scores) - 1
    return (num / df if df else 0.0), df


def t_cdf(x: float, df: int) -> float:
    """Student's t distribution function with ``df`` degrees of freedom (the normal one for ``df`` >= 200).

    A noise measured on a few seeds is itself uncertain; the t distribution widens the tails accordingly.

    Examples:
        >>> round(t_cdf(1.0, 1), 4), round(t_cdf(2.0, 3), 4), round(t_cdf(0.0, 5), 4)
        (0.75, 0.9303, 0.5)
    """
    if df >= 200:
        return statistics.NormalDist().cdf(x)
    if df == 1:
        return 0.5 + math.atan(x) / math.pi
    # the incomplete-beta form: P(|T| > |x|) = I_{df / (df + x^2)}(df / 2, 1 / 2), by Simpson's rule on the density
    const = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    a, n = min(abs(x), 60.0), 400
    h = a / n
    total = sum((1 if i in (0, n) else 4 if i % 2 else 2) * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2)
                for i in range(n + 1))
    half = const * total * h / 3
    return 0.5 + half if x >= 0 else 0.5 - half


def t_quantile(p: float, df: int) -> float:
    """The inverse of :func:`t_cdf` (by bisection).

    Examples:
        >>> round(t_quantile(0.95, 2), 2), round(t_quantile(0.95, 10**6), 3)
        (2.92, 1.645)
    """
    if df >= 200:
        return statistics.NormalDist().inv_cdf(p)
    low, high = -1e3, 1e3
    for _ in range(80):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def seed_df(pooled_df: int, seeds: int | None) -> int:
    """The degrees of freedom of a noise pooled over configurations that share their seeds: the pooled ones, at
    most ``seeds - 1`` (``None``: not capped), at least 1.

    Examples:
        >>> seed_df(7, 3), seed_df(7, None), seed_df(0, 1)
        (2, 7, 1)
    """
    return max(1, pooled_df if seeds is None else min(pooled_df, seeds - 1))


def estimate(pick: Sequence[float], field: Sequence[Sequence[float]], new_seeds: int,
             confidence: float = 0.9, noise: Sequence[Sequence[float]] = ()) -> Estimate:
    """The corrected estimate for a pick scored ``pick`` (one speed-up per search seed) among ``field``.

    ``field``: the scores per seed of every configuration the search scored (the pick among them);
    ``noise``: more per-seed scores that inform only the noise (the baseline's own spread).

    Examples:
        >>> e = estimate([2.0, 2.2], [[2.0, 2.2], [1.0, 1.1], [0.9, 1.0]], new_seeds=3)
        >>> round(e.raw, 2), e.shrink > 0.9  # configurations far apart: little to correct
        (2.1, True)
    """
    n = len(pick)
    if n == 0:
        raise ValueError("estimate: the pick has no score.")
    raw = statistics.fmean(pick)
    groups = [list(s) for s in (*field, *noise) if s]
    sigma2, df = _pooled(groups)
    means = [(statistics.fmean(s), len(s)) for s in field if s]
    if len(means) > 1:
        spread = statistics.variance([m for m, _ in means])
        tau2 = max(0.0, spread - statistics.fmean(sigma2 / k for _, k in means))
        centre = statistics.fmean(m for m, _ in means)
    else:
        tau2, centre = math.inf, raw
    shrink = 1.0 if math.isinf(tau2) or sigma2 == 0 else tau2 / (tau2 + sigma2 / n)
    mean = centre + shrink * (raw - centre)
    sd = math.sqrt(shrink * sigma2 / n + sigma2 / max(1, new_seeds))
    z = t_quantile(0.5 + confidence / 2, seed_df(df, n))
    return Estimate(mean=mean, low=max(0.0, mean - z * sd), high=mean + z * sd, raw=raw, confidence=confidence,
                    noise_sd=math.sqrt(sigma2), spread_sd=0.0 if math.isinf(tau2) else math.sqrt(tau2),
                    shrink=shrink, configurations=len(means), new_seeds=new_seeds)


def held_out(fresh: Sequence[float], raw: float, noise: Sequence[Sequence[float]], new_seeds: int,
             confidence: float = 0.9, reference_seeds: int = 2, seeds: int | None = None) -> Estimate:
    """The estimate from seeds held out inside the search (the finalist seeds): no correction is needed, as they
    played no part in choosing the pick; the seed-to-seed noise comes from ``noise`` (per-seed scores of the pick
    and of the configurations measured beside it), the interval from Student's t with its degrees of freedom.

    The interval is for the mean over ``new_seeds`` unseen seeds, each speed-up measured against the baseline's
    time on those seeds: it holds the noise of the held-out mean, of the new seeds' mean, and of the two baseline
    reference times (on ``reference_seeds`` search seeds and on the new seeds), taken to vary relatively as much
    as a configuration's time does.

    ``seeds``: how many distinct seeds the noise was measured on. Every configuration shares its seeds (the same
    data order and initialisation), so a seed that is lucky for one is lucky for the others: pooling configurations
    adds precision to the noise but not independent seeds, and the interval's degrees of freedom are at most
    ``seeds - 1`` (:func:`seed_df`).

    Examples:
        >>> e = held_out([1.4], raw=1.8, noise=[[1.5, 1.7, 1.4], [0.9, 1.1]], new_seeds=3)
        >>> e.mean, e.raw, e.low < 1.4 < e.high
        (1.4, 1.8, True)
    """
    if not fresh:
        raise ValueError("held_out: no score on a held-out seed.")
    mean = statistics.fmean(fresh)
    groups = [list(s) for s in noise if s]
    sigma2, df = _pooled(groups)
    level = statistics.fmean(v for g in groups for v in g) if groups else mean
    relative2 = sigma2 / level ** 2 if level > 0 else 0.0
    k = max(1, new_seeds)
    sd = math.sqrt(sigma2 * (1 / len(fresh) + 1 / k) + mean ** 2 * relative2 * (1 / max(1, reference_seeds) + 1 / k))
    z = t_quantile(0.5 + confidence / 2, seed_df(df, seeds))
    return Estimate(mean=mean, low=max(0.0, mean - z * sd), high=mean + z * sd, raw=raw, confidence=confidence,
                    noise_sd=math.sqrt(sigma2), spread_sd=float("nan"), shrink=0.0,
                    configurations=len([s for s in noise if s]), new_seeds=new_seeds)


def probability_better(a: Sequence[float], b: Sequence[float], noise: Sequence[Sequence[float]] = (),
                       fresh_only: bool = False) -> float:
    """How sure one can be that ``a`` (one score per seed) truly beats ``b`` on the same seeds.

    The seed-to-seed noise is pooled from ``a``, ``b`` and ``noise`` (more per-seed scores of configurations
    of equal worth, such as the baseline's own spread); ``b`` equal to 1.0 on every seed is the baseline itself,
    exact. The difference of the two means over its standard error, read off Student's t with the pooled
    degrees of freedom (a noise measured on few seeds is uncertain itself). ``fresh_only``: ``a`` and ``b`` are
    scores on seeds of their own (a finalist seed) and the noise comes from ``noise`` alone.

    Examples:
        >>> round(probability_better([1.5, 1.6], [1.0, 1.0], noise=[[0.95, 1.05]]), 3)
        0.996
        >>> 0.5 < probability_better([1.1, 1.3], [1.0, 1.0], noise=[[0.8, 1.2]]) < 0.9
        True
    """
    exact = all(v == 1.0 for v in b)
    if fresh_only:  # a and b on a seed or two of their own; the noise measured elsewhere
        sigma2, df = _pooled([*map(list, noise)])
    else:
        sigma2, df = _pooled([list(a), *([] if exact else [list(b)]), *map(list, noise)])
    var = sigma2 / len(a) + (0.0 if exact else sigma2 / len(b))
    diff = statistics.fmean(a) - statistics.fmean(b)
    if var == 0:
        return 1.0 if diff > 0 else 0.0
    return t_cdf(diff / math.sqrt(var), max(df, 1))


def needed(confidence: float, contestants: int) -> float:
    """How sure the best of ``contestants`` must be for the family to hold ``confidence`` (Bonferroni).

    Among many configurations raced on a few seeds the luckiest looks best; asking the winner of ``k`` for
    ``1 - (1 - confidence) / k`` keeps the chance that any of them passes by luck near ``1 - confidence``.

    Examples:
        >>> needed(0.8, 1), round(needed(0.8, 10), 3)
        (0.8, 0.98)
    """
    return confidence if contestants <= 1 else 1 - (1 - confidence) / contestants
