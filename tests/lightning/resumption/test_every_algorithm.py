"""Every algorithm in the library, and every recipe, resumes exactly from a checkpoint.

Parametrised from ``composer_bridge.algorithms.__all__``: a new algorithm is covered automatically
(default construction on the vision model) unless it needs the override table below, and a test
fails when an exported algorithm can be neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import (
    ComposerModule,
    L,
    ResumableLoader,
    assert_same_state,
    image_loader,
    quiet_trainer,
    tiny_classifier,
    weights_of,
)
from torch.utils.data import DataLoader, TensorDataset

import composer_bridge.algorithms as library
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.models import GPT

VOCAB, SEQ = 12, 16


class TokenModel(ComposerModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gpt = GPT(vocab_size=VOCAB, block_size=SEQ, d_model=16, n_layers=1, n_heads=2, dropout=0.0)

    def forward(self, batch: Any) -> torch.Tensor:
        return self.gpt(batch[0])

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        targets = batch[1][:, : outputs.shape[1]]
        return F.cross_entropy(outputs.reshape(-1, VOCAB).float(), targets.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def token_loader() -> DataLoader:
    tokens = torch.randint(0, VOCAB, (48, SEQ + 1), generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=16)


VISION = (tiny_classifier, lambda: image_loader(n=48, batch_size=16))
TOKENS = (TokenModel, token_loader)

#: name -> (algorithm factory, (model factory, loader factory)) for what default construction cannot cover.
OVERRIDES: dict[str, tuple[Any, tuple[Any, Any]]] = {
    "GradientClipping": (lambda: library.GradientClipping("adaptive", 0.05), VISION),
    "Alibi": (lambda: library.Alibi(max_sequence_length=SEQ), TOKENS),
    "QKNorm": (library.QKNorm, TOKENS),
    "GatedLinearUnits": (library.GatedLinearUnits if hasattr(library, "GatedLinearUnits") else None, TOKENS),
    "LowPrecisionLayerNorm": (library.LowPrecisionLayerNorm if hasattr(library, "LowPrecisionLayerNorm") else None, TOKENS),
    "SeqLengthWarmup": (lambda: library.SeqLengthWarmup(duration=0.5, min_seq_length=4, max_seq_length=SEQ,
                                                        step_size=4), TOKENS),
    # 0.7 of the 9 steps: steps 0-5 are trimmed, so both resumption points (steps 3 and 4) fall inside the warmup
    "BatchSizeWarmup": (lambda: library.BatchSizeWarmup(duration=0.7, initial=0.25), VISION),
    "EMA": (lambda: library.EMA(half_life="2ba"), VISION),
    "SWA": (lambda: library.SWA(swa_start="0.3dur", swa_end="0.9dur", update_interval="1ba"), VISION),
    "LayerFreezing": (lambda: library.LayerFreezing(freeze_start=0.2, freeze_level=0.6), VISION),
    "SelectiveBackprop": (lambda: library.SelectiveBackprop(start=0.0, end=1.0, keep=0.5), VISION),
}


def _muon() -> Any:
    if not hasattr(torch.optim, "Muon"):
        pytest.skip("torch.optim.Muon needs torch>=2.9")
    return library.Muon(lr=0.02)


def _schedule_free() -> Any:
    pytest.importorskip("schedulefree")
    return library.ScheduleFree(replace=True)  # the vision model's SGD(momentum=0.9) becomes SGDScheduleFree


OVERRIDES.update({"Muon": (_muon, TOKENS), "ScheduleFree": (_schedule_free, VISION),
                  "Compile": (lambda: library.Compile(backend="eager"), VISION)})


def case(name: str) -> tuple[Any, tuple[Any, Any]]:
    if name in OVERRIDES:
        return OVERRIDES[name]
    return getattr(library, name), VISION


def train(algorithms: list[Any], model_factory: Any, loader_factory: Any, save_dir: Path | None = None,
          ckpt: Path | None = None, accumulate: int = 1):
    model = model_factory()
    callback = AlgorithmEngineCallback(algorithms, seed=11)
    extra = [L.callbacks.ModelCheckpoint(dirpath=save_dir, save_top_k=-1, every_n_epochs=1)] if save_dir else []
    trainer = quiet_trainer(max_epochs=3, limit_train_batches=3, accumulate_grad_batches=accumulate,
                            callbacks=[callback, *extra], enable_checkpointing=bool(save_dir))
    trainer.fit(model, loader_factory(), ckpt_path=ckpt)
    return model, callback, trainer


def assert_resumes_exactly(make_algorithms: Any, models: tuple[Any, Any], tmp_path: Path, accumulate: int = 1) -> None:
    full_model, full_cb, full_trainer = train(make_algorithms(), *models, save_dir=tmp_path, accumulate=accumulate)
    checkpoints = sorted(tmp_path.glob("*.ckpt"))
    assert checkpoints, "no checkpoint written"
    for path in checkpoints:
        torch.load(path, weights_only=True)  # everything the bridge wrote is plain data
    first = min(checkpoints, key=lambda p: p.stat().st_mtime)
    model, callback, trainer = train(make_algorithms(), *models, ckpt=first, accumulate=accumulate)
    a, b = weights_of(full_model), weights_of(model)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"weights differ at {key}"
    assert_same_state(full_trainer.optimizers[0].state_dict(), trainer.optimizers[0].state_dict(), "optimizer")
    for x, y in zip(full_cb.algorithms, callback.algorithms, strict=True):
        assert_same_state(x.state_dict(), y.state_dict(), type(x).__name__)


@pytest.mark.parametrize("name", library.__all__)
def test_every_algorithm_resumes_exactly(name: str, tmp_path: Path) -> None:
    factory, models = case(name)
    assert factory is not None, f"{name} needs an entry in OVERRIDES"
    assert_resumes_exactly(lambda: [factory()], models, tmp_path)


def test_every_exported_algorithm_is_constructible_for_the_matrix() -> None:
    for name in library.__all__:
        factory, _ = case(name)
        try:
            factory()
        except Exception as error:  # pragma: no cover - the message is the point
            pytest.fail(f"{name}() cannot be built with defaults ({error}); add it to OVERRIDES in {__file__}")


@pytest.mark.parametrize("name", ["LabelSmoothing", "MixUp", "EMA", "LayerFreezing", "SelectiveBackprop"])
def test_resumption_is_exact_under_gradient_accumulation(name: str, tmp_path: Path) -> None:
    factory, models = case(name)
    assert_resumes_exactly(lambda: [factory()], models, tmp_path, accumulate=2)


def test_recipes_resume_exactly(tmp_path: Path) -> None:
    from composer_bridge import recipes

    for recipe in ("mild", "medium", "hot"):
        algorithms = recipes.vision(recipe, missing="drop")
        # The digits-scale settings the examples use, so every algorithm acts within 9 steps.
        assert_resumes_exactly(lambda r=recipe: recipes.vision(r, missing="drop"), VISION, tmp_path / recipe)
        assert algorithms


@pytest.mark.parametrize(
    "name", ["LabelSmoothing", "MixUp", "EMA", "LayerFreezing", "ProgressiveResizing", "BatchSizeWarmup"]
)
def test_resumption_from_a_mid_epoch_checkpoint_is_exact_with_a_resumable_loader(name: str, tmp_path: Path) -> None:
    factory, _ = case(name)
    data = image_loader(n=48, batch_size=16).dataset

    def fit(ckpt: Path | None, save: bool) -> tuple[Any, Any]:
        model = tiny_classifier()
        callback = AlgorithmEngineCallback([factory()], seed=11)
        extra = [L.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1)] if save else []
        trainer = quiet_trainer(max_epochs=3, callbacks=[callback, *extra], enable_checkpointing=save)
        trainer.fit(model, ResumableLoader(data, 16), ckpt_path=ckpt)
        return model, callback

    full_model, full_cb = fit(None, save=True)
    mid = tmp_path / "epoch=1-step=4.ckpt"
    assert mid.exists(), sorted(p.name for p in tmp_path.iterdir())
    model, callback = fit(mid, save=False)
    a, b = weights_of(full_model), weights_of(model)
    for key in a:
        assert torch.equal(a[key], b[key]), f"weights differ at {key}"
    assert_same_state(full_cb.algorithms[0].state_dict(), callback.algorithms[0].state_dict(), name)
