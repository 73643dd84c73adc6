"""Every surgery algorithm in the real Trainer (bf16-mixed), through a checkpoint, torch.export and DDP."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import (
    assert_same_weights,
    image_loader,
    quiet_trainer,
    tiny_classifier,
    weights_of,
)
from helpers.two_processes import saved_by_each_rank
from lightning.pytorch.loggers import Logger as LightningLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import AlgorithmEngineCallback, ComposerClassifier, ComposerModule, Event, Logger, State
from composer_bridge.algorithms import (
    Alibi,
    BlurPool,
    ChannelsLast,
    Factorize,
    GatedLinearUnits,
    GhostBatchNorm,
    GyroDropout,
    LowPrecisionGroupNorm,
    LowPrecisionLayerNorm,
    QKNorm,
    SqueezeExcite,
    StochasticDepth,
    WeightStandardization,
)
from composer_bridge.algorithms.alibi import AlibiCausalSelfAttention
from composer_bridge.algorithms.blurpool import BlurConv2d
from composer_bridge.algorithms.factorize import FactorizedConv2d
from composer_bridge.algorithms.gated_linear_units import GatedFeedForward
from composer_bridge.algorithms.ghost_batchnorm import GhostBatchNormWrapper
from composer_bridge.algorithms.gyro_dropout import GyroDropoutLayer
from composer_bridge.algorithms.low_precision_groupnorm import LPGroupNorm
from composer_bridge.algorithms.low_precision_layernorm import LPLayerNorm
from composer_bridge.algorithms.qk_norm import QKNormProjection
from composer_bridge.algorithms.squeeze_excite import SqueezeExciteConv2d
from composer_bridge.algorithms.stochastic_depth import StochasticBlock
from composer_bridge.models import GPT

VOCAB, SEQ = 16, 16


class GPTLanguageModel(ComposerModule):
    """The small GPT as a ComposerModule: batch = (tokens, next tokens), cross-entropy over the vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gpt = GPT(vocab_size=VOCAB, block_size=SEQ, d_model=16, n_layers=1, n_heads=2, dropout=0.1)

    def forward(self, batch: Any) -> torch.Tensor:
        return self.gpt(batch[0])

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.cross_entropy(outputs.reshape(-1, VOCAB).float(), batch[1].reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def token_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (32, SEQ + 1), generator=g)
    return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=8)


def groupnorm_classifier() -> ComposerClassifier:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(8, 4))
    return ComposerClassifier(net, num_classes=4, optimizer=lambda p: torch.optim.SGD(p, lr=0.05))


def dropout_classifier() -> ComposerClassifier:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 4))
    return ComposerClassifier(net, num_classes=4, optimizer=lambda p: torch.optim.SGD(p, lr=0.05))


Case = tuple[Callable[[], Any], Callable[[], Any], Callable[[], DataLoader], type | None]
CASES: dict[str, Case] = {
    "BlurPool": (lambda: BlurPool(min_channels=4), tiny_classifier, image_loader, BlurConv2d),
    "ChannelsLast": (ChannelsLast, tiny_classifier, image_loader, None),
    "SqueezeExcite": (lambda: SqueezeExcite(latent_channels=0.5, min_channels=8), tiny_classifier, image_loader,
                      SqueezeExciteConv2d),
    "StochasticDepth": (lambda: StochasticDepth(drop_rate=0.5), tiny_classifier, image_loader, StochasticBlock),
    "GhostBatchNorm": (lambda: GhostBatchNorm(ghost_batch_size=4), tiny_classifier, image_loader,
                       GhostBatchNormWrapper),
    "WeightStandardization": (WeightStandardization, tiny_classifier, image_loader, None),
    "Factorize": (lambda: Factorize(min_channels=8, min_features=4), tiny_classifier, image_loader, FactorizedConv2d),
    "LowPrecisionLayerNorm": (LowPrecisionLayerNorm, GPTLanguageModel, token_loader, LPLayerNorm),
    "LowPrecisionGroupNorm": (LowPrecisionGroupNorm, groupnorm_classifier, image_loader, LPGroupNorm),
    "GatedLinearUnits": (GatedLinearUnits, GPTLanguageModel, token_loader, GatedFeedForward),
    "Alibi": (lambda: Alibi(max_sequence_length=SEQ, train_sequence_length_scaling=0.5), GPTLanguageModel,
              token_loader, AlibiCausalSelfAttention),
    "GyroDropout": (lambda: GyroDropout(sigma=8, tau=2), dropout_classifier, image_loader, GyroDropoutLayer),
    "QKNorm": (QKNorm, GPTLanguageModel, token_loader, QKNormProjection),
}


class RecordingLogger(LightningLogger):
    """A real Lightning logger that keeps every metric it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, float] = {}

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.update(metrics)


@pytest.mark.parametrize("name", list(CASES))
def test_trains_in_bf16_logs_replacements_and_its_checkpoint_loads_into_a_new_run(name: str, tmp_path: Path) -> None:
    make_algorithm, make_model, make_loader, produced = CASES[name]
    algorithm = make_algorithm()
    assert type(algorithm).required_on_load() and type(algorithm).unique
    assert eval(repr(algorithm)) == algorithm
    recorder = RecordingLogger()
    model = make_model()
    trainer = quiet_trainer(max_steps=2, precision="bf16-mixed", logger=recorder,
                            callbacks=[AlgorithmEngineCallback([algorithm], seed=0)])
    trainer.fit(model, make_loader())
    assert recorder.metrics[f"{name}/num_replaced"] > 0
    if produced is not None:
        assert any(isinstance(m, produced) for m in model.modules())
    trainer.save_checkpoint(tmp_path / "surgery.ckpt")

    fresh = make_model()
    again = quiet_trainer(precision="bf16-mixed", callbacks=[AlgorithmEngineCallback([eval(repr(algorithm))])])
    again.validate(fresh, make_loader(), ckpt_path=tmp_path / "surgery.ckpt", verbose=False)
    assert_same_weights(weights_of(fresh), weights_of(model))


@pytest.mark.parametrize("name", list(CASES))
def test_the_model_after_surgery_exports_with_torch_export(name: str) -> None:
    make_algorithm, make_model, make_loader, _ = CASES[name]
    module = make_model()
    net = module.gpt if isinstance(module, GPTLanguageModel) else module.module
    example = next(iter(make_loader()))[0][:2]
    state = State(net, seed=0, precision="bf16-mixed", max_duration="2ba")
    make_algorithm().apply(Event.INIT, state, Logger())
    net.eval()
    exported = torch.export.export(net, (example,))
    torch.testing.assert_close(exported.module()(example), net(example))


def test_surgery_before_optimizers_makes_fit_resume_without_mismatched_optimizer_state(tmp_path: Path) -> None:
    def run(epochs: int, ckpt: Path | None) -> Any:
        model = tiny_classifier()
        algorithms = [SqueezeExcite(latent_channels=0.5, min_channels=8), Factorize(min_channels=8, min_features=4)]
        trainer = quiet_trainer(max_epochs=epochs, limit_train_batches=2,
                                callbacks=[AlgorithmEngineCallback(algorithms, seed=0)])
        trainer.fit(model, image_loader(), ckpt_path=ckpt)
        return model, trainer

    full, _ = run(2, None)
    _, half = run(1, None)
    half.save_checkpoint(tmp_path / "half.ckpt")
    resumed, _ = run(2, tmp_path / "half.ckpt")
    assert_same_weights(weights_of(resumed), weights_of(full))


DDP_SCRIPT = """
import torch
import lightning as L
from helpers.support import image_loader, quiet_trainer, tiny_classifier
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import BlurPool, SqueezeExcite, StochasticDepth

class SeeDDP(L.Callback):
    def on_train_start(self, trainer, pl_module):
        self.unused = bool(trainer.strategy.model.find_unused_parameters)

L.seed_everything(0)
see = SeeDDP()
algorithms = [BlurPool(min_channels=4), SqueezeExcite(latent_channels=0.5, min_channels=8),
              StochasticDepth(drop_rate=0.5, drop_distribution="uniform")]
callback = AlgorithmEngineCallback(algorithms)
trainer = quiet_trainer(strategy="ddp", devices=2, max_steps=4, callbacks=[callback, see])
model = tiny_classifier()
trainer.fit(model, image_loader(n=64, batch_size=8))
torch.save({"weights": {k: v.detach() for k, v in model.named_parameters()},
            "classes": sorted({type(m).__name__ for m in model.modules()}),
            "unused": see.unused}, f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_ddp_two_processes_with_surgery_and_block_stochastic_depth_end_identical(tmp_path: Path) -> None:
    ranks = saved_by_each_rank(DDP_SCRIPT, tmp_path)
    for out in ranks:
        assert out["unused"] is True  # StochasticDepth's block mode asked for it
        assert {"BlurConv2d", "SqueezeExciteConv2d", "StochasticBlock"} <= set(out["classes"])
    assert ranks[0]["weights"].keys() == ranks[1]["weights"].keys()
    for key, value in ranks[0]["weights"].items():
        assert torch.equal(value, ranks[1]["weights"][key]), key


def test_cases_cover_every_surgery_algorithm() -> None:
    import composer_bridge.algorithms as library
    from composer_bridge.algorithms import SurgeryAlgorithm

    surgery = {n for n in library.__all__ if issubclass(getattr(library, n), SurgeryAlgorithm)}
    assert surgery == set(CASES)
