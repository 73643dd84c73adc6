"""Compile: torch.compile in place after every surgery; checkpoints keep their keys; training numerics unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import L, assert_same_weights, quiet_trainer, weights_of
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
# How far float32 rounding may move a weight (the compiled and the eager run round differently: inductor fuses and
# reorders the sums, and its vector width, like ATen's, depends on the CPU). Each step's gradient is a chain of float32
# sums whose lengths add up, forward and backward, to about REDUCTIONS (embeddings 16, LayerNorms 3 x 16, qkv 16,
# scores 8, softmax 8, attention 8, proj 16, fc1 16, fc2 64, head 16, cross-entropy 16, mean over 64 tokens, the
# weight gradients' 64 tokens; twice for the backward pass); each sum is off by at most its length x eps, relative to
# the magnitudes summed, which are no bigger than the largest gradient. SGD moves a weight by LR x its gradient, so
# after STEPS steps a weight is off by at most REDUCTIONS x eps x (the largest move of the run) plus the rounding of
# the weight itself, one ulp a step. (Not AdamW: it divides each gradient by its own size, so the key bias, whose
# gradient is exactly zero (softmax ignores a shift shared by all keys), moves by its rounding noise x lr / eps_adam,
# a millionfold; that is how 1.26e-5 came out of two runs that both computed what they should.)
REDUCTIONS = 600


def test_inductor_trains_like_eager() -> None:
    start = weights_of(SGDTokenModule())
    compiled, _, _ = fit([Compile()], steps=STEPS, module=SGDTokenModule())
    plain, _, _ = fit([], steps=STEPS, module=SGDTokenModule())
    exact, _, _ = fit([], steps=STEPS, module=SGDTokenModule(), precision="64-true")  # the reference, in float64
    eps = torch.finfo(torch.float32).eps
    largest_move = max((exact_w - start[k].double()).abs().max().item() for k, exact_w in weights_of(exact).items())
    for run, weights in (("inductor", weights_of(compiled)), ("eager", weights_of(plain))):
        for name, reference in weights_of(exact).items():
            bound = REDUCTIONS * eps * largest_move + STEPS * eps * reference.abs()
            off = (weights[name].double() - reference).abs()
            assert (off <= bound).all(), f"{run} {name}: off by {off.max():.3g}, {(off / bound).max():.3g} x the bound"


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
