"""A simulated executor for the search's tests: fits from a model of known speed-ups, no training."""

from __future__ import annotations

import math
import random

from composer_bridge.search.executor import RAISED, FitOutcome

LENGTHS = (10, 20, 40, 80)


class SimExecutor:
    """Fits from a model: quality ``plateau x (1 - exp(-progress / 15))``, progress = steps x r x noise, the
    plateau near 0.9 (each configuration and seed draws its speed factor and its plateau once), so that the
    baseline is near its plateau at the longest run length, as a workload's reference budget is set.

    ``scale``: the proxy's fits carry ``make_module == "proxy"`` and may have other true speed-ups.
    ``raises``: labels whose fits raise (recorded as the search's ``execute`` records them).
    """

    concurrent, speculate = False, False

    def __init__(self, truth: dict[str, float], noise_sd: float, rng: random.Random, raises: tuple[str, ...] = (),
                 proxy_truth: dict[str, float] | None = None) -> None:
        self.truth, self.noise_sd, self.rng, self.raises = truth, noise_sd, rng, raises
        self.proxy_truth = proxy_truth or truth
        self.synergy: dict[frozenset[str], float] = {}  # labels that speed up more together than the product
        self.noise: dict[tuple, float] = {}
        self.queue: list = []
        self.tickets = 0

    def start(self, sample) -> None:
        pass

    def submit(self, task) -> int:
        self.tickets += 1
        self.queue.append((self.tickets, task))
        return self.tickets

    def pending(self) -> int:
        return len(self.queue)

    def close(self) -> None:
        self.queue.clear()

    def next_done(self):
        ticket, task = self.queue.pop(0)
        labels = tuple(c.label for c in task.candidates)
        if any(label in self.raises for label in labels):
            return ticket, FitOutcome(math.nan, 0.0, 0.0, 0.0, 0.0, error=f"{RAISED}RuntimeError: shapes do not match")
        truth = self.proxy_truth if task.make_module == "proxy" else self.truth
        r = math.prod(truth.get(label, 1.0) for label in labels)
        r *= math.prod(factor for pair, factor in self.synergy.items() if pair <= set(labels))
        key = (labels, task.seed, task.make_module)
        if key not in self.noise:  # per configuration and seed: the whole curve faster or slower, its plateau a bit
            self.noise[key] = (math.exp(self.rng.gauss(0.0, self.noise_sd)), self.rng.gauss(0.0, 0.002))
        speed, plateau = self.noise[key]
        progress = task.steps * r * speed
        quality = (0.9 + plateau) * (1 - math.exp(-progress / 15))
        return ticket, FitOutcome(quality, float(task.steps), float(task.steps), float(task.steps), float(task.steps))
