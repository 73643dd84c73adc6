"""Bad input anywhere gives one clear error that names the problem: every algorithm's hyper-parameters,
Time strings, event names."""

from __future__ import annotations

from typing import Any

import pytest

import composer_bridge.algorithms as library
from composer_bridge import Event, Time

REQUIRED = {"Alibi": {"max_sequence_length": 64}, "GradientClipping": {"clipping_type": "norm", "clipping_threshold": 1.0}}

#: algorithm -> [(keyword, bad value)]: each must be refused with an error naming the keyword.
BAD: dict[str, list[tuple[str, Any]]] = {
    "Alibi": [("max_sequence_length", 0), ("max_sequence_length", "long")],
    "AugMix": [("severity", 11), ("width", 0), ("alpha", 0.0), ("depth", 0)],
    "BatchSizeWarmup": [
        ("duration", 0),
        ("duration", 2.0),
        ("initial", 0.0),
        ("initial", 1.5),
        ("multiple_of", 0),
        ("multiple_of", 2.5),
    ],
    "BlurPool": [("min_channels", -1), ("replace_convs", "yes")],
    "ColOut": [("p_row", 1.5), ("p_col", -0.1)],
    "CutMix": [("alpha", -1.0), ("alpha", "big")],
    "CutOut": [("num_holes", -1), ("length", 2.0)],
    "EMA": [("smoothing", 1.5), ("half_life", "10xyz")],
    "Factorize": [("latent_channels", -3), ("min_channels", -1)],
    "GatedLinearUnits": [("act_fn", 3)],
    "GhostBatchNorm": [("ghost_batch_size", 0), ("ghost_batch_size", 2.5)],
    "GradientClipping": [("clipping_type", "sideways"), ("clipping_threshold", -1.0)],
    "GyroDropout": [("p", 1.5), ("sigma", 0)],
    "LabelSmoothing": [("smoothing", 1.5), ("smoothing", "lots")],
    "LayerFreezing": [("freeze_start", 2.0), ("freeze_level", -0.5)],
    "LowPrecisionGroupNorm": [("apply_at", "sometime")],
    "LowPrecisionLayerNorm": [("apply_at", "sometime")],
    "MixUp": [("alpha", -1), ("alpha", None)],
    "Muon": [("lr", -0.02), ("momentum", 1.5), ("ns_steps", 0), ("ns_coefficients", "fast"), ("normuon", "yes"),
             ("cautious_weight_decay", 1)],
    "Compile": [("mode", "fastest"), ("backend", ""), ("fullgraph", "yes")],
    "ProgressiveResizing": [("mode", "stretch"), ("initial_scale", 0.0)],
    "QKNorm": [("eps", 0.0), ("eps", "tiny")],
    "RandAugment": [("severity", -1), ("depth", -1), ("augmentation_set", "most")],
    "SAM": [("rho", -0.1), ("interval", 0)],
    "ScheduleFree": [("replace", "yes"), ("batchnorm_batches", -1)],
    "SWA": [("swa_start", "garbage"), ("anneal_strategy", "zigzag")],
    "SelectiveBackprop": [("keep", 0.0), ("start", 2.0)],
    "SeqLengthWarmup": [("duration", 2.0), ("min_seq_length", 0)],
    "SqueezeExcite": [("latent_channels", -1), ("min_channels", -5)],
    "StochasticDepth": [("drop_rate", 1.5), ("stochastic_method", "teleport")],
    "WarmupStableDecay": [("shape", "cosine"), ("final_lr_ratio", 2.0), ("warmup", "10xyz")],
    "WeightStandardization": [("n_last_layers_ignore", -1)],
    "ZLoss": [("coefficient", -1e-4), ("class_dim", 2)],
}

CASES = [(name, key, value) for name, bad in sorted(BAD.items()) for key, value in bad if name in library.__all__]


@pytest.mark.parametrize(("name", "key", "value"), CASES)
def test_bad_hyperparameter_is_refused_with_its_name(name: str, key: str, value: Any) -> None:
    kwargs = {**REQUIRED.get(name, {}), key: value}
    with pytest.raises((ValueError, TypeError)) as error:
        getattr(library, name)(**kwargs)
    assert key in str(error.value), f"{name}({key}={value!r}) raised without naming {key!r}: {error.value}"


def test_every_algorithm_with_hyperparameters_has_bad_input_cases() -> None:
    for name in library.__all__:
        algorithm = getattr(library, name)(**REQUIRED.get(name, {}))
        if algorithm.hparams():
            assert name in BAD, f"add bad-input cases for {name} to BAD"


@pytest.mark.parametrize("text", ["", "ep", "10", "1.5ep", "10 xyz", "abc", "-3ba", "1h20", "10ms", "1e3", "++2ep"])
def test_malformed_time_strings_are_named(text: str) -> None:
    with pytest.raises(ValueError) as error:
        Time.from_timestring(text)
    assert repr(text) in str(error.value) or text in str(error.value)


@pytest.mark.parametrize("text", ["batch_ends", "EPOCH_FINISH", "after_loss_", "fit"])
def test_unknown_events_in_filters_name_close_matches(text: str) -> None:
    with pytest.raises(ValueError, match="Unknown event"):
        Event(text)(every=2)
