"""Sharded-training runs on 2 CPU processes (gloo), each beside its DDP oracle, in ONE process launch.

Usage (Lightning launches the second rank by re-running this script with the same arguments)::

    python tests/helpers/fsdp_runs.py OUT_DIR [CASE ...]

For every case it trains the same seeded model on the same data twice, under ``strategy="ddp"``
and under FSDP2 (``ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)``, with
``fully_shard`` applied in ``configure_model``), and records on every rank: the final parameters
(gathered full tensors), the gradient norms before and after the bridge's ``on_before_optimizer_step``
(GradientClipping's clipped norm), EMA/SWA averages (gathered), and each rank's random draws.
Further sections: checkpoint resumption (sharded and full state dict; mid-epoch, and at an epoch's
last batch beside plain Lightning), refusal of surgery on an already sharded model, rank-zero-only
traces. Results: ``OUT_DIR/rank{R}.pt`` (written after every
case, so a crash leaves what ran before it), read by ``tests/lightning/test_fsdp2.py``.

All runs share one 2-process group: Lightning initialises it at the first fit and every later
Trainer (DDP or ModelParallelStrategy) reuses it.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import AlgorithmEngineCallback, ComposerClassifier, ComposerModule
from composer_bridge.algorithms import (
    EMA,
    SAM,
    SWA,
    Alibi,
    AugMix,
    BatchSizeWarmup,
    BlurPool,
    ChannelsLast,
    ColOut,
    CutMix,
    CutOut,
    Factorize,
    GatedLinearUnits,
    GhostBatchNorm,
    GradientClipping,
    GyroDropout,
    LabelSmoothing,
    LayerFreezing,
    LowPrecisionGroupNorm,
    LowPrecisionLayerNorm,
    MixUp,
    ProgressiveResizing,
    QKNorm,
    RandAugment,
    SelectiveBackprop,
    SeqLengthWarmup,
    SqueezeExcite,
    StochasticDepth,
    WeightStandardization,
    ZLoss,
)
from composer_bridge.models import GPT, ResNetCNN
from helpers.support import ResumableLoader, image_dataset

VOCAB, SEQ = 16, 8
#: the classifiers' outputs: 5 rows do not split evenly over 2 ranks (FSDP2 pads the last shard)
CLASSES = 5
STEPS = 4


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (a collective for a DTensor; all ranks must call it)."""
    from torch.distributed.tensor import DTensor

    tensor = tensor.detach()
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).clone().cpu()


def _full_dict(tensors: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    return None if tensors is None else {k: _full(v) for k, v in sorted(tensors.items())}


def _global_grad_norm(module: nn.Module) -> float:
    grads = [_full(p.grad) for p in module.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


class ShardMixin:
    """``configure_model``: FSDP2 on every Linear/Conv, then on the whole network (only under ModelParallelStrategy)."""

    net_attribute = "module"

    def configure_model(self) -> None:
        # what the model looks like when Lightning asks for sharding: surgery (the bridge's INIT) already done?
        net = getattr(self, self.net_attribute)
        self.classes_at_configure_model = sorted({type(m).__name__ for m in net.modules()})
        mesh = self.device_mesh  # type: ignore[attr-defined]
        if mesh is None:  # DDP: nothing to shard
            return
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if isinstance(net, FSDPModule):  # a second fit on the same module: already sharded
            return
        owners: dict[int, int] = {}  # tied weights (GPT's head and embedding) stay in the root's group
        for module in net.modules():
            for param in module.parameters(recurse=False):
                owners[id(param)] = owners.get(id(param), 0) + 1
        layers = [m for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv2d)) and m is not net]
        for module in [m for m in layers if all(owners[id(p)] == 1 for p in m.parameters(recurse=False))]:
            fully_shard(module, mesh=mesh["data_parallel"])
        fully_shard(net, mesh=mesh["data_parallel"])

    # gradient norms seen by the module: after backward (before clipping) and after the callbacks'
    # on_before_optimizer_step (after GradientClipping), the global norm over full gradients
    def on_after_backward(self) -> None:
        self.norms_before.append(_global_grad_norm(self))  # type: ignore[attr-defined,arg-type]

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.norms_after.append(_global_grad_norm(self))  # type: ignore[attr-defined,arg-type]


def _net(kind: str) -> nn.Module:
    if kind == "groupnorm":
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(8, CLASSES))
    if kind == "dropout":
        return nn.Sequential(nn.Flatten(), nn.Linear(192, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, CLASSES))
    return ResNetCNN(num_classes=CLASSES, in_channels=3, widths=(8, 16), blocks_per_stage=1)


class Classifier(ShardMixin, ComposerClassifier):
    def __init__(self, net: str = "resnet") -> None:
        torch.manual_seed(0)
        super().__init__(_net(net), num_classes=CLASSES, optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
        self.norms_before: list[float] = []
        self.norms_after: list[float] = []
        self.train_inputs: list[float] = []  # what each training forward sees (after the batch algorithms)
        self.eval_outputs: list[float] = []  # what each evaluation forward computes (EMA's swapped-in weights)

    def forward(self, batch: Any) -> torch.Tensor:
        outputs = super().forward(batch)
        if self.training:  # a fingerprint that mixing, cutting and pasting between images all change
            inputs = batch[0].double()
            weights = torch.arange(1, inputs.numel() + 1, dtype=torch.float64).sin().view_as(inputs)
            self.train_inputs.append(float((inputs * weights).sum()))
        else:
            self.eval_outputs.append(float(outputs.double().sum()))
        return outputs


class LanguageModel(ShardMixin, ComposerModule):
    net_attribute = "gpt"

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gpt = GPT(vocab_size=VOCAB, block_size=SEQ, d_model=16, n_layers=1, n_heads=2, dropout=0.0)
        self.norms_before: list[float] = []
        self.norms_after: list[float] = []

    def forward(self, batch: Any) -> torch.Tensor:
        return self.gpt(batch[0])

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.cross_entropy(outputs.reshape(-1, VOCAB).float(), batch[1].reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def image_loader(n: int = 64, batch_size: int = 8, size: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 3, size, size, generator=g) + y.view(-1, 1, 1, 1).float()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def unit_image_loader(n: int = 64, batch_size: int = 8) -> DataLoader:
    """Images with pixels in [0, 1] (RandAugment's on-batch form expects them)."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.rand(n, 3, 8, 8, generator=g) * 0.7 + 0.1 * y.view(-1, 1, 1, 1).float()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def token_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (32, SEQ + 1), generator=g)
    return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4)


# name -> (algorithms factory, model factory, loader factory)
Case = tuple[Callable[[], list[Any]], Callable[[], Any], Callable[[], DataLoader]]
#: Trainer options beyond the common ones, per case.
OPTIONS: dict[str, dict[str, Any]] = {
    "EMA": {"limit_val_batches": 2, "val_check_interval": 2},  # evaluation runs with the average swapped in
    "LayerFreezing": {"max_steps": 6, "max_epochs": 2},  # LayerFreezing freezes at the end of an epoch
    "LowPrecisionGroupNorm": {"precision": "bf16-mixed"},  # they change nothing without a mixed precision
    "LowPrecisionLayerNorm": {"precision": "bf16-mixed"},
}
CASES: dict[str, Case] = {
    # surgery
    "BlurPool": (lambda: [BlurPool(min_channels=2)], Classifier, image_loader),
    "SqueezeExcite": (lambda: [SqueezeExcite(latent_channels=0.5, min_channels=8)], Classifier, image_loader),
    "Factorize": (lambda: [Factorize(min_channels=8, min_features=4, latent_channels=0.5, latent_features=0.5)],
                  Classifier, image_loader),
    "GatedLinearUnits": (lambda: [GatedLinearUnits()], LanguageModel, token_loader),
    # batch / loss
    "LabelSmoothing": (lambda: [LabelSmoothing(0.1)], Classifier, image_loader),
    "MixUp": (lambda: [MixUp(alpha=0.4)], Classifier, image_loader),
    "CutMix": (lambda: [CutMix(alpha=1.0)], Classifier, image_loader),
    "CutOut": (lambda: [CutOut(length=0.5)], Classifier, image_loader),
    "ZLoss": (lambda: [ZLoss(coefficient=0.05)], Classifier, image_loader),
    # 8 examples per rank and step: 2, 4 and 6 kept over the first 3 of the 4 steps, then all 8
    "BatchSizeWarmup": (lambda: [BatchSizeWarmup(duration="3ba", initial=0.25)], Classifier, image_loader),
    # weights / optimizer / schedule
    "EMA": (lambda: [EMA(half_life="2ba")], Classifier, image_loader),
    "SWA": (lambda: [SWA(swa_start="0.25dur", swa_end="0.75dur", update_interval="1ba")], Classifier, image_loader),
    "GradientClipping-norm": (lambda: [GradientClipping("norm", 0.05)], Classifier, image_loader),
    "GradientClipping-value": (lambda: [GradientClipping("value", 0.01)], Classifier, image_loader),
    "GradientClipping-adaptive": (lambda: [GradientClipping("adaptive", 0.01)], Classifier, image_loader),
    "LayerFreezing": (lambda: [LayerFreezing(freeze_start=0.0, freeze_level=0.5)], Classifier, image_loader),
    "SAM": (lambda: [SAM(rho=0.05)], Classifier, image_loader),
    # augmentation
    "RandAugment": (lambda: [RandAugment(depth=1, severity=5)], Classifier, unit_image_loader),
    "AugMix": (lambda: [AugMix(severity=3, width=2)], Classifier, unit_image_loader),
    "ColOut": (lambda: [ColOut(p_row=0.25, p_col=0.25)], Classifier, image_loader),
    # the rest of the library
    "StochasticDepth": (lambda: [StochasticDepth(drop_rate=0.5)], Classifier, image_loader),
    "GhostBatchNorm": (lambda: [GhostBatchNorm(ghost_batch_size=4)], Classifier, image_loader),
    "WeightStandardization": (lambda: [WeightStandardization()], Classifier, image_loader),
    "LowPrecisionGroupNorm": (lambda: [LowPrecisionGroupNorm()], lambda: Classifier("groupnorm"), image_loader),
    "GyroDropout": (lambda: [GyroDropout(sigma=8, tau=2)], lambda: Classifier("dropout"), image_loader),
    "LowPrecisionLayerNorm": (lambda: [LowPrecisionLayerNorm()], LanguageModel, token_loader),
    "Alibi": (lambda: [Alibi(max_sequence_length=SEQ, train_sequence_length_scaling=0.5)], LanguageModel, token_loader),
    "QKNorm": (lambda: [QKNorm()], LanguageModel, token_loader),
    "SeqLengthWarmup": (lambda: [SeqLengthWarmup(duration=0.5, min_seq_length=4, max_seq_length=SEQ, step_size=4)],
                        LanguageModel, token_loader),
    "ProgressiveResizing": (lambda: [ProgressiveResizing(initial_scale=0.5, delay_fraction=0.0, finetune_fraction=0.0)],
                            Classifier, image_loader),
    "SelectiveBackprop": (lambda: [SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0)], Classifier,
                          image_loader),
}
#: The DDP run's algorithms where they differ from the FSDP2 run's defaults: on a sharded model
#: StochasticDepth drops the same blocks on every rank (FSDP2 gathers each block's parameters with a
#: collective all ranks must join); the oracle asks DDP for the same.
ORACLE: dict[str, Callable[[], list[Any]]] = {
    "StochasticDepth": lambda: [StochasticDepth(drop_rate=0.5, same_on_every_rank=True)],
}
#: Algorithms that may leave parameters without gradients: DDP must look for unused parameters.
UNUSED_PARAMETERS = {"LayerFreezing", "StochasticDepth"}


def algorithm_of(callback: AlgorithmEngineCallback, name: str) -> Any:
    return next(a for a in callback.algorithms if type(a).__name__ == name)


def fit(case: str, strategy_name: str, out: Path) -> dict[str, Any]:
    algorithms, make_model, make_loader = CASES[case]
    if strategy_name == "ddp":
        algorithms = ORACLE.get(case, algorithms)
    L.seed_everything(0, verbose=False)
    model = make_model()
    callback = AlgorithmEngineCallback(algorithms(), seed=0)
    if strategy_name == "fsdp2":
        strategy: Any = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    else:
        strategy = "ddp_find_unused_parameters_true" if case in UNUSED_PARAMETERS else "ddp"
    options: dict[str, Any] = dict(
        accelerator="cpu", devices=2, strategy=strategy, max_steps=STEPS, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, max_epochs=1,
        default_root_dir=str(out / "lightning"), callbacks=[callback],
    )
    options.update(OPTIONS.get(case, {}))
    trainer = L.Trainer(**options)
    started = time.perf_counter()
    val = make_loader() if options.get("limit_val_batches") else None
    trainer.fit(model, make_loader(), val)
    result: dict[str, Any] = {
        "seconds": time.perf_counter() - started,
        "params": {k: _full(v) for k, v in model.named_parameters()},
        "classes": sorted({type(m).__name__ for m in model.modules()}),
        "norms_before": list(model.norms_before),
        "norms_after": list(model.norms_after),
        "sharded": any(type(p).__name__ == "DTensor" for p in model.parameters()),
        "train_inputs": list(getattr(model, "train_inputs", [])),
        "eval_outputs": list(getattr(model, "eval_outputs", [])),
        "trainable": sorted(k for k, p in model.named_parameters() if p.requires_grad),
        "classes_at_configure_model": model.classes_at_configure_model,
    }
    names = {type(a).__name__ for a in callback.algorithms}
    if "EMA" in names:
        result["ema"] = _full_dict(algorithm_of(callback, "EMA").ema_weights)
    if "SWA" in names:
        result["swa"] = _full_dict(algorithm_of(callback, "SWA").swa_weights)
    return result


# --- checkpoints: stop after 3 of 6 steps (mid-epoch), save, resume in a fresh Trainer ---------------
def rank_loader(rank: int, batches: int = 8, batch_size: int = 4) -> ResumableLoader:
    """This rank's half of :func:`image_loader`'s images, ``batches`` fixed batches resumable mid-epoch."""
    return ResumableLoader(image_dataset(n=2 * batches * batch_size, channels=3), batch_size, rank=rank, world_size=2)


RESUME_SETS: dict[str, Callable[[], list[Any]]] = {
    "EMA+MixUp": lambda: [EMA(half_life="2ba"), MixUp(alpha=0.4)],
    "SWA+CutMix": lambda: [SWA(swa_start="0.2dur", swa_end="0.9dur", update_interval="1ba"), CutMix(alpha=1.0)],
}


def resume_run(name: str, rank: int, out: Path, sharded: bool, ckpt: Path | None = None) -> dict[str, Any]:
    """6 steps of one epoch of 8 batches; the uninterrupted run (``ckpt=None``) saves at step 3 (mid-epoch)."""
    L.seed_everything(0, verbose=False)
    model = Classifier()
    callback = AlgorithmEngineCallback(RESUME_SETS[name](), seed=0)
    mode = "sharded" if sharded else "full"
    saver = ModelCheckpoint(dirpath=out / f"{name}-{mode}", filename="at-{step}", every_n_train_steps=3, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, max_steps=6, max_epochs=1, logger=False,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, save_distributed_checkpoint=sharded),
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[callback] + ([saver] if ckpt is None else []), default_root_dir=str(out / "lightning"),
    )
    trainer.fit(model, rank_loader(rank), ckpt_path=str(ckpt) if ckpt is not None else None)
    saved = out / f"{name}-{mode}" / "at-step=3.ckpt"
    return {
        "params": {k: _full(v) for k, v in model.named_parameters()},
        "bridge": callback.state_dict(),  # whole tensors (EMA/SWA gather), positions, timestamp
        "inputs": list(model.train_inputs),
        "checkpoint": saved,
        "checkpoint_files": sorted(p.name for p in saved.iterdir()) if ckpt is None and saved.is_dir() else None,
    }


#: ``None``: plain Lightning (no bridge), the oracle of the epoch's-last-batch point
EPOCH_END_SETS: dict[str, Callable[[], list[Any]] | None] = {
    "plain": None,
    "CutOut": lambda: [CutOut(length=0.5)],
    "MixUp": lambda: [MixUp(alpha=0.4)],
}
#: (set, checkpoint mode) pairs resumed at the epoch's last batch
EPOCH_END_RUNS = [("plain", "sharded"), ("CutOut", "sharded"), ("MixUp", "sharded"), ("plain", "full"),
                  ("CutOut", "full"), ("MixUp", "full")]


def epoch_end_run(name: str, rank: int, out: Path, sharded: bool, ckpt: Path | None = None) -> dict[str, Any]:
    """2 epochs of 2 batches; the uninterrupted run (``ckpt=None``) saves at step 2, epoch 0's last batch.

    ``ModelCheckpoint(every_n_train_steps=2)`` writes in ``on_train_batch_end`` of that batch, before the
    epoch's end: the resumed fit starts in epoch 1 and the bridge closes epoch 0 itself.
    """
    L.seed_everything(0, verbose=False)
    model = Classifier()
    make = EPOCH_END_SETS[name]
    callback = AlgorithmEngineCallback(make(), seed=0) if make is not None else None
    folder = out / f"epoch-end-{name}-{'sharded' if sharded else 'full'}"
    saver = ModelCheckpoint(dirpath=folder, filename="at-{step}", every_n_train_steps=2, save_top_k=-1)
    listed = [c for c in (callback, saver if ckpt is None else None) if c is not None]
    trainer = L.Trainer(
        accelerator="cpu", devices=2, max_epochs=2, logger=False, enable_checkpointing=ckpt is None,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, save_distributed_checkpoint=sharded),
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=listed, default_root_dir=str(out / "lightning"),
    )
    trainer.fit(model, rank_loader(rank, batches=2), ckpt_path=str(ckpt) if ckpt is not None else None)
    return {
        "params": {k: _full(v) for k, v in model.named_parameters()},
        "sharded": any(type(p).__name__ == "DTensor" for p in model.parameters()),
        "bridge": callback.state_dict() if callback is not None else None,
        "inputs": list(model.train_inputs),
        "global_step": trainer.global_step,
        "checkpoint": folder / "at-step=2.ckpt",
    }


def checkpoints(rank: int, out: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in RESUME_SETS:
        for mode, sharded in (("sharded", True), ("full", False)):
            whole = results[f"{name}/{mode}/uninterrupted"] = resume_run(name, rank, out, sharded)
            results[f"{name}/{mode}/resumed"] = resume_run(name, rank, out, sharded, ckpt=whole["checkpoint"])
    started = time.perf_counter()
    for name, mode in EPOCH_END_RUNS:
        whole = results[f"epoch-end/{name}/{mode}/uninterrupted"] = epoch_end_run(name, rank, out, mode == "sharded")
        results[f"epoch-end/{name}/{mode}/resumed"] = epoch_end_run(name, rank, out, mode == "sharded",
                                                                    ckpt=whole["checkpoint"])
    results["epoch-end seconds"] = time.perf_counter() - started
    return results


# --- traces and W&B: rank zero only ------------------------------------------------------------------
class EveryRankLogger(Logger):
    """Records the metric names it is given on whichever rank it runs (unlike Lightning's rank-zero loggers)."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: set[str] = set()

    @property
    def name(self) -> str:
        return "every_rank"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.keys.update(metrics)


def traces(rank: int, out: Path) -> dict[str, Any]:
    from lightning.pytorch.loggers import WandbLogger

    L.seed_everything(0, verbose=False)
    every_rank = EveryRankLogger()
    callback = AlgorithmEngineCallback([MixUp(alpha=0.4), EMA(half_life="2ba")], seed=0, trace_mode="every_event",
                                       trace_file=str(out / "traces.txt"))
    wandb_logger = WandbLogger(project="fsdp2", save_dir=str(out), offline=True)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, max_steps=2, max_epochs=1, enable_checkpointing=False,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        logger=[wandb_logger, every_rank], log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, callbacks=[callback],
        default_root_dir=str(out / "lightning"),
    )
    trainer.fit(Classifier(), image_loader(n=32, batch_size=8))
    every_rank.log_metrics({"sentinel": 1.0})  # the logger itself records on every rank
    if rank == 0:
        import wandb

        wandb.finish()
    return {"logged_keys": sorted(every_rank.keys), "trace_counts": {k: s.count for k, s in callback.traces.stats.items()}}


# --- surgery on a model that is already sharded -----------------------------------------------------
def refusal(rank: int, out: Path) -> dict[str, Any]:
    """Fit once under FSDP2 (configure_model shards the model), then fit the same, sharded, model with BlurPool."""
    L.seed_everything(0, verbose=False)
    model = Classifier()
    common: dict[str, Any] = dict(
        accelerator="cpu", devices=2, max_steps=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        default_root_dir=str(out / "lightning"),
    )
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    L.Trainer(strategy=strategy, **common).fit(model, image_loader(n=32))
    second = L.Trainer(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
                       callbacks=[AlgorithmEngineCallback([BlurPool(min_channels=2)])], **common)
    result: dict[str, Any] = {"error": None, "channels_last_error": None}
    try:
        second.fit(model, image_loader(n=32))
    except Exception as error:  # raised on every rank at Event.INIT, before any collective
        result["error"] = f"{type(error).__name__}: {error}"
    result["classes"] = sorted({type(m).__name__ for m in model.modules()})
    fresh = Classifier()
    third = L.Trainer(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
                      callbacks=[AlgorithmEngineCallback([ChannelsLast()])], **common)
    try:
        third.fit(fresh, image_loader(n=32))
    except Exception as error:  # refused at the bridge's setup, on every rank
        result["channels_last_error"] = f"{type(error).__name__}: {error}"
    result["fresh_contiguous"] = all(p.is_contiguous() for p in fresh.parameters())
    return result


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    sections = argv[1:] or [*CASES, "checkpoints", "traces", "refusal"]
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    results: dict[str, Any] = {"cases": {}, "errors": {}}
    for name, section in (("checkpoints", checkpoints), ("traces", traces)):
        if name in sections:
            print(f"[rank {rank}] {name}", file=sys.stderr, flush=True)
            results[name] = section(rank, out)
            torch.save(results, out / f"rank{rank}.pt")
    for case in [s for s in sections if s in CASES]:
        for strategy_name in ("ddp", "fsdp2"):
            key = f"{case}/{strategy_name}"
            print(f"[rank {rank}] {key}", file=sys.stderr, flush=True)
            results["cases"][key] = fit(case, strategy_name, out)
            torch.save(results, out / f"rank{rank}.pt")
    if "refusal" in sections:  # last: it leaves a failed fit behind
        results["refusal"] = refusal(rank, out)
        torch.save(results, out / f"rank{rank}.pt")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BaseException:
        traceback.print_exc()
        raise
