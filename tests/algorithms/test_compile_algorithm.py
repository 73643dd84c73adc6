"""Compile: torch.compile in place after every surgery; checkpoints keep their keys; training numerics unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import L, assert_same_weights, quiet_trainer, weights_of
from helpers.tolerances import assert_float32_runs_near_float64
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import Compile, QKNorm
from composer_bridge.models import GPT

VOCAB, SEQ = 16, 8


class TokenModule(L.LightningModule):
    """A plain module holding its network in ``self.gpt``, as users write it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gpt = GPT(vocab_size=VOCAB, block_size=SEQ, d_model=16, n_layers=1, n_heads=2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.gpt(x).flatten(0, 1), y.flatten())

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def loader() -> DataLoader:
    tokens = torch.randint(0, VOCAB, (32, SEQ + 1), generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=8)


def fit(algorithms: list[Any], steps: int = 4, module: TokenModule | None = None,
        **kwargs: Any) -> tuple[TokenModule, AlgorithmEngineCallback, Any]:
    module = module or TokenModule()
    callback = AlgorithmEngineCallback(algorithms, seed=0)
    trainer = quiet_trainer(max_steps=steps, max_epochs=-1, callbacks=[callback], **kwargs)
    trainer.fit(module, loader())
    return module, callback, trainer


def test_it_compiles_after_every_surgery_even_when_listed_first() -> None:
    module, callback, _ = fit([Compile(backend="eager"), QKNorm()])
    order = {t.name: t.order for step in callback.traces for t in callback.traces[step] if t.event.name == "INIT"}
    assert order["Compile"] > order["QKNorm"]  # the default passes put it last
    assert getattr(module.gpt, "_compiled_call_impl", None) is not None
    assert "gpt.blocks.0.attn.qkv.q_norm.weight" in module.state_dict()  # QKNorm's surgery, under the original keys


def test_training_with_the_eager_backend_equals_training_without_it() -> None:
    compiled, _, _ = fit([Compile(backend="eager"), QKNorm()])
    plain, _, _ = fit([QKNorm()])
    assert_same_weights(weights_of(plain), weights_of(compiled))


def test_a_checkpoint_keeps_the_uncompiled_keys_and_loads_into_a_plain_module(tmp_path: Path) -> None:
    module, _, trainer = fit([Compile(backend="eager")], default_root_dir=tmp_path)
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    state = torch.load(tmp_path / "c.ckpt", weights_only=True)["state_dict"]
    assert not any("_orig_mod" in k for k in state)
    plain = TokenModule()
    plain.load_state_dict(state)
    assert_same_weights(weights_of(plain), weights_of(module))


class SGDTokenModule(TokenModule):
    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=LR)


LR, STEPS = 0.5, 2
# The bound: what float32 rounding may change (helpers/tolerances.py). The compiled and the eager run round
# differently (inductor fuses and reorders sums; its vector width, like ATen's, follows the CPU). Each step's gradient
# is a chain of float32 sums of about REDUCTIONS terms end to end (LayerNorms 3 x 16, qkv 16, scores 8, softmax 8,
# attention 8, proj 16, fc1 16, fc2 64, head 16, cross-entropy 16, the mean and the weight gradients over 64 tokens;
# the backward pass as much again), each off by at most its length x eps x the magnitudes summed, no bigger than the
# largest gradient. SGD moves a weight by LR x its gradient, so a weight is off by at most REDUCTIONS x eps x the
# run's largest move, plus one ulp of the weight a step. Both runs are held to it against a float64 run. (With AdamW
# the bound would be lr / eps_adam = 1e6 times the gradient's rounding: the attention's key bias has an exactly zero
# gradient, softmax ignoring a shift shared by all keys, and AdamW moved it by its rounding noise / eps_adam, 1.26e-5
# on one CPU, 9e-6 on another. Measured here: both runs within 2 % of the bound on every width; a compiled graph
# whose GELU is scaled by 1 + 1e-3 is 3 x over it.)
REDUCTIONS = 600


def test_inductor_trains_like_eager() -> None:
    start = weights_of(SGDTokenModule())
    compiled, _, _ = fit([Compile()], steps=STEPS, module=SGDTokenModule())
    plain, _, _ = fit([], steps=STEPS, module=SGDTokenModule())
    exact, _, _ = fit([], steps=STEPS, module=SGDTokenModule(), precision="64-true")  # the reference, in float64
    assert_float32_runs_near_float64({"inductor": weights_of(compiled), "eager": weights_of(plain)}, weights_of(exact),
                                     start, REDUCTIONS, STEPS)


def test_a_module_without_submodules_is_refused_with_the_fix() -> None:
    class Flat(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4, 2))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return (batch[0] @ self.weight).square().mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = quiet_trainer(max_steps=1, max_epochs=-1, callbacks=[AlgorithmEngineCallback([Compile(backend="eager")])])
    with pytest.raises(Exception, match=r"finds no submodule to compile in Flat.*Put the network in a submodule"):
        trainer.fit(Flat(), DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4))


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"Compile\(mode='fast'\)"):
        Compile(mode="fast")
    with pytest.raises(ValueError, match=r"Compile\(backend=''\)"):
        Compile(backend="")
