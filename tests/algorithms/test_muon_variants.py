"""Muon's variants (Polar Express coefficients, NorMuon, cautious weight decay): each against its algorithm written
out here from the paper, the plain case bit for bit against torch.optim.Muon, and through the callback."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import L, assert_same_weights, image_loader, quiet_trainer, weights_of

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import Muon
from composer_bridge.algorithms._muon_variants import POLAR_EXPRESS, MuonVariants

pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch>=2.9")


def newton_schulz(g: torch.Tensor, triples: list[tuple[float, float, float]], norm_factor: float) -> torch.Tensor:
    """The orthogonalisation as the papers write it: X / (|X| * f), then X <- aX + (bA + cA^2)X, A = XX^T, one
    (a, b, c) per iteration; in bfloat16 with torch.optim.Muon's grouping of the products (addmm), so that only
    the method, not the rounding of another grouping, is compared."""
    x = g.bfloat16()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (x.norm() * norm_factor).clamp(min=1e-7)
    addmm = torch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))]).defaults.get("use_addmm", True)  # as torch groups them
    for a, b, c in triples:
        gram = x @ x.T
        if addmm:
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)  # aX + (bA + cA^2)X
        else:
            x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def reference_step(p: torch.Tensor, g: torch.Tensor, state: dict[str, Any], *, lr: float, wd: float, triples: list,
                   norm_factor: float = 1.0, normuon: bool = False, beta2: float = 0.95, cautious: bool = False) -> None:
    """One Muon step, the variants written out: Nesterov momentum, orthogonalise, NorMuon, (cautious) decay, update."""
    buf = state.setdefault("m", torch.zeros_like(g))
    buf.lerp_(g, 0.05)  # Nesterov momentum 0.95, as torch.optim.Muon writes it
    update = newton_schulz(g.lerp(buf, 0.95), triples, norm_factor)
    if normuon:  # each output neuron (row) divided by its running RMS, the whole rescaled to the norm it had
        o = update.float()
        v = state.setdefault("v", torch.zeros(g.shape[0]))
        v.mul_(beta2).add_((o**2).mean(dim=1), alpha=1 - beta2)
        normalised = o / (v.sqrt() + 1e-8)[:, None]
        update = (normalised * (o.norm() / normalised.norm())).to(update.dtype)
    if cautious:  # decay only where the update and the weight agree in sign
        p.sub_(lr * wd * p * (update * p >= 0))
    else:
        p.mul_(1 - lr * wd)
    p.add_(update, alpha=-lr * math.sqrt(max(1, p.shape[0] / p.shape[1])))


CASES = {
    "polar_express": ({"ns_coefficients": "polar_express"}, {"triples": list(POLAR_EXPRESS), "norm_factor": 1.01}),
    "normuon": ({"normuon": True}, {"triples": [(3.4445, -4.775, 2.0315)] * 5, "normuon": True}),
    "cautious": ({"cautious_weight_decay": True}, {"triples": [(3.4445, -4.775, 2.0315)] * 5, "cautious": True}),
    "all three": ({"ns_coefficients": "polar_express", "normuon": True, "cautious_weight_decay": True},
                  {"triples": list(POLAR_EXPRESS), "norm_factor": 1.01, "normuon": True, "cautious": True}),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("shape", [(12, 8), (8, 12)])
def test_each_variant_follows_its_algorithm_written_out(name: str, shape: tuple[int, int]) -> None:
    options, written = CASES[name]
    torch.manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(*shape))
    theirs = ours.detach().clone()
    optimizer = MuonVariants([ours], lr=0.02, weight_decay=0.1, **options)
    state: dict[str, Any] = {}
    for _ in range(4):
        g = torch.randn(*shape)
        ours.grad = g.clone()
        optimizer.step()
        with torch.no_grad():
            reference_step(theirs, g, state, lr=0.02, wd=0.1, **written)
    torch.testing.assert_close(ours.detach(), theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(CASES))
def test_each_variant_changes_the_step_the_oracle_can_tell(name: str) -> None:
    options, _ = CASES[name]
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(12, 8))
    b = torch.nn.Parameter(a.detach().clone())
    plain, variant = torch.optim.Muon([a], lr=0.02, weight_decay=0.1), MuonVariants([b], lr=0.02, weight_decay=0.1, **options)
    for _ in range(3):
        g = torch.randn(12, 8)
        a.grad, b.grad = g.clone(), g.clone()
        plain.step()
        variant.step()
    assert (a - b).abs().max() > 1e-3


def test_without_a_variant_it_is_torch_muon_bit_for_bit() -> None:
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(12, 8))
    b = torch.nn.Parameter(a.detach().clone())
    plain = torch.optim.Muon([a], lr=0.02, weight_decay=0.1)
    ours = MuonVariants([b], lr=0.02, weight_decay=0.1, ns_coefficients=[(3.4445, -4.775, 2.0315)] * 5)
    for _ in range(3):
        g = torch.randn(12, 8)
        a.grad, b.grad = g.clone(), g.clone()
        plain.step()
        ours.step()
    assert torch.equal(a, b)


class UserModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def test_the_algorithm_builds_the_variant_and_resumes_its_state(tmp_path) -> None:
    options = {"lr": 0.02, "ns_coefficients": "polar_express", "normuon": True, "cautious_weight_decay": True}

    def run(ckpt=None, save=False):
        callbacks: list[Any] = [AlgorithmEngineCallback([Muon(**options)], seed=1)]
        if save:
            callbacks.append(L.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1))
        model = UserModule()
        trainer = quiet_trainer(max_epochs=3, limit_train_batches=3, callbacks=callbacks, enable_checkpointing=save)
        trainer.fit(model, image_loader(n=48, batch_size=16), ckpt_path=ckpt)
        return model, trainer

    full, trainer = run(save=True)
    assert isinstance(trainer.optimizers[0].muon, MuonVariants)
    saved = torch.load(tmp_path / "epoch=0-step=3.ckpt", weights_only=True)["optimizer_states"][0]["muon"]
    assert all("neuron_mean_square" in s for s in saved["state"].values())  # NorMuon's state is checkpointed
    resumed, _ = run(ckpt=tmp_path / "epoch=0-step=3.ckpt")
    assert_same_weights(weights_of(full), weights_of(resumed))


def test_bad_variant_options_are_refused_naming_the_value() -> None:
    with pytest.raises(ValueError, match=r"ns_coefficients='fast'.*polar_express"):
        Muon(ns_coefficients="fast")
    with pytest.raises(ValueError, match=r"normuon='yes'"):
        Muon(normuon="yes")
    with pytest.raises(ValueError, match=r"normuon_beta2=1.5"):
        Muon(normuon=True, normuon_beta2=1.5)
