"""Exact resumption with surgery on a Hugging Face model, and export through save_pretrained."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import transformers
from helpers.support import assert_same_state, quiet_trainer, weights_of
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from composer_bridge import AlgorithmEngineCallback, recipes
from composer_bridge.algorithms import EMA
from composer_bridge.functional import apply_alibi, apply_gated_linear_units
from composer_bridge.hf import HuggingFaceModel


def loader() -> DataLoader:
    ids = torch.randint(0, 64, (24, 24), generator=torch.Generator().manual_seed(0))
    return DataLoader([{"input_ids": row, "labels": row} for row in ids], batch_size=8)


def algorithms() -> list:
    return [*recipes.language("gpt-fast", max_seq_length=24, low_precision_layernorm=None,
                              seq_length_warmup={"duration": 0.6, "min_seq_length": 8, "step_size": 8}),
            EMA(half_life="1ba")]


def fit(model_factory, tmp_path: Path, ckpt: Path | None = None):
    module = HuggingFaceModel(model_factory())
    callback = AlgorithmEngineCallback(algorithms(), seed=5)
    save = ckpt is None
    extra = [L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1)] if save else []
    trainer = quiet_trainer(max_epochs=3, callbacks=[callback, *extra], enable_checkpointing=save)
    trainer.fit(module, loader(), ckpt_path=ckpt)
    return module, callback, trainer


def test_resuming_a_gpt2_with_surgery_equals_the_uninterrupted_run(gpt2, tmp_path):
    full, full_cb, full_trainer = fit(gpt2, tmp_path)
    first = tmp_path / "epoch=0-step=3.ckpt"
    assert first.exists(), sorted(p.name for p in tmp_path.iterdir())
    resumed, callback, trainer = fit(gpt2, tmp_path, ckpt=first)
    a, b = weights_of(full), weights_of(resumed)
    assert a.keys() == b.keys() and "model.transformer.h.0.mlp.c_fc.gated_layer.weight" in a
    for key in a:
        assert torch.equal(a[key], b[key]), f"weights differ at {key}"
    assert_same_state(full_trainer.optimizers[0].state_dict(), trainer.optimizers[0].state_dict(), "optimizer")
    for x, y in zip(full_cb.algorithms, callback.algorithms, strict=True):
        assert_same_state(x.state_dict(), y.state_dict(), type(x).__name__)


def test_save_pretrained_after_surgery_reloads_by_repeating_the_surgery(gpt2, tmp_path):
    module, _, _ = fit(gpt2, tmp_path)
    model = module.model.eval()
    model.save_pretrained(tmp_path / "export")
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(ids).logits

    # The documented way back: the saved config, the same surgery, then the saved weights.
    config = transformers.AutoConfig.from_pretrained(tmp_path / "export")
    assert config.n_positions == 24  # ALiBi wrote its max_sequence_length into the config
    again = transformers.GPT2LMHeadModel(config).eval()
    apply_alibi(again, max_sequence_length=24)
    apply_gated_linear_units(again)
    missing, unexpected = again.load_state_dict(load_file(tmp_path / "export" / "model.safetensors"), strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}  # the tied head is stored once
    assert again.lm_head.weight is again.transformer.wte.weight
    with torch.no_grad():
        assert torch.equal(again(ids).logits, expected)

    # What does not work: the stock class knows neither the gated layers nor ALiBi.
    stock = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "export").eval()
    with torch.no_grad():
        assert not torch.allclose(stock(ids).logits, expected, atol=1e-3)

