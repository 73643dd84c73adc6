"""Muon on conv nets (filters flattened to out x in*k) and on GPT-2's transformers Conv1D (seen as out x in):
a Trainer run with the user's unchanged configure_optimizers equals a hand loop that gives torch.optim.Muon
contiguous copies of those matrices and writes its updates back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import L, assert_same_state, assert_same_weights, image_loader, quiet_trainer, weights_of
from torch.utils.data import DataLoader

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import Muon
from composer_bridge.algorithms.muon import muon_matrices
from composer_bridge.models import ResNetCNN

pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch>=2.9")

MUON = {"lr": 0.02, "weight_decay": 0.01}


def convnet() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),   # the stem: the input layer
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),                          # hidden: 16 x 72
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=4), torch.nn.ReLU(),               # grouped: 16 x 36
        torch.nn.Conv2d(16, 12, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),  # 1x1: 12 x 16
        torch.nn.Linear(12, 4))                                                         # the head: the output layer


def gpt2() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    return transformers.GPT2LMHeadModel(config)


def schedule(step: int) -> float:
    return 1.0 / (1.0 + step)


class UserModule(L.LightningModule):
    """What a user writes: AdamW on every parameter and a LambdaLR, nothing about Muon."""

    def __init__(self, build: Any) -> None:
        super().__init__()
        self.net = build()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if isinstance(batch, dict):
            return self.net(**batch).loss
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.05)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def token_loader() -> DataLoader:
    tokens = torch.randint(0, 32, (48, 16), generator=torch.Generator().manual_seed(0))
    return DataLoader([{"input_ids": t, "labels": t} for t in tokens], batch_size=16)


def hand_loop(build: Any, loader: DataLoader, steps: int, hidden: dict[str, str]) -> torch.nn.Module:
    """torch.optim.Muon on contiguous copies of the hidden matrices (``hidden``: name -> how to see it), AdamW on the rest."""
    net = build()
    params = dict(net.named_parameters())
    to_matrix = {"flattened": lambda t: t.reshape(t.shape[0], -1), "transposed": lambda t: t.t(), "linear": lambda t: t}
    copies = {name: torch.nn.Parameter(to_matrix[how](params[name].detach()).clone()) for name, how in hidden.items()}
    rest = [p for name, p in net.named_parameters() if name not in hidden]
    adamw = torch.optim.AdamW(rest, lr=1e-2, weight_decay=0.05)
    muon = torch.optim.Muon(list(copies.values()), **MUON)
    scheduler = torch.optim.lr_scheduler.LambdaLR(adamw, schedule)
    batches = iter(loader)
    for step in range(steps):
        batch = next(batches)
        net.zero_grad()
        loss = net(**batch).loss if isinstance(batch, dict) else F.cross_entropy(net(batch[0]), batch[1])
        loss.backward()
        for name, copy in copies.items():
            copy.grad = to_matrix[hidden[name]](params[name].grad).clone()
        muon.param_groups[0]["lr"] = MUON["lr"] * schedule(step)
        adamw.step()
        muon.step()
        scheduler.step()
        with torch.no_grad():
            for name, copy in copies.items():
                params[name].copy_(copy.t() if hidden[name] == "transposed" else copy.view_as(params[name]))
    return net


CONV_HIDDEN = {"3.weight": "flattened", "5.weight": "flattened", "7.weight": "flattened"}


def test_muon_takes_the_hidden_convolutions_not_the_stem_or_the_head() -> None:
    assert {n: how for n, _, how in muon_matrices(convnet())} == CONV_HIDDEN
    resnet = ResNetCNN(num_classes=10, in_channels=1, widths=(8, 16))
    names = [n for n, _, _ in muon_matrices(resnet)]
    stem = next(n for n, m in resnet.named_modules() if isinstance(m, torch.nn.Conv2d))
    assert names and f"{stem}.weight" not in names and not any(n.startswith("fc") for n in names)


def test_a_conv_net_trained_with_muon_equals_the_hand_loop_on_flattened_filters() -> None:
    model = UserModule(convnet)
    trainer = quiet_trainer(max_steps=4, max_epochs=-1, callbacks=[AlgorithmEngineCallback([Muon(**MUON)])])
    trainer.fit(model, image_loader(n=64, batch_size=16))
    reference = hand_loop(convnet, image_loader(n=64, batch_size=16), 4, CONV_HIDDEN)
    assert_same_weights(weights_of(reference), weights_of(model.net))
    assert all(p.grad is not None for _, p, _ in muon_matrices(model.net))
    trainer.optimizers[0].zero_grad()  # the weights' own gradients too, or the next backward would add to them
    assert all(p.grad is None for _, p, _ in muon_matrices(model.net))


def test_gpt2_conv1d_layers_are_trained_as_out_by_in_matrices() -> None:
    net = gpt2()
    hidden = {n: how for n, _, how in muon_matrices(net)}
    assert hidden and set(hidden.values()) == {"transposed"} and len(hidden) == 2 * 4  # c_attn, c_proj, c_fc, c_proj
    assert not any("wte" in n or "wpe" in n or "lm_head" in n for n in hidden)
    model = UserModule(gpt2)
    quiet_trainer(max_steps=3, max_epochs=-1, callbacks=[AlgorithmEngineCallback([Muon(**MUON)])]).fit(
        model, token_loader())
    reference = hand_loop(gpt2, token_loader(), 3, hidden)
    for (name, ours), (_, theirs) in zip(weights_of(model.net).items(), weights_of(reference).items(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=name)


def test_the_orientation_matters_the_oracle_can_tell() -> None:
    """Muon's learning rate depends on the matrix's shape: seen as in x out, GPT-2 would train differently."""
    net = gpt2()
    hidden = {n: "linear" for n, _, _ in muon_matrices(net)}  # as stored: in x out
    model = UserModule(gpt2)
    quiet_trainer(max_steps=3, max_epochs=-1, callbacks=[AlgorithmEngineCallback([Muon(**MUON)])]).fit(
        model, token_loader())
    wrong = hand_loop(gpt2, token_loader(), 3, hidden)
    name = "transformer.h.0.mlp.c_fc.weight"  # 16 x 64 stored: the shape factor differs between orientations
    assert not torch.allclose(dict(model.net.named_parameters())[name], dict(wrong.named_parameters())[name], atol=1e-5)


def test_a_conv_net_with_muon_resumes_exactly(tmp_path: Path) -> None:
    def run(ckpt: Path | None = None, save: bool = False) -> tuple[Any, Any]:
        callbacks: list[Any] = [AlgorithmEngineCallback([Muon(**MUON)], seed=1)]
        if save:
            callbacks.append(L.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1))
        model = UserModule(convnet)
        trainer = quiet_trainer(max_epochs=3, limit_train_batches=3, callbacks=callbacks, enable_checkpointing=save)
        trainer.fit(model, image_loader(n=48, batch_size=16), ckpt_path=ckpt)
        return model, trainer

    full, full_trainer = run(save=True)
    first = tmp_path / "epoch=0-step=3.ckpt"
    assert len(torch.load(first, weights_only=True)["optimizer_states"][0]["muon"]["state"]) == 3
    resumed, resumed_trainer = run(ckpt=first)
    assert_same_weights(weights_of(full), weights_of(resumed))
    assert_same_state(full_trainer.optimizers[0].state_dict(), resumed_trainer.optimizers[0].state_dict(), "optimizer")


def test_gradient_clipping_sees_the_gradients_muon_steps() -> None:
    """Lightning clips over the optimizer's parameter groups: Muon's stand-ins must carry the gradients then."""
    model = UserModule(convnet)
    seen: list[float] = []

    class Spy(L.Callback):
        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            seen.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
            total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in pl_module.parameters()
                                                          if p.grad is not None]))
            assert abs(seen[-1] - float(total)) < 1e-5 * float(total)

    quiet_trainer(max_steps=2, max_epochs=-1, callbacks=[AlgorithmEngineCallback([Muon(**MUON)]), Spy()]).fit(
        model, image_loader(n=32, batch_size=16))
    assert len(seen) == 2




def plain_convnet() -> torch.nn.Sequential:
    """The conv net without BatchNorm, whose statistics would differ between one process and two."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 12, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(12, 4))


VARIANTS = {"ns_coefficients": "polar_express", "normuon": True, "cautious_weight_decay": True}

DDP_SCRIPT = """
import os, torch
from helpers.support import ResumableLoader, image_dataset, quiet_trainer
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import Muon
from algorithms.test_muon_reach import MUON, VARIANTS, UserModule, plain_convnet

model = UserModule(plain_convnet)
trainer = quiet_trainer(strategy="ddp", devices=2, max_steps=3, max_epochs=-1, use_distributed_sampler=False,
                        callbacks=[AlgorithmEngineCallback([Muon(**MUON, **VARIANTS)])])
rank = int(os.environ.get("LOCAL_RANK", 0))
trainer.fit(model, ResumableLoader(image_dataset(n=64), batch_size=8, rank=rank, world_size=2))
torch.save({k: v.detach() for k, v in model.named_parameters()}, f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_ddp_two_processes_train_flattened_filters_with_the_variants_as_one_process_does(tmp_path: Path) -> None:
    from helpers.two_processes import assert_ranks_train_as_one_process, saved_by_each_rank

    ranks = saved_by_each_rank(DDP_SCRIPT, tmp_path)
    single = UserModule(plain_convnet)
    quiet_trainer(max_steps=3, max_epochs=-1, callbacks=[AlgorithmEngineCallback([Muon(**MUON, **VARIANTS)])]).fit(
        single, image_loader(n=64, batch_size=16))  # each step's two half-batches together
    assert_ranks_train_as_one_process(ranks, single)
