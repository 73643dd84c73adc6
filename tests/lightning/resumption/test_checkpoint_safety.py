"""A checkpoint whose bridge state smuggles a pickled object is refused by safe loading; nothing runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.support import image_loader, quiet_trainer, tiny_classifier

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import LabelSmoothing


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # what an attacker's pickle does on load
        return (Path.touch, (self.marker,))


def test_pickled_object_in_algorithm_state_is_refused_by_weights_only_loading(tmp_path: Path) -> None:
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, callbacks=[AlgorithmEngineCallback([LabelSmoothing()])])
    trainer.fit(tiny_classifier(), image_loader())
    trainer.save_checkpoint(tmp_path / "good.ckpt")
    checkpoint = torch.load(tmp_path / "good.ckpt", weights_only=True)
    marker = tmp_path / "pwned"
    checkpoint["callbacks"]["AlgorithmEngineCallback"]["algorithms"][0]["state"] = {"x": Payload(marker)}
    torch.save(checkpoint, tmp_path / "crafted.ckpt")
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(tmp_path / "crafted.ckpt", weights_only=True)
    resumed = quiet_trainer(max_epochs=2, limit_train_batches=2, callbacks=[AlgorithmEngineCallback([LabelSmoothing()])])
    with pytest.raises(Exception, match="Weights only load failed"):
        resumed.fit(tiny_classifier(), image_loader(), ckpt_path=tmp_path / "crafted.ckpt", weights_only=True)
    assert not marker.exists()
