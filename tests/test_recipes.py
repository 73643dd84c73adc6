"""composer_bridge.recipes: MosaicML's published algorithm lists, adjustable by keyword."""

from __future__ import annotations

import warnings

import pytest

from composer_bridge import Algorithm, algorithms, recipes
from composer_bridge.algorithms import BlurPool, LabelSmoothing, MixUp

LIBRARY = set(algorithms.__all__)


def needs(*names: str) -> pytest.MarkDecorator:
    """Skip (saying which) when this version of the library lacks one of ``names``."""
    absent = sorted(set(names) - LIBRARY)
    return pytest.mark.skipif(bool(absent), reason=f"composer_bridge.algorithms has no {absent} yet")

# The numbers as published in mosaicml/examples, examples/benchmarks/resnet_imagenet/main.py,
# written out here independently of recipes.py.
PUBLISHED_VISION = {
    "mild": {
        "BlurPool": {},
        "ChannelsLast": {},
        "EMA": {"half_life": "100ba", "update_interval": "20ba"},
        "ProgressiveResizing": {"initial_scale": 0.5, "delay_fraction": 0.4, "finetune_fraction": 0.2},
        "LabelSmoothing": {"smoothing": 0.08},
    },
    "medium": {
        "BlurPool": {},
        "ChannelsLast": {},
        "EMA": {"half_life": "100ba", "update_interval": "20ba"},
        "ProgressiveResizing": {"initial_scale": 0.5, "delay_fraction": 0.4, "finetune_fraction": 0.2},
        "LabelSmoothing": {"smoothing": 0.1},
        "MixUp": {"alpha": 0.2},
        "SAM": {"rho": 0.5, "interval": 10},
    },
    "hot": {
        "BlurPool": {},
        "ChannelsLast": {},
        "EMA": {"half_life": "100ba", "update_interval": "20ba"},
        "ProgressiveResizing": {"initial_scale": 0.6, "delay_fraction": 0.2, "finetune_fraction": 0.2},
        "LabelSmoothing": {"smoothing": 0.13},
        "MixUp": {"alpha": 0.25},
        "SAM": {"rho": 0.5, "interval": 5},
        "ColOut": {"p_row": 0.05, "p_col": 0.05},
        "RandAugment": {"depth": 1, "severity": 9},
        "StochasticDepth": {"stochastic_method": "sample", "drop_distribution": "linear", "drop_rate": 0.1},
    },
}


@pytest.mark.parametrize("name", ["mild", "medium", "hot"])
def test_vision_recipe_tables_hold_the_published_algorithms_and_numbers(name: str) -> None:
    table = recipes.VISION_RECIPES[name]
    assert [cls for cls, _ in table] == list(PUBLISHED_VISION[name])
    for cls, kwargs in table:
        for key, value in PUBLISHED_VISION[name][cls].items():
            assert kwargs[key] == value, f"{name}: {cls}.{key}"


@pytest.mark.parametrize("name", ["mild", "medium", "hot"])
def test_vision_recipes_build_the_published_algorithms(name: str) -> None:
    if set(PUBLISHED_VISION[name]) - LIBRARY:
        pytest.skip(f"composer_bridge.algorithms has no {sorted(set(PUBLISHED_VISION[name]) - LIBRARY)} yet")
    built = recipes.vision(name)
    assert [type(a).__name__ for a in built] == list(PUBLISHED_VISION[name])
    for algorithm in built:
        assert isinstance(algorithm, Algorithm)
        hparams = algorithm.hparams()
        for key, value in PUBLISHED_VISION[name][type(algorithm).__name__].items():
            assert hparams[key] == value, f"{name}: {type(algorithm).__name__}.{key}"


def test_an_algorithm_the_library_lacks_raises_or_is_dropped_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(recipes.VISION_RECIPES, "test", [("LabelSmoothing", {}), ("NoSuchAlgorithm", {})])
    with pytest.raises(ValueError, match=r"needs NoSuchAlgorithm.*no_such_algorithm=None"):
        recipes.vision("test")
    with pytest.warns(recipes.MissingAlgorithmWarning, match="no NoSuchAlgorithm"):
        built = recipes.vision("test", missing="drop")
    assert built == [LabelSmoothing()]
    with pytest.raises(ValueError, match="missing='skip'"):
        recipes.vision("test", missing="skip")


def test_missing_drop_changes_nothing_when_the_library_has_everything() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", recipes.MissingAlgorithmWarning)
        built = recipes.vision("mild", ema=None, missing="drop")
    assert [type(a).__name__ for a in built] == ["BlurPool", "ChannelsLast", "ProgressiveResizing", "LabelSmoothing"]


@needs("EMA")
def test_every_call_returns_fresh_instances() -> None:
    first, second = recipes.vision("mild"), recipes.vision("mild")
    assert first == second
    assert all(a is not b for a, b in zip(first, second, strict=True))


@needs("EMA")
def test_the_short_recipe_is_mild_without_progressive_resizing_and_ema() -> None:
    # Written out independently of recipes.py: what docs/benchmarks.md evaluated as "short".
    built = recipes.vision("short")
    assert [type(a).__name__ for a in built] == ["BlurPool", "ChannelsLast", "LabelSmoothing"]
    assert built[2].hparams()["smoothing"] == PUBLISHED_VISION["mild"]["LabelSmoothing"]["smoothing"]
    assert built[0].hparams() == BlurPool().hparams()  # BlurPool's defaults, as in mild
    assert built == recipes.vision("mild", progressive_resizing=None, ema=None)
    # nothing in it is counted in steps: a run's length changes nothing
    for total_steps in (12, 92, 100_000):
        assert recipes.vision("short", total_steps=total_steps) == built
        assert recipes.for_run("short", total_steps) == built
    # the published table is left as it was
    assert [cls for cls, _ in recipes.VISION_RECIPES["mild"]] == list(PUBLISHED_VISION["mild"])


def test_a_plain_value_sets_the_main_hyper_parameter() -> None:
    smoothing = recipes.vision("mild", label_smoothing=0.1)[-1]
    assert smoothing == LabelSmoothing(smoothing=0.1)
    ema = next(a for a in recipes.vision("mild", ema="0.05dur") if type(a).__name__ == "EMA")
    assert ema.half_life == "0.05dur" and ema.update_interval == "20ba"


def test_a_dict_updates_arguments_and_keeps_the_others() -> None:
    resizing = recipes.vision("mild", ema=None, progressive_resizing={"size_increment": 2})[2]
    assert (resizing.size_increment, resizing.initial_scale, resizing.delay_fraction) == (2, 0.5, 0.4)


def test_none_or_false_drops_and_true_keeps() -> None:
    names = [type(a).__name__ for a in recipes.vision("medium", sam=None, ema=False, mixup=None, blurpool=True)]
    assert names == ["BlurPool", "ChannelsLast", "ProgressiveResizing", "LabelSmoothing"]


def test_an_instance_replaces_and_a_new_library_algorithm_is_appended() -> None:
    mine = BlurPool(min_channels=4)
    built = recipes.vision("mild", blurpool=mine, mixup=0.3, ema=None)
    assert built[0] is mine
    assert built[-1] == MixUp(alpha=0.3)
    assert len(built) == 5


def test_override_key_names_the_keyword_that_drops_each_recipe_algorithm() -> None:
    for name in recipes.VISION_RECIPES:
        for class_name, _ in recipes.VISION_RECIPES[name]:
            kept = recipes.vision(name, **{recipes.override_key(class_name): None})
            assert class_name not in [type(a).__name__ for a in kept]
    assert [recipes.override_key(n) for n in ("BlurPool", "GhostBatchNorm", "SeqLengthWarmup")] == [
        "blurpool", "ghost_batchnorm", "seq_length_warmup"]


def test_unknown_recipe_name_says_what_exists() -> None:
    with pytest.raises(ValueError, match=r"unknown recipe.*'mild'.*\['hot', 'medium', 'mild', 'short'\]"):
        recipes.vision("mlid")
    with pytest.raises(ValueError, match=r"unknown recipe.*gpt"):
        recipes.language("bert")


def test_unknown_override_key_suggests_the_close_one() -> None:
    with pytest.raises(ValueError, match=r"'label_smothing' names no algorithm.*Did you mean 'label_smoothing'"):
        recipes.vision("mild", label_smothing=0.1)


def test_a_plain_value_for_an_algorithm_without_a_main_parameter_asks_for_a_dict() -> None:
    with pytest.raises(ValueError, match=r"BlurPool has no single main hyper-parameter.*dict"):
        recipes.vision("mild", blurpool=3)


def test_a_value_of_the_wrong_kind_is_refused() -> None:
    with pytest.raises(ValueError, match=r"expected a number or string.*got list"):
        recipes.vision("mild", ema=[1, 2])


def test_an_unknown_argument_names_the_algorithm() -> None:
    with pytest.raises(TypeError, match=r"could not build LabelSmoothing"):
        recipes.vision("mild", label_smoothing={"smoothness": 0.1}, ema=None)


def test_bad_hyper_parameters_are_still_validated_by_the_algorithm() -> None:
    with pytest.raises(ValueError, match="smoothing"):
        recipes.vision("mild", label_smoothing=1.5, ema=None)


@needs("GradientClipping")
def test_language_recipe_uses_the_model_length() -> None:
    algorithms = recipes.language("gpt", max_seq_length=256)
    assert [type(a).__name__ for a in algorithms] == ["GradientClipping", "LowPrecisionLayerNorm", "Alibi"]
    clipping, _, alibi = algorithms
    assert (clipping.clipping_type, clipping.clipping_threshold) == ("norm", 1.0)
    assert (alibi.max_sequence_length, alibi.train_sequence_length_scaling) == (256, 1.0)
    assert [type(a).__name__ for a in recipes.language("gpt", max_seq_length=64, alibi=None)] == [
        "GradientClipping", "LowPrecisionLayerNorm"]


@needs("GradientClipping", "SeqLengthWarmup")
def test_language_fast_recipe_warms_up_the_sequence_length() -> None:
    algorithms = recipes.language("gpt-fast", max_seq_length=128)
    assert [type(a).__name__ for a in algorithms] == [
        "GradientClipping", "LowPrecisionLayerNorm", "Alibi", "SeqLengthWarmup", "GatedLinearUnits"]
    warmup = algorithms[3]
    assert (warmup.duration, warmup.min_seq_length, warmup.max_seq_length, warmup.step_size) == (0.3, 8, 128, 8)


def test_the_muon_wsd_recipe_is_the_combination_that_was_measured() -> None:
    """What docs/benchmarks.md measured as "new-all" (benchmarks/language_methods_cpu.json) is the recipe, argument
    for argument; only ZLoss's target_key was the example's dict key there ("labels")."""
    import json
    from pathlib import Path

    measured = json.loads((Path(__file__).parents[1] / "benchmarks/language_methods_cpu.json").read_text())
    recorded = [(c["algorithm"], dict(c["kwargs"])) for c in measured["settings"]["algorithms"]["new-all"]]
    recorded = [(name, {k: v for k, v in kw.items() if k != "target_key"}) for name, kw in recorded]
    assert recorded == [(name, dict(kw)) for name, kw in recipes.LANGUAGE_RECIPES["muon-wsd"]]
    built = recipes.language("muon-wsd", max_seq_length=128, zloss={"target_key": "labels"})
    assert [type(a).__name__ for a in built] == ["Muon", "WarmupStableDecay", "QKNorm", "ZLoss"]
    assert (built[0].lr, built[3].class_dim, built[3].target_key) == (0.02, -1, "labels")


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "128"])
def test_language_needs_a_positive_integer_length(bad: object) -> None:
    with pytest.raises(ValueError, match="max_seq_length"):
        recipes.language("gpt", max_seq_length=bad)  # type: ignore[arg-type]


# --- recipes for a run of known length -------------------------------------------------------------


def _by_name(built: list[Algorithm]) -> dict[str, Algorithm]:
    return {type(a).__name__: a for a in built}


@needs("EMA", "SAM")
@pytest.mark.parametrize("total_steps, half_life, update_interval, sam_interval", [
    (96, "5ba", "1ba", 9),          # a 96-step digits run: 5% of the run, not 100 steps of 96
    (300, "15ba", "3ba", 10),       # the published update/half-life ratio (1/5) is kept
    (2_000, "100ba", "20ba", 10),   # long enough: the published numbers, unchanged
    (1_000_000, "100ba", "20ba", 10),
    (40, "2ba", "1ba", 4),          # at least 10 SAM steps in the run
])
def test_total_steps_scales_the_step_counted_hyper_parameters(total_steps: int, half_life: str,
                                                               update_interval: str, sam_interval: int) -> None:
    built = _by_name(recipes.vision("medium", total_steps=total_steps))
    assert (built["EMA"].half_life, built["EMA"].update_interval) == (half_life, update_interval)
    assert built["SAM"].interval == sam_interval and built["SAM"].rho == 0.5
    # the schedules that are fractions of the run already are left alone
    assert built["ProgressiveResizing"] == recipes.vision("medium")[3]


@needs("EMA")
def test_the_scaled_ema_averages_over_a_small_part_of_a_short_run() -> None:
    # An independent statement of the rule: a half-life of at most 5% of the run.
    for total_steps in (20, 96, 300, 1_999, 2_000, 2_001):
        ema = _by_name(recipes.vision("mild", total_steps=total_steps))["EMA"]
        steps = int(ema.half_life[:-2])
        assert 1 <= steps <= max(1, 0.05 * total_steps + 0.5) and steps <= 100


@needs("EMA")
def test_overrides_win_over_the_run_length_scaling() -> None:
    ema = _by_name(recipes.vision("mild", total_steps=300, ema={"half_life": "7ba"}))["EMA"]
    assert (ema.half_life, ema.update_interval) == ("7ba", "3ba")
    ema = _by_name(recipes.vision("mild", total_steps=300, ema="auto"))["EMA"]
    assert ema.half_life == "auto"


@needs("EMA", "GradientClipping", "SeqLengthWarmup")
def test_for_run_picks_the_vision_or_language_recipe_by_name() -> None:
    assert recipes.for_run("mild", 300) == recipes.vision("mild", total_steps=300)
    assert recipes.for_run("gpt-fast", 500, max_seq_length=64) == recipes.language(
        "gpt-fast", max_seq_length=64)  # language schedules are fractions already: nothing to rescale
    with pytest.raises(ValueError, match=r"for_run\(name='mlid'\).*Did you mean 'mild'"):
        recipes.for_run("mlid", 300)


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "300"])
def test_total_steps_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match=r"total_steps=.*int >= 1"):
        recipes.vision("mild", total_steps=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"total_steps"):
        recipes.language("gpt", max_seq_length=64, total_steps=bad)  # type: ignore[arg-type]


def test_the_module_examples_run() -> None:
    import doctest

    result = doctest.testmod(recipes, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 8 and result.failed == 0


def test_the_muon_wsd_recipe_trains_a_plain_language_module_whose_step_flattens_the_logits() -> None:
    """A LightningModule written the usual way (``F.cross_entropy(logits.view(-1, V), y.view(-1))``, dict batches):
    the recipe's ZLoss(class_dim=-1) describes a ComposerModule's (B, T, V) outputs, and on this module it must read
    the logits as the step's loss call took them (it failed at the first step before)."""
    import torch
    import torch.nn.functional as F
    from helpers.support import L, quiet_trainer
    from torch.utils.data import DataLoader

    from composer_bridge import AlgorithmEngineCallback, Event
    from composer_bridge.models.gpt import GPT

    vocab, block = 32, 16

    class PlainGPT(L.LightningModule):
        batch_keys = {"input_key": "input_ids", "target_key": "labels"}

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = GPT(vocab_size=vocab, block_size=block, d_model=32, n_layers=1, n_heads=2)

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            logits = self.model(batch["input_ids"])
            return F.cross_entropy(logits.view(-1, logits.size(-1)), batch["labels"].view(-1))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (8, block + 1), generator=g)
    batches = [{"input_ids": tokens[i:i + 4, :-1].clone(), "labels": tokens[i:i + 4, 1:].clone()} for i in (0, 4)]
    callback = AlgorithmEngineCallback(recipes.language("muon-wsd", max_seq_length=block))
    model = PlainGPT()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quiet_trainer(max_steps=2, callbacks=[callback]).fit(model, DataLoader(batches, batch_size=None))
    applied = {(t.name, t.event) for step in callback.traces for t in callback.traces[step]}
    assert ("ZLoss", Event.AFTER_LOSS) in applied  # its term added to the step's loss
    assert all(torch.isfinite(p).all() for p in model.parameters())
