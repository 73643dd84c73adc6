"""The language recipe and the training-loop algorithms on Hugging Face models inside Lightning."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from helpers.support import quiet_trainer
from torch.utils.data import DataLoader

from composer_bridge import AlgorithmEngineCallback, recipes
from composer_bridge.algorithms import EMA, SAM, GradientClipping, LayerFreezing, SeqLengthWarmup
from composer_bridge.algorithms.gated_linear_units import GatedProjection
from composer_bridge.hf import AlibiGPT2Attention, HuggingFaceModel

SEQ = 32


def token_loader(rows: int = 24, batch_size: int = 8, seed: int = 0) -> DataLoader:
    """Hugging Face dict batches of a learnable sequence: every token is the previous one plus one."""
    starts = torch.randint(0, 64, (rows, 1), generator=torch.Generator().manual_seed(seed))
    ids = (starts + torch.arange(SEQ)) % 64
    examples = [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row} for row in ids]
    return DataLoader(examples, batch_size=batch_size)


class RecordingModel(HuggingFaceModel):
    """Remembers the sequence length of every training forward."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lengths: list[int] = []

    def forward(self, batch: Any) -> Any:
        if self.training:
            self.lengths.append(batch["input_ids"].shape[1])
        return super().forward(batch)


def test_language_recipe_trains_a_gpt2_with_one_callback(gpt2):
    module = RecordingModel(gpt2(), optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3))
    algorithms = recipes.language("gpt-fast", max_seq_length=SEQ, low_precision_layernorm=None,
                                  seq_length_warmup={"duration": 0.5, "min_seq_length": 8, "step_size": 8})
    val = token_loader(rows=8, seed=1)
    with torch.no_grad():
        untrained = torch.stack([module.loss(module(b), b) for b in val]).mean()
    module.lengths.clear()
    trainer = quiet_trainer(max_epochs=4, callbacks=[AlgorithmEngineCallback(algorithms, seed=0)])
    trainer.fit(module, token_loader(), val)
    block = module.model.transformer.h[0]
    assert isinstance(block.attn, AlibiGPT2Attention) and isinstance(block.mlp.c_fc, GatedProjection)
    assert not bool(module.model.transformer.wpe.weight.any())  # ALiBi: no position embedding learnt
    lengths = module.lengths
    assert lengths[0] == 8 and lengths[-1] == SEQ and lengths == sorted(lengths)  # SeqLengthWarmup grew them
    assert set(lengths) == {8, 16, 24, 32}
    loss = trainer.callback_metrics["val/loss"]
    assert abs(untrained - math.log(64)) < 0.2 and loss < untrained - 0.5  # 12 steps: learning, not learnt
    assert trainer.callback_metrics["val/perplexity"] == torch.exp(loss)


def test_seq_length_warmup_cuts_every_sequence_tensor_of_hf_batches(gpt2):
    seen: list[dict[str, tuple[int, ...]]] = []

    class ShapesAtLoss(HuggingFaceModel):
        def loss(self, outputs: Any, batch: Any, reduction: str = "mean") -> torch.Tensor:
            seen.append({key: tuple(value.shape) for key, value in batch.items()})
            return super().loss(outputs, batch, reduction)

    warmup = SeqLengthWarmup(duration=1.0, min_seq_length=4, max_seq_length=SEQ, step_size=4)
    trainer = quiet_trainer(max_epochs=2, callbacks=[AlgorithmEngineCallback([warmup])])
    trainer.fit(ShapesAtLoss(gpt2()), token_loader())
    assert [s["input_ids"] for s in seen] == [s["labels"] for s in seen] == [s["attention_mask"] for s in seen]
    assert seen[0]["input_ids"] == (8, 4) and seen[-1]["input_ids"][1] < SEQ


def test_sam_with_gradient_clipping_is_the_hand_written_step(gpt2):
    rho, threshold, lr = 0.05, 0.5, 0.1
    batch = next(iter(token_loader(rows=8)))
    reference = gpt2()

    def gradients(model):
        model.zero_grad()
        HuggingFaceModel(model).loss(model(**{k: v for k, v in batch.items() if k != "labels"}), batch).backward()
        return [p.grad.clone() for p in model.parameters()]

    params = list(reference.parameters())
    g = gradients(reference)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in g]))
    with torch.no_grad():
        for p, x in zip(params, g, strict=True):
            p.add_(x, alpha=rho / norm.item())  # the worst nearby point (clipping does not change the direction)
        start = [p.detach().clone() for p in gpt2().parameters()]
    g2 = gradients(reference)
    norm2 = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in g2]))
    scale = min(1.0, threshold / (norm2.item() + 1e-6))
    expected = [w - lr * scale * x for w, x in zip(start, g2, strict=True)]
    assert norm2 > threshold  # the clipping binds

    module = HuggingFaceModel(gpt2(), optimizer=lambda p: torch.optim.SGD(p, lr=lr))
    algorithms = [SAM(rho=rho, epsilon=1e-12), GradientClipping("norm", threshold)]
    trainer = quiet_trainer(max_steps=1, callbacks=[AlgorithmEngineCallback(algorithms)])
    trainer.fit(module, DataLoader([batch], batch_size=None))
    for got, want in zip(module.model.parameters(), expected, strict=True):
        assert torch.allclose(got, want, atol=1e-6)


def test_layer_freezing_freezes_hf_layers_front_to_back_and_keeps_them_fixed(gpt2):
    module = HuggingFaceModel(gpt2())
    snapshot: dict[str, torch.Tensor] = {}
    frozen_then: set[str] = set()

    class LastEpoch(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 2:
                snapshot.update({k: v.detach().clone() for k, v in pl_module.model.named_parameters()})
                frozen_then.update(k for k, v in pl_module.model.named_parameters() if not v.requires_grad)

    freezing = LayerFreezing(freeze_start=0.0, freeze_level=0.5)
    trainer = quiet_trainer(max_epochs=3, callbacks=[AlgorithmEngineCallback([freezing]), LastEpoch()])
    trainer.fit(module, token_loader())
    flags = [p.requires_grad for p in module.model.parameters()]
    frozen = flags.index(True)
    assert frozen > 0 and not any(flags[:frozen]) and all(flags[frozen:])  # a prefix: embeddings first
    assert not module.model.transformer.wte.weight.requires_grad and module.model.transformer.ln_f.weight.requires_grad
    assert frozen_then and len(frozen_then) < frozen  # more froze at the end of the last epoch
    for name, param in module.model.named_parameters():
        moved = not torch.equal(param, snapshot[name])
        assert moved == (name not in frozen_then), name  # frozen: never moved again; the rest trained on


def test_ema_averages_hf_weights_and_validation_uses_the_average(gpt2):
    module = HuggingFaceModel(gpt2())
    history: list[dict[str, torch.Tensor]] = []

    class Weights(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            history.append({k: v.detach().clone() for k, v in pl_module.named_parameters()})

    ema = EMA(half_life="1ba", update_interval="1ba")
    trainer = quiet_trainer(max_epochs=2, callbacks=[AlgorithmEngineCallback([ema]), Weights()])
    trainer.fit(module, token_loader())
    smoothing = 0.5  # half-life of one update
    expected = dict(history[0])
    for weights in history[1:]:
        expected = {k: smoothing * expected[k] + (1 - smoothing) * weights[k] for k in expected}
    averaged = ema.ema_weights
    for name, value in expected.items():
        assert torch.allclose(averaged[name], value, atol=1e-6), name

    val = token_loader(rows=8, seed=1)
    metrics = trainer.validate(module, val, verbose=False)[0]
    model = ema.get_ema_model(module)  # training weights replaced by the average
    with torch.no_grad():
        losses = [model.loss(model(b), b) for b in val]
    assert abs(metrics["val/loss"] - torch.stack(losses).mean().item()) < 1e-5


def test_selective_backprop_prunes_hf_batches_by_per_example_loss(gpt2):
    from composer_bridge.algorithms import SelectiveBackprop

    trained: list[dict[str, torch.Tensor]] = []

    class Seen(HuggingFaceModel):
        def loss(self, outputs: Any, batch: Any, reduction: str = "mean") -> torch.Tensor:
            if reduction == "mean":
                trained.append({k: v.clone() for k, v in batch.items()})
            return super().loss(outputs, batch, reduction)

    rows = next(iter(token_loader(rows=8)))["input_ids"]
    loader = DataLoader([{"input_ids": row, "labels": row} for row in rows], batch_size=8)  # no attention_mask
    selective = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, input_key="input_ids", target_key="labels")
    trainer = quiet_trainer(max_epochs=1, callbacks=[AlgorithmEngineCallback([selective], seed=0)])
    trainer.fit(Seen(gpt2()), loader)
    batch = trained[0]
    assert batch["input_ids"].shape == (4, SEQ) and torch.equal(batch["input_ids"], batch["labels"])
    assert all(any(torch.equal(row, original) for original in rows) for row in batch["input_ids"])


def test_gpt_recipe_in_bf16_mixed_puts_hf_layernorms_in_low_precision(gpt2):
    from composer_bridge.algorithms.low_precision_layernorm import LPLayerNorm

    module = HuggingFaceModel(gpt2())
    algorithms = recipes.language("gpt", max_seq_length=SEQ)  # GradientClipping, LowPrecisionLayerNorm, Alibi
    trainer = quiet_trainer(max_steps=2, precision="bf16-mixed", callbacks=[AlgorithmEngineCallback(algorithms)])
    trainer.fit(module, token_loader())
    norms = [m for m in module.model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 5 and all(isinstance(m, LPLayerNorm) for m in norms)
    assert isinstance(module.model.transformer.h[1].attn, AlibiGPT2Attention)
    assert all(torch.isfinite(p).all() for p in module.model.parameters())
