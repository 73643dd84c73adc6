"""Muon: a Trainer run with the user's unchanged configure_optimizers equals a hand loop with torch.optim.Muon."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import (
    L,
    assert_same_state,
    assert_same_weights,
    image_loader,
    quiet_trainer,
    weights_of,
)
from helpers.two_processes import assert_ranks_train_as_one_process, saved_by_each_rank

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import SAM, Muon
from composer_bridge.core import torch_versions
from composer_bridge.functional import muon_parameters
from composer_bridge.models import GPT

pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch>=2.9")

MUON = {"lr": 0.02, "weight_decay": 0.01}


def mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 4))


def schedule(step: int) -> float:
    return 1.0 / (1.0 + step)


class UserModule(L.LightningModule):
    """What a user writes: AdamW on every parameter and a LambdaLR, nothing about Muon."""

    def __init__(self, scheduler: bool = True) -> None:
        super().__init__()
        self.net = mlp()
        self.with_scheduler = scheduler

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.05)
        if not self.with_scheduler:
            return optimizer
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def hand_loop(steps: int, batch_size: int = 16) -> torch.nn.Module:
    """The reference: torch.optim.Muon on the hidden matrices, AdamW on the rest, Muon's lr on AdamW's schedule."""
    net = mlp()
    hidden = [net[1].weight, net[3].weight]
    rest = [p for p in net.parameters() if all(p is not h for h in hidden)]
    adamw = torch.optim.AdamW(rest, lr=1e-2, weight_decay=0.05)
    muon = torch.optim.Muon(hidden, **MUON)
    scheduler = torch.optim.lr_scheduler.LambdaLR(adamw, schedule)
    batches = iter(image_loader(n=64, batch_size=batch_size))
    for step in range(steps):
        x, y = next(batches)
        adamw.zero_grad()
        muon.zero_grad()
        F.cross_entropy(net(x), y).backward()
        muon.param_groups[0]["lr"] = MUON["lr"] * schedule(step)
        adamw.step()
        muon.step()
        scheduler.step()
    return net


def test_muon_parameters_are_the_hidden_linear_weights_not_the_embeddings_or_the_tied_head() -> None:
    assert [n for n, _ in muon_parameters(mlp())] == ["1.weight", "3.weight"]
    gpt = GPT(vocab_size=16, block_size=8, d_model=8, n_layers=2, n_heads=2)
    names = [n for n, _ in muon_parameters(gpt)]
    assert names and all(n.startswith("blocks.") and n.endswith(".weight") for n in names)
    assert not any(n.startswith(("head", "tok_emb", "pos_emb")) for n in names)
    assert len(names) == 2 * 4  # qkv, proj, fc1, fc2 per block


def test_a_trainer_run_equals_the_hand_loop_with_torch_muon() -> None:
    model = UserModule()
    callback = AlgorithmEngineCallback([Muon(**MUON)])
    quiet_trainer(max_steps=4, max_epochs=-1, callbacks=[callback]).fit(model, image_loader(n=64, batch_size=16))
    reference = hand_loop(4)
    assert_same_weights(weights_of(reference), weights_of(model.net))
    traced = {t.event.name for step in callback.traces for t in callback.traces[step] if t.name == "Muon"}
    assert traced == {"INIT", "FIT_START"}
    assert {r.algorithm for r in callback.cost_report().rows} == {"Muon"}


def test_without_muon_the_run_differs_from_the_hand_loop() -> None:
    """The oracle can tell: plain AdamW on everything is not the Muon run."""
    model = UserModule()
    quiet_trainer(max_steps=4, max_epochs=-1).fit(model, image_loader(n=64, batch_size=16))
    reference = hand_loop(4)
    assert not torch.equal(reference[1].weight, model.net[1].weight)


def test_the_checkpoint_holds_both_states_and_a_resumed_run_ends_equal(tmp_path: Path) -> None:
    def run(ckpt: Path | None = None, save: bool = False) -> tuple[Any, Any]:
        callbacks: list[Any] = [AlgorithmEngineCallback([Muon(**MUON)], seed=1)]
        if save:
            callbacks.append(L.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1))
        model = UserModule()
        trainer = quiet_trainer(max_epochs=3, limit_train_batches=3, callbacks=callbacks, enable_checkpointing=save)
        trainer.fit(model, image_loader(n=48, batch_size=16), ckpt_path=ckpt)
        return model, trainer

    full, full_trainer = run(save=True)
    first = tmp_path / "epoch=0-step=3.ckpt"
    saved = torch.load(first, weights_only=True)["optimizer_states"][0]
    assert set(saved) == {"optimizer", "muon"} and saved["muon"]["state"], "both optimizers' states are saved"
    resumed, resumed_trainer = run(ckpt=first)
    assert_same_weights(weights_of(full), weights_of(resumed))
    assert_same_state(full_trainer.optimizers[0].state_dict(), resumed_trainer.optimizers[0].state_dict(), "optimizer")


def test_muon_takes_torchs_argument_names_and_defaults() -> None:
    ours = inspect.signature(Muon.__init__).parameters
    torchs = inspect.signature(torch.optim.Muon.__init__).parameters
    theirs = [n for n in torchs if n not in ("self", "params")]
    # torch's arguments first, in its order and with its defaults; then the variants' options, off by default
    assert [n for n in ours if n != "self"] == [*theirs, "normuon", "normuon_beta2", "cautious_weight_decay"]
    assert {n: ours[n].default for n in theirs} == {n: torchs[n].default for n in theirs}
    with pytest.raises(ValueError, match=r"Muon\(lr=-1\)"):
        Muon(lr=-1)


def refused(algorithms: list[Any], match: str, model: Any = None) -> None:
    callback = AlgorithmEngineCallback(algorithms)
    with pytest.raises(Exception, match=match):
        quiet_trainer(max_steps=1, max_epochs=-1, callbacks=[callback]).fit(model or UserModule(), image_loader(n=32))


def test_refusals_name_the_reason_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    refused([Muon(), SAM()], "Muon and SAM cannot run together")

    class TwoOptimizers(UserModule):
        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(self.net[:3].parameters(), lr=0.1), torch.optim.SGD(self.net[3:].parameters(), lr=0.1)]

        def training_step(self, batch: Any, batch_idx: int) -> None:
            return None

        automatic_optimization = False

    refused([Muon()], "takes over one optimizer; configure_optimizers returned 2", TwoOptimizers())
    monkeypatch.setattr(torch_versions, "at_least", lambda version: False)
    refused([Muon()], r"Muon \(torch.optim.Muon\) needs torch>=2.9")


DDP_SCRIPT = """
import os, torch
from helpers.support import ResumableLoader, image_dataset, quiet_trainer
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import Muon
from algorithms.test_muon import MUON, UserModule

model = UserModule()
trainer = quiet_trainer(strategy="ddp", devices=2, max_steps=3, max_epochs=-1, use_distributed_sampler=False,
                        callbacks=[AlgorithmEngineCallback([Muon(**MUON)])])
# rank r trains on rows r, r + 2, ...: each step's two half-batches are the single run's batch of 16
rank = int(os.environ.get("LOCAL_RANK", 0))
trainer.fit(model, ResumableLoader(image_dataset(n=64), batch_size=8, rank=rank, world_size=2))
torch.save({k: v.detach() for k, v in model.named_parameters()}, f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_ddp_two_processes_stay_equal_and_match_one_process_on_the_whole_batch(tmp_path: Path) -> None:
    ranks = saved_by_each_rank(DDP_SCRIPT, tmp_path)
    assert_ranks_train_as_one_process(ranks, hand_loop(3, batch_size=16), prefix="net.")  # both half-batches


def test_a_model_sharded_by_fsdp2_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import composer_bridge.algorithms.muon as muon_module

    monkeypatch.setattr(muon_module, "is_dtensor", lambda tensor: True)  # what fully_shard leaves: DTensor parameters
    refused([Muon()], "Muon cannot train a model sharded by FSDP2 .* each rank holds only a shard. Use DDP")


@pytest.mark.parametrize("muon_first", [False, True])
def test_muons_learning_rate_follows_warmup_stable_decay_like_the_users_optimizer(muon_first: bool) -> None:
    from composer_bridge.algorithms import WarmupStableDecay
    from composer_bridge.functional import wsd_multiplier

    class Record(L.Callback):
        def __init__(self) -> None:
            self.lrs: list[list[float]] = []

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:  # after the step: the rates it used
            self.lrs.append([group["lr"] for group in trainer.optimizers[0].param_groups])

    record = Record()
    algorithms = [WarmupStableDecay(warmup="2ba", decay="3ba", shape="linear"), Muon(**MUON)]
    algorithms = algorithms[::-1] if muon_first else algorithms
    quiet_trainer(max_steps=8, max_epochs=-1, callbacks=[AlgorithmEngineCallback(algorithms), record]).fit(
        UserModule(scheduler=False), image_loader(n=64, batch_size=8))
    factors = [wsd_multiplier(s, 8, 2, 3, "linear") for s in range(8)]
    assert [lrs[0] for lrs in record.lrs] == pytest.approx([1e-2 * f for f in factors], rel=1e-12)
    assert [lrs[-1] for lrs in record.lrs] == pytest.approx([MUON["lr"] * f for f in factors], rel=1e-12)
