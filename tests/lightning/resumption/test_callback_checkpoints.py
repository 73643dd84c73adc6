"""Checkpoints: exact resumption, required-on-load algorithms, and bridge state that is missing or wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.support import assert_same_weights, image_loader, quiet_trainer, tiny_classifier, weights_of

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event, State
from composer_bridge.lightning import CheckpointStateError


class NoisyInputs(Algorithm):
    """Adds noise drawn from the run's generator, and shrinks it with a counter kept in its state."""

    def __init__(self, scale: float = 0.5) -> None:
        self.scale = scale
        self.calls = 0

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Any) -> None:
        x = state.batch_get_item(0)
        noise = torch.randn(x.shape, generator=state.generator("NoisyInputs", x.device), device=x.device)
        state.batch_set_item(0, x + noise * self.scale / (1 + self.calls))
        self.calls += 1

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = state["calls"]


class AddHead(Algorithm):
    """A surgery algorithm: wraps the final layer so the state dict's keys change."""

    unique = True

    def __init__(self, hidden: int = 6) -> None:
        self.hidden = hidden

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Any) -> None:
        fc = state.model.module.fc
        if isinstance(fc, torch.nn.Sequential):
            return
        state.model.module.fc = torch.nn.Sequential(torch.nn.Linear(fc.in_features, self.hidden), torch.nn.ReLU(),
                                                    torch.nn.Linear(self.hidden, fc.out_features))

    @classmethod
    def required_on_load(cls) -> bool:
        return True


def fit(algorithms: list[Algorithm], epochs: int, ckpt_path: Path | None = None, save_to: Path | None = None,
        **callback_options: Any) -> tuple[Any, AlgorithmEngineCallback]:
    model = tiny_classifier()
    callback = AlgorithmEngineCallback(algorithms, seed=7, **callback_options)
    trainer = quiet_trainer(max_epochs=epochs, limit_train_batches=3, accumulate_grad_batches=1, callbacks=[callback])
    trainer.fit(model, image_loader(n=48, batch_size=16), ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    return model, callback


def test_resumed_run_ends_with_exactly_the_weights_of_the_uninterrupted_run(tmp_path: Path) -> None:
    full_model, full_callback = fit([NoisyInputs(), AddHead()], epochs=3)
    fit([NoisyInputs(), AddHead()], epochs=1, save_to=tmp_path / "one.ckpt")
    resumed_model, resumed_callback = fit([NoisyInputs(), AddHead()], epochs=3, ckpt_path=tmp_path / "one.ckpt")
    assert_same_weights(weights_of(full_model), weights_of(resumed_model))
    assert resumed_callback.algorithms[0].calls == full_callback.algorithms[0].calls == 9
    counters = ("epoch", "batch", "sample", "batch_in_epoch", "sample_in_epoch")
    for name in counters:  # wall-clock differs, and timestamp.iteration counts fit() calls
        assert getattr(resumed_callback.state.timestamp, name) == getattr(full_callback.state.timestamp, name), name


def test_bridge_state_is_plain_data_that_weights_only_loading_accepts(tmp_path: Path) -> None:
    fit([NoisyInputs(0.25), AddHead()], epochs=1, save_to=tmp_path / "a.ckpt")
    checkpoint = torch.load(tmp_path / "a.ckpt", weights_only=True)
    bridge = checkpoint["callbacks"]["AlgorithmEngineCallback"]
    assert bridge["format"] == "composer_bridge/1"
    assert bridge["seed"] == 7
    assert [a["class"] for a in bridge["algorithms"]] == ["NoisyInputs", "AddHead"]
    assert bridge["algorithms"][0]["hparams"] == {"scale": 0.25}
    assert bridge["algorithms"][1]["required_on_load"] is True
    assert bridge["timestamp"]["batch"] == 3


def test_missing_surgery_algorithm_is_named_before_the_weights_fail_to_load(tmp_path: Path) -> None:
    fit([AddHead(hidden=5)], epochs=1, save_to=tmp_path / "s.ckpt")
    with pytest.raises(CheckpointStateError, match=r"AddHead\(hidden=5\).*add_missing_on_load=True"):
        fit([], epochs=2, ckpt_path=tmp_path / "s.ckpt")


def test_missing_surgery_algorithm_is_recreated_when_asked(tmp_path: Path) -> None:
    fit([AddHead(hidden=5)], epochs=1, save_to=tmp_path / "s.ckpt")
    with pytest.warns(UserWarning, match=r"Re-created AddHead\(hidden=5\)"):
        model, callback = fit([], epochs=2, ckpt_path=tmp_path / "s.ckpt", add_missing_on_load=True,
                              known_algorithms=[AddHead])
    assert isinstance(model.module.fc, torch.nn.Sequential) and model.module.fc[0].out_features == 5
    assert [type(a).__name__ for a in callback.algorithms] == ["AddHead"]


def test_recreation_only_uses_known_classes_and_never_evaluates_the_file(tmp_path: Path) -> None:
    fit([AddHead(hidden=5)], epochs=1, save_to=tmp_path / "s.ckpt")
    checkpoint = torch.load(tmp_path / "s.ckpt", weights_only=True)
    entry = checkpoint["callbacks"]["AlgorithmEngineCallback"]["algorithms"][0]
    marker = tmp_path / "pwned"
    entry["class"] = f"__import__('pathlib').Path({str(marker)!r}).touch() or AddHead"
    torch.save(checkpoint, tmp_path / "crafted.ckpt")
    with pytest.raises(CheckpointStateError, match="not a composer_bridge algorithm"):
        fit([], epochs=2, ckpt_path=tmp_path / "crafted.ckpt", add_missing_on_load=True, known_algorithms=[AddHead])
    assert not marker.exists()
    entry["class"] = "AddHead"
    entry["hparams"] = {"hidden": 5, "__class__": "os.system('touch pwned')"}
    torch.save(checkpoint, tmp_path / "crafted2.ckpt")
    with pytest.raises(CheckpointStateError, match="does not take"):
        fit([], epochs=2, ckpt_path=tmp_path / "crafted2.ckpt", add_missing_on_load=True, known_algorithms=[AddHead])


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda s: s.update(format="composer_bridge/0"), "another version of composer_bridge"),
        (lambda s: s.update(algorithms="garbage"), "corrupted: 'algorithms' must be a list"),
        (lambda s: s.pop("timestamp"), "corrupted: 'timestamp' must be a dict"),
    ],
)
def test_bridge_state_from_another_version_or_corrupted_is_refused_clearly(tmp_path: Path, corrupt: Any, message: str) -> None:
    fit([NoisyInputs()], epochs=1, save_to=tmp_path / "a.ckpt")
    checkpoint = torch.load(tmp_path / "a.ckpt", weights_only=True)
    corrupt(checkpoint["callbacks"]["AlgorithmEngineCallback"])
    torch.save(checkpoint, tmp_path / "bad.ckpt")
    with pytest.raises(CheckpointStateError, match=message):
        fit([NoisyInputs()], epochs=2, ckpt_path=tmp_path / "bad.ckpt")


def test_checkpoint_without_bridge_state_starts_algorithms_fresh(tmp_path: Path) -> None:
    model = tiny_classifier()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=3)
    trainer.fit(model, image_loader(n=48, batch_size=16))
    trainer.save_checkpoint(tmp_path / "plain.ckpt")
    _, callback = fit([NoisyInputs()], epochs=2, ckpt_path=tmp_path / "plain.ckpt")
    assert callback.algorithms[0].calls == 3, "only the resumed epoch's batches"
