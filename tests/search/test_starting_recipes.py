"""Starting recipes: the first step races whole recipes beside the single candidates (real Lightning fits).

With ``clock="steps"`` every fit is deterministic, so the claim "the search never settles below the
best starting recipe on its own seeds" is checked exactly against the recipes' own search curves.
"""

from __future__ import annotations

import functools
import statistics

import pytest
import torch
from helpers import search_support as task

from composer_bridge import ComposerClassifier
from composer_bridge.search import Candidate, SearchInputError, search_recipe
from composer_bridge.search.checks import Probe, published_starting_recipes

make_module = functools.partial(task.make_module, lr=1.0)
# Small ghost batches beat anything the greedy steps reach from the single candidates on this task
# (1.53x against 1.10x on the search seeds): only a start that is raced and kept gets there.
STARTS = {"ls-gbn": ["LabelSmoothing", "GhostBatchNorm"],
          "small-ghost-batches": [Candidate("GhostBatchNorm", {"ghost_batch_size": 4}, name="GhostBatchNorm(4)")],
          "strong-mixup": [Candidate("MixUp", {"alpha": 1.0}, name="MixUp(1.0)")]}
# confidence=0: the racing rules alone (the noise gate, tested in test_estimate.py, would keep the baseline on this
# tiny task, which is mostly noise)
KWARGS = task.search_kwargs(candidates=["LabelSmoothing", "MixUp", "GhostBatchNorm"], search_seeds=[0, 1],
                            confirm_seeds=[10], max_fits=60, confidence=0.0, finalist_seeds=[])


def test_the_search_never_settles_below_the_best_starting_recipe_on_its_own_seeds() -> None:
    result = search_recipe(make_module, task.make_data, starting_recipes=STARTS, **KWARGS, method="greedy")
    seeds = result.settings["search_seeds"]
    assert not result.stopped_by_budget
    assert result.settings["starting_recipes"] == {"ls-gbn": ["LabelSmoothing", "GhostBatchNorm"],
                                                   "small-ghost-batches": ["GhostBatchNorm(4)"],
                                                   "strong-mixup": ["MixUp(1.0)"]}
    # every start raced whole on the first seed; only the leader there went on, and the search's pick is
    # at least as good as the leader on every search seed's mean
    first = {}
    for name, labels in result.settings["starting_recipes"].items():
        curves = {c.seed: c for c in result.curves if c.phase == "search" and set(c.config) == set(labels)}
        assert seeds[0] in curves, f"{name} was not raced on the first search seed"
        first[name] = curves[seeds[0]]
    leader = max(first, key=lambda n: first[n].speedup or 0.0)
    labels = result.settings["starting_recipes"][leader]
    curves = {c.seed: c for c in result.curves if c.phase == "search" and set(c.config) == set(labels)}
    assert set(curves) == set(seeds), f"the leading start {leader} was not raced whole on every search seed"
    lead = statistics.mean(curves[s].speedup or 0.0 for s in seeds)
    assert f"starting recipe {leader}: {lead:.2f}x" in result.steps
    for name, curve in first.items():  # a start behind the leader stopped once it could not beat it
        assert name == leader or curve.speedup is None or curve.speedup <= first[leader].speedup
    assert result.search_score is not None and result.search_score >= lead - 1e-9
    # The pick is what was trained: its labels are a configuration with search curves on every seed.
    picked = {c.label for c in result.recipe}
    assert {c.seed for c in result.curves if c.phase == "search" and set(c.config) == picked} == set(seeds)


def test_a_named_starting_recipe_that_cannot_apply_is_refused() -> None:
    with pytest.raises(SearchInputError, match=r"starting_recipes\['blur'\]: \['BlurPool'\] cannot apply .* remove "
                                               "BlurPool from"):
        search_recipe(make_module, task.make_data, starting_recipes={"blur": ["BlurPool", "LabelSmoothing"]},
                      **KWARGS, method="greedy")


def test_the_default_starting_recipes_are_the_published_ones_that_apply_whole() -> None:
    # A network with strided convolutions and max pooling: BlurPool, ChannelsLast, EMA, ProgressiveResizing,
    # LabelSmoothing, MixUp and SAM all apply, so mild, medium and short are raced; hot is not (StochasticDepth
    # finds no BasicBlock here), nor the language recipes (no token sequences).
    network = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16),
                                  torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 16, 3, stride=2, padding=1),
                                  torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 4))
    found = Probe(ComposerClassifier(network, num_classes=4), (torch.randn(8, 3, 32, 32), torch.arange(8) % 4), [])
    usable, left_out = published_starting_recipes(found, 100)
    assert set(usable) == {"mild", "medium", "short"}
    assert [c.label for c in usable["short"]] == ["short:BlurPool", "short:ChannelsLast", "short:LabelSmoothing"]
    assert "StochasticDepth" in left_out["hot"] and "token sequences" in left_out["gpt-fast"]


def test_a_language_recipes_sequence_length_comes_from_the_token_ids_of_a_dict_batch() -> None:
    # A GPT fed {"input_ids", "labels"} batches: the published language recipes read max_seq_length from
    # input_ids (16), so Alibi is no reason to leave them out; in a full-precision run gpt and gpt-fast still
    # cannot apply whole (LowPrecisionLayerNorm acts in 16-bit precision only), muon-wsd does.
    from composer_bridge.models.gpt import GPT

    tokens = torch.randint(0, 32, (4, 16))
    model = GPT(vocab_size=32, block_size=16, d_model=16, n_layers=1, n_heads=2)
    # without knowing where the labels are, ZLoss (in muon-wsd) would fail in its first step: left out, naming the fix
    usable, left_out = published_starting_recipes(Probe(model, {"input_ids": tokens, "labels": tokens}, []), 100)
    assert not usable and "ZLoss reads the targets at 1" in left_out["muon-wsd"] and "batch_keys" in left_out["muon-wsd"]
    model.batch_keys = {"input_key": "input_ids", "target_key": "labels"}  # declared once, as a user's module does
    found = Probe(model, {"input_ids": tokens, "labels": tokens}, [])
    usable, left_out = published_starting_recipes(found, 100)
    assert set(usable) == {"muon-wsd"}
    assert not any("token sequences" in why for why in left_out.values())
    assert "LowPrecisionLayerNorm" in left_out["gpt-fast"]


def test_a_search_where_no_published_recipe_applies_says_why_in_its_steps() -> None:
    result = search_recipe(make_module, task.make_data, **{**KWARGS, "candidates": ["LabelSmoothing"], "max_fits": 12,
                                                          "search_seeds": [0]}, method="greedy")
    assert any(s.startswith("published recipe short is not a starting recipe: short:BlurPool would replace nothing")
               for s in result.steps)
    assert "starting_recipes" not in result.settings  # a state saved before starting recipes existed still loads
