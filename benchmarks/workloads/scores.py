"""Time to a fixed target, speed-ups, AlgoPerf's performance profiles and score.

* **Time to target**: the training time (CPU seconds, and optimizer steps) at the first validation
  whose metric reaches the workload's target; ``None`` when no validation reaches it, or when it is
  reached only after the time cap (4/3 of the baseline's time for the reference budget).
* **Per workload**, a configuration's time is the median over the held-out seeds (a failure counts as
  infinite, so a configuration that fails on most seeds fails the workload).
* **Performance profile** (AlgoPerf): for each configuration, ``rho(tau)`` = the fraction of workloads
  where its time is within ``tau`` times the fastest configuration's on that workload.
* **Score**: the area under ``rho`` from ``tau = 1`` to ``tau_max = 4``, divided by 3, so 1 means the
  fastest on every workload and 0 means never within 4x of the fastest (or never reaching the target).

Examples:
    >>> points = [{"step": 10, "cpu_s": 1.0, "quality": 0.5}, {"step": 20, "cpu_s": 2.0, "quality": 0.8}]
    >>> time_to_target(points, 0.7, "max")
    (20, 2.0)
    >>> score({"a": 1.0, "b": 2.5})  # fastest on one workload, 2.5x slower than the fastest on the other
    0.75
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from composer_bridge.search.curves import median_time  # the search's: a failure counts as infinitely slow

__all__ = ["TAU_MAX", "above", "bootstrap_scores", "median_time", "probability_higher", "profile", "ratios", "score",
           "speedups", "time_to_target"]

TAU_MAX = 4.0


def time_to_target(points: Sequence[Mapping[str, float]], target: float, mode: str,
                   cap_seconds: float | None = None) -> tuple[int | None, float | None]:
    """``(steps, cpu seconds)`` at the first point reaching ``target`` within the cap, or ``(None, None)``."""
    for point in points:
        reached = point["quality"] >= target if mode == "max" else point["quality"] <= target
        if reached and not math.isnan(point["quality"]):
            if cap_seconds is not None and point["cpu_s"] > cap_seconds:
                return None, None
            return int(point["step"]), float(point["cpu_s"])
    return None, None


def ratios(times: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """``{config: {workload: time / the fastest config's time on that workload}}`` (infinity for failures).

    Each configuration has ratios for the workloads it has a time on; a workload no configuration
    reaches the target on is left out of every configuration's ratios.
    """
    workloads = sorted({w for per in times.values() for w in per})
    best = {w: min(per.get(w, math.inf) for per in times.values()) for w in workloads}
    return {c: {w: t / best[w] for w, t in per.items() if math.isfinite(best[w])} for c, per in times.items()}


def profile(config_ratios: Mapping[str, float], taus: Sequence[float]) -> list[float]:
    """``rho(tau)`` for each ``tau``: the fraction of workloads whose ratio is at most ``tau``."""
    values = list(config_ratios.values())
    if not values:
        return [0.0 for _ in taus]
    return [sum(r <= tau for r in values) / len(values) for tau in taus]


def score(config_ratios: Mapping[str, float], tau_max: float = TAU_MAX) -> float:
    """The area under the profile from 1 to ``tau_max``, normalised to [0, 1] (exact: the profile is a step function)."""
    values = list(config_ratios.values())
    if not values:
        return 0.0
    area = sum(max(0.0, tau_max - max(1.0, r)) for r in values if math.isfinite(r))
    return round(area / (len(values) * (tau_max - 1.0)), 6)


def speedups(baseline: Mapping[Any, float | None], config: Mapping[Any, float | None]) -> dict[str, Any]:
    """Seed by seed, the baseline's time to target over the configuration's; mean and sd where both reached.

    Examples:
        >>> speedups({1: 10.0, 2: 12.0, 3: None}, {1: 5.0, 2: 12.0, 3: 4.0})["per_seed"]
        {'1': 2.0, '2': 1.0, '3': None}
    """
    per_seed = {str(s): (round(baseline[s] / config[s], 4) if baseline.get(s) and config.get(s) else None)
                for s in baseline}
    values = [v for v in per_seed.values() if v is not None]
    return {"per_seed": per_seed, "mean": round(statistics.mean(values), 4) if values else None,
            "sd": round(statistics.stdev(values), 4) if len(values) > 1 else None,
            "reached": sum(config.get(s) is not None for s in baseline), "seeds": len(baseline)}


def bootstrap_scores(seed_times: Mapping[str, Mapping[str, Sequence[float]]], replicates: int = 2000,
                     confidence: float = 0.9, rng_seed: int = 0,
                     ) -> tuple[dict[str, dict[str, float]], list[dict[str, float]]]:
    """Every configuration's score with an interval over the held-out seeds (a paired bootstrap).

    ``seed_times[config][workload]``: the time to target on each held-out seed, in the seeds' order (``inf``: a
    failure). Each replicate draws, per workload, the seeds with replacement, the *same* draw for every
    configuration (a seed hard for one is often hard for all: the draw keeps that luck shared), recomputes the
    medians, the ratios to the fastest and the scores. Returns ``{config: {"score", "low", "high"}}`` and the
    replicates' scores (:func:`probability_higher` compares two configurations on them).

    Examples:
        >>> times = {"a": {"w": [1.0, 1.1, 0.9]}, "b": {"w": [2.0, 2.2, 1.8]}}
        >>> out, draws = bootstrap_scores(times, replicates=200)
        >>> out["a"]["low"] == out["a"]["high"] == 1.0, out["b"]["score"] < 1
        (True, True)
    """
    import random

    rng = random.Random(rng_seed)
    workloads = sorted({w for per in seed_times.values() for w in per})
    n_seeds = {w: max(len(per[w]) for per in seed_times.values() if w in per) for w in workloads}
    draws: list[dict[str, float]] = []
    for _ in range(replicates):
        picks = {w: [rng.randrange(n_seeds[w]) for _ in range(n_seeds[w])] for w in workloads}
        # a configuration measured on fewer seeds than others draws as many, from the same indices (mod its count)
        medians = {c: {w: median_time([times[picks[w][j] % len(times)] for j in range(len(times))])
                       for w, times in per.items()} for c, per in seed_times.items()}
        rat = ratios(medians)
        draws.append({c: score(r) for c, r in rat.items()})
    point = {c: score(r) for c, r in ratios({c: {w: median_time(list(t)) for w, t in per.items()}
                                             for c, per in seed_times.items()}).items()}
    tail = (1 - confidence) / 2
    out = {}
    for c in point:
        values = sorted(d[c] for d in draws if c in d)
        lo, hi = values[int(tail * (len(values) - 1))], values[int((1 - tail) * (len(values) - 1))]
        out[c] = {"score": point[c], "low": round(lo, 6), "high": round(hi, 6)}
    return out, draws


def probability_higher(a: str, b: str, draws: Sequence[Mapping[str, float]]) -> float:
    """The share of bootstrap replicates in which ``a`` scores above ``b`` (ties count half)."""
    both = [d for d in draws if a in d and b in d]
    if not both:
        return math.nan
    return sum(1.0 if d[a] > d[b] else 0.5 if d[a] == d[b] else 0.0 for d in both) / len(both)


def above(a: str, names: Sequence[str] | Mapping[str, Any], draws: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """``{name: share of draws in which a scores above it}`` for every other configuration in ``names``, rounded as
    ``results.json`` gives it (``search_above``)."""
    return {n: round(probability_higher(a, n, draws), 4) for n in names if n != a}
