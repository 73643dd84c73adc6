"""The configurations each workload is measured with, and why the others cannot apply.

* ``baseline``: the workload's own module and its AdamW schedule, no algorithm;
* every default candidate of the recipe search alone (:data:`composer_bridge.search.DEFAULT_CANDIDATES`:
  the published recipes' algorithms with their published arguments, and the newer methods), where it
  applies to the model and its batches (:func:`composer_bridge.search.candidates.applicability`);
* Muon's speedrun variants (:data:`MUON_VARIANTS`: Polar Express, NorMuon, cautious weight decay, at the
  default candidate's ``lr=0.02``) each alone on the language models (all three together are a default
  candidate, ``Muon+variants``);
* ScheduleFree in place of the AdamW and its schedule (:func:`schedule_free`), where the ``schedulefree``
  package is installed and it applies;
* BatchSizeWarmup with its defaults (a quarter of each batch at first, the whole batch after 10 % of the
  run), where it applies (:data:`BATCH_SIZE_WARMUP`);
* every published recipe (:mod:`composer_bridge.recipes`) that applies whole, named ``recipe:<name>``;
* ``search``: the recipe search's pick, added once the search has run (:mod:`run_workloads`).

Examples:
    >>> as_spec([Candidate("MixUp", {"alpha": 0.2})])
    (('MixUp', {'alpha': 0.2}),)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from composer_bridge.search import DEFAULT_CANDIDATES, Candidate
from composer_bridge.search.candidates import applicability
from composer_bridge.search.checks import Probe, published_starting_recipes

__all__ = ["BATCH_SIZE_WARMUP", "MUON_VARIANTS", "as_spec", "configurations", "schedule_free"]

#: Muon's variants each alone, measured on the language models (all three together are the default candidate
#: ``Muon+variants``, measured wherever Muon applies).
MUON_VARIANTS = {
    "Muon+PolarExpress": Candidate("Muon", {"lr": 0.02, "ns_coefficients": "polar_express"}),
    "Muon+NorMuon": Candidate("Muon", {"lr": 0.02, "normuon": True}),
    "Muon+CautiousWD": Candidate("Muon", {"lr": 0.02, "cautious_weight_decay": True}),
}

#: The batch-size schedule with its defaults, measured on every workload it applies to (not a default candidate).
BATCH_SIZE_WARMUP = Candidate("BatchSizeWarmup")


def schedule_free(total_steps: int) -> Candidate:
    """ScheduleFree in place of the workload's AdamW and its schedule: the authors' ``AdamWScheduleFree`` with the
    same learning rate and weight decay, warmed up over 5 % of the run as the baseline is."""
    return Candidate("ScheduleFree", {"replace": True, "warmup_steps": max(1, round(0.05 * total_steps))})


def _has(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def as_spec(candidates: Sequence[Candidate]) -> tuple[tuple[str, dict[str, Any]], ...]:
    """Candidates as the ``(class name, kwargs)`` pairs a fit's spec and the results file hold."""
    return tuple((c.algorithm, dict(c.kwargs)) for c in candidates)


def configurations(workload: Any, lr: float, total_steps: int) -> tuple[dict[str, tuple], dict[str, str]]:
    """``(configs, not_applicable)``: the configurations that apply to ``workload`` and why each other cannot."""
    import lightning as L

    L.seed_everything(0, verbose=False)
    module = workload.make_module(total_steps, lr)
    batch = next(iter(workload.make_data(0)[0]))
    configs: dict[str, tuple] = {"baseline": ()}
    left_out: dict[str, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for candidate in DEFAULT_CANDIDATES:
            why = applicability(candidate, module, batch, total_steps)
            if why is None:
                configs[candidate.label] = as_spec([candidate])
            else:
                left_out[candidate.label] = why
        extra = schedule_free(total_steps)
        why = applicability(extra, module, batch, total_steps) if _has("schedulefree") else (
            "the schedulefree package is not installed")
        if why is None:
            configs["ScheduleFree"] = as_spec([extra])
        else:
            left_out["ScheduleFree"] = why
        why = applicability(BATCH_SIZE_WARMUP, module, batch, total_steps)
        if why is None:
            configs["BatchSizeWarmup"] = as_spec([BATCH_SIZE_WARMUP])
        else:
            left_out["BatchSizeWarmup"] = why
        if "Muon" in configs and workload.family == "language":  # each variant alone on the language models
            configs.update({name: as_spec([candidate]) for name, candidate in MUON_VARIANTS.items()})
        recipes, recipe_reasons = published_starting_recipes(Probe(module, batch, [workload.monitor]), total_steps)
    for name, recipe in recipes.items():
        configs[f"recipe:{name}"] = as_spec(recipe)
    left_out.update({f"recipe:{name}": why for name, why in recipe_reasons.items()})
    return configs, left_out
