"""ZLoss: z_loss against a hand computation (value and gradient), and in the real Trainer against a module that adds it itself."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import ComposerModule, L, assert_same_weights, quiet_trainer, weights_of
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import AlgorithmEngineCallback, Event, Logger, State
from composer_bridge.algorithms import ZLoss
from composer_bridge.functional import z_loss

VOCAB, SEQ, COEFFICIENT = 11, 6, 0.05  # a large coefficient, so that a missing term shows in the weights


def by_hand(logits: torch.Tensor, kept: torch.Tensor, coefficient: float) -> torch.Tensor:
    """``coefficient * mean over kept rows of log(sum(exp(row)))**2``, one row at a time (classes last)."""
    rows = [torch.log(torch.exp(row.double()).sum()) ** 2 for row, keep in zip(logits.reshape(-1, logits.shape[-1]),
                                                                              kept.reshape(-1), strict=True) if keep]
    return coefficient * torch.stack(rows).mean() if rows else torch.zeros((), dtype=torch.float64)


# --- the functional form -------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 7), (2, 7)], ids=["classifier", "sequence", "two-rows"])
def test_z_loss_and_its_gradient_match_the_hand_computation(shape: tuple[int, ...]) -> None:
    logits = (torch.randn(shape, dtype=torch.float64) * 3).requires_grad_()
    target = torch.randint(0, 7, shape[:-1])
    target.view(-1)[0] = -100
    kept = target != -100
    ours = z_loss(logits.float(), target, coefficient=0.3, class_dim=-1)
    expected = by_hand(logits, kept, 0.3)
    torch.testing.assert_close(ours.double(), expected, rtol=1e-6, atol=1e-7)
    (grad_ours,) = torch.autograd.grad(z_loss(logits, target, 0.3, class_dim=-1), logits)
    (grad_hand,) = torch.autograd.grad(by_hand(logits, kept, 0.3), logits)
    torch.testing.assert_close(grad_ours, grad_hand)
    # and the closed form: 2 c lse softmax / kept, zero at ignored positions
    lse = torch.logsumexp(logits.detach(), -1, keepdim=True)
    closed = 0.3 * 2 * lse * torch.softmax(logits.detach(), -1) / kept.sum() * kept.unsqueeze(-1)
    torch.testing.assert_close(grad_ours, closed)


def test_classes_along_dimension_one_as_cross_entropy_takes_them() -> None:
    logits = torch.randn(2, 5, 3)  # (N, C, T)
    target = torch.tensor([[1, -100, 4], [0, 2, -100]])
    moved = logits.movedim(1, -1)
    torch.testing.assert_close(z_loss(logits, target, 1.0), by_hand(moved, target != -100, 1.0).float())
    torch.testing.assert_close(z_loss(logits, target, 1.0), z_loss(moved, target, 1.0, class_dim=-1))


def test_probability_targets_leave_all_zero_rows_out_and_a_mask_does_the_same() -> None:
    logits = torch.randn(4, 3)
    soft = torch.softmax(torch.randn(4, 3), -1)
    soft[2] = 0
    kept = torch.tensor([True, True, False, True])
    torch.testing.assert_close(z_loss(logits, soft, 1.0), by_hand(logits, kept, 1.0).float())
    torch.testing.assert_close(z_loss(logits, coefficient=1.0, ignore_mask=~kept), by_hand(logits, kept, 1.0).float())
    assert float(z_loss(logits, ignore_mask=torch.ones(4, dtype=torch.bool))) == 0.0


def test_another_ignore_index_and_bf16_logits() -> None:
    logits = torch.randn(6, 9).bfloat16()
    target = torch.tensor([0, 3, 3, 1, 3, 2])
    out = z_loss(logits, target, 1.0, ignore_index=3)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, by_hand(logits.float(), target != 3, 1.0).float())


@pytest.mark.parametrize("bad", [-1e-4, math.inf, math.nan, "1e-4", True])
def test_a_coefficient_that_is_not_a_finite_non_negative_number_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=r"coefficient=.*finite number >= 0.*PaLM"):
        ZLoss(coefficient=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"coefficient"):
        z_loss(torch.zeros(2, 3), coefficient=bad)  # type: ignore[arg-type]


def test_targets_that_fit_neither_shape_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"targets of shape \(2, 7\).*expected \(2,\).*Fix"):
        z_loss(torch.zeros(2, 3), torch.zeros(2, 7, dtype=torch.long))


# --- the algorithm on the state --------------------------------------------------------------------
def test_the_algorithm_adds_the_term_of_the_forward_logits_to_the_loss_after_it() -> None:
    algorithm = ZLoss(coefficient=0.5)
    state = State(nn.Identity())
    state.batch = (torch.zeros(2, 4), torch.tensor([1, -100]))
    state.outputs = torch.randn(2, 4)
    assert algorithm.match(Event.AFTER_FORWARD, state) and algorithm.match(Event.AFTER_LOSS, state)
    assert not algorithm.match(Event.BEFORE_LOSS, state) and not algorithm.match(Event.EVAL_AFTER_FORWARD, state)
    algorithm.apply(Event.AFTER_FORWARD, state, Logger())
    state.batch = (state.batch[0], torch.tensor([[0.5, 0.5, 0, 0], [0.25] * 4]))  # LabelSmoothing at BEFORE_LOSS
    state.loss = torch.tensor(1.0)
    algorithm.apply(Event.AFTER_LOSS, state, Logger())
    expected = 1.0 + by_hand(state.outputs, torch.tensor([True, False]), 0.5)
    torch.testing.assert_close(state.loss, expected.float())


def test_ambiguous_sequence_logits_ask_for_class_dim() -> None:
    state = State(nn.Identity())
    state.batch = (torch.zeros(2), torch.zeros(2, 5, dtype=torch.long))
    state.outputs = torch.randn(2, 5, 5)  # (N, C, T) or (N, T, C): both fit targets (2, 5)
    with pytest.raises(ValueError, match=r"shape \(2, 5, 5\).*ZLoss\(class_dim=1\)"):
        ZLoss().apply(Event.AFTER_FORWARD, state, Logger())
    ZLoss(class_dim=-1).apply(Event.AFTER_FORWARD, state, Logger())


# --- in the real Trainer: equal to a module that adds the z-loss itself ---------------------------
def token_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (24, SEQ + 1), generator=g)
    targets = tokens[:, 1:].clone()
    targets[:, :2] = -100  # the first positions carry no loss (a prompt)
    return DataLoader(TensorDataset(tokens[:, :-1], targets), batch_size=8)


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, VOCAB))


def hand_z_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The z-loss written out here, independently of the library (classes last)."""
    squares = torch.logsumexp(logits.float(), dim=-1) ** 2
    kept = targets != -100
    return COEFFICIENT * squares[kept].mean()


class TokenModule(ComposerModule):
    """A ComposerModule language model: (B, T, V) logits, cross-entropy with -100 targets ignored."""

    def __init__(self, add_z_loss: bool = False) -> None:
        super().__init__()
        self.net = network()
        self.add_z_loss = add_z_loss

    def forward(self, batch: Any) -> torch.Tensor:
        return self.net(batch[0])

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        loss = F.cross_entropy(outputs.reshape(-1, VOCAB), batch[1].reshape(-1))
        return loss + hand_z_loss(outputs, batch[1]) if self.add_z_loss else loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


class PlainTokenModule(L.LightningModule):
    """A plain LightningModule: flattened logits and targets into F.cross_entropy, inline."""

    def __init__(self, add_z_loss: bool = False) -> None:
        super().__init__()
        self.net = network()
        self.add_z_loss = add_z_loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
        return loss + hand_z_loss(logits, y) if self.add_z_loss else loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


class PlainClassifier(L.LightningModule):
    """A plain classifier with a criterion submodule (no ignored positions)."""

    def __init__(self, add_z_loss: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))
        self.criterion = nn.CrossEntropyLoss()
        self.add_z_loss = add_z_loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        loss = self.criterion(logits, y)
        return loss + hand_z_loss(logits, y) if self.add_z_loss else loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def classifier_loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    return DataLoader(TensorDataset(torch.randn(24, 6, generator=g), torch.randint(0, 4, (24,), generator=g)),
                      batch_size=8)


def assert_close_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Equal up to float32 rounding: the hand module sums the kept positions in another order."""
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)


def fit(module: L.LightningModule, loader: DataLoader, callbacks: list[Any], **options: Any) -> L.LightningModule:
    trainer = quiet_trainer(max_epochs=2, callbacks=callbacks, **options)
    trainer.fit(module, loader)
    return module


CASES = {
    "composer-module": (TokenModule, token_loader),
    "plain-inline-cross-entropy": (PlainTokenModule, token_loader),
    "plain-criterion": (PlainClassifier, classifier_loader),
}


# class_dim=-1 as the language recipe ("muon-wsd") sets it: it describes a ComposerModule's (B, T, V) outputs; a plain
# module's loss call hands the bridge (B*T, V) logits, which it lays out as (B, V, T), and it must not read -1 there
@pytest.mark.parametrize("class_dim", [None, -1])
@pytest.mark.parametrize("case", list(CASES))
def test_training_with_zloss_equals_a_module_that_adds_the_z_loss_itself(case: str, class_dim: int | None) -> None:
    module_class, loader = CASES[case]
    callback = AlgorithmEngineCallback([ZLoss(coefficient=COEFFICIENT, class_dim=class_dim)])
    ours = fit(module_class(), loader(), [callback])
    hand = fit(module_class(add_z_loss=True), loader(), [])
    plain = fit(module_class(), loader(), [])
    assert_close_weights(weights_of(ours), weights_of(hand))
    changed = [k for k, v in weights_of(plain).items() if not torch.equal(v, weights_of(ours)[k])]
    assert changed, "the z-loss changed nothing: the test could not tell it apart from no z-loss"
    # traced at every micro-batch, and in the cost report
    traced = {Event(t.event) for step in callback.traces for t in callback.traces[step] if t.name == "ZLoss"}
    assert traced == {Event.AFTER_FORWARD, Event.AFTER_LOSS}
    rows = {(r.algorithm, r.event): r.calls for r in callback.cost_report().rows}
    assert rows[("ZLoss", "AFTER_LOSS")] == rows[("ZLoss", "AFTER_FORWARD")] == 6


def test_under_gradient_accumulation_each_micro_batch_gets_its_own_term() -> None:
    ours = fit(TokenModule(), token_loader(), [AlgorithmEngineCallback([ZLoss(coefficient=COEFFICIENT)])],
               accumulate_grad_batches=3)
    hand = fit(TokenModule(add_z_loss=True), token_loader(), [], accumulate_grad_batches=3)
    assert_close_weights(weights_of(ours), weights_of(hand))


def test_resumed_from_a_checkpoint_it_trains_as_the_uninterrupted_run(tmp_path: Any) -> None:
    def run(epochs: int, ckpt: Any = None) -> L.LightningModule:
        module = TokenModule()
        trainer = quiet_trainer(max_epochs=epochs, callbacks=[AlgorithmEngineCallback([ZLoss(COEFFICIENT)])],
                                default_root_dir=tmp_path)
        trainer.fit(module, token_loader(), ckpt_path=ckpt)
        if ckpt is None and epochs == 1:
            trainer.save_checkpoint(tmp_path / "one.ckpt")
        return module

    full = run(3)
    run(1)
    assert torch.load(tmp_path / "one.ckpt", weights_only=True)  # plain data: ZLoss keeps no state
    resumed = run(3, tmp_path / "one.ckpt")
    assert_same_weights(weights_of(resumed), weights_of(full))


DDP_SCRIPT = """
import torch, torch.nn.functional as F
from helpers.support import L, quiet_trainer
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import ZLoss
from torch.utils.data import DataLoader, TensorDataset

def network():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11))

class Plain(L.LightningModule):
    def __init__(self, add_z_loss):
        super().__init__()
        self.net, self.add_z_loss = network(), add_z_loss
    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits.view(-1, 11), y.view(-1))
        if self.add_z_loss:  # by hand: the positions with a target, each rank its own micro-batch
            loss = loss + 0.05 * (torch.logsumexp(logits, -1) ** 2)[y != -100].mean()
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

g = torch.Generator().manual_seed(0)
x = torch.randint(0, 11, (32, 6), generator=g)
y = torch.randint(0, 11, (32, 6), generator=g)
y[:, :2] = -100
out = {}
for name, add, callbacks in (("bridge", False, [AlgorithmEngineCallback([ZLoss(0.05)])]), ("hand", True, []),
                             ("none", False, [])):
    model = Plain(add)
    trainer = quiet_trainer(strategy="ddp", devices=2, max_steps=3, callbacks=callbacks)
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=4))
    out[name] = {k: v.detach() for k, v in model.net.state_dict().items()}
torch.save(out, f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_ddp_on_two_processes_equals_the_module_adding_the_z_loss_itself_on_every_rank(tmp_path: Any) -> None:
    from helpers.two_processes import saved_by_each_rank

    ranks = saved_by_each_rank(DDP_SCRIPT, tmp_path)
    for out in ranks:
        assert_close_weights(out["bridge"], out["hand"])
        assert any(not torch.equal(out["none"][k], v) for k, v in out["bridge"].items())
    for key, value in ranks[0]["bridge"].items():
        assert torch.equal(value, ranks[1]["bridge"][key]), key


def test_a_single_logit_per_example_is_refused_with_the_fix() -> None:
    state = State(nn.Identity())
    state.batch = (torch.zeros(3), torch.zeros(3, 1))
    state.outputs = torch.randn(3, 1)  # a regression head, or one binary logit
    with pytest.raises(ValueError, match=r"at least two classes.*\(3, 1\).*Fix: "):
        ZLoss().apply(Event.AFTER_FORWARD, state, Logger())


class SmoothedTokenModule(PlainTokenModule):
    """By hand: torch's label-smoothed cross-entropy plus the z-loss, what LabelSmoothing + ZLoss must train."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1), label_smoothing=0.1 if self.add_z_loss else 0.0)
        return loss + hand_z_loss(logits, y) if self.add_z_loss else loss


def test_with_label_smoothing_the_ignored_positions_stay_out_of_the_term() -> None:
    from composer_bridge.algorithms import LabelSmoothing

    for order in ([ZLoss(COEFFICIENT), LabelSmoothing(0.1)], [LabelSmoothing(0.1), ZLoss(COEFFICIENT)]):
        ours = fit(SmoothedTokenModule(), token_loader(), [AlgorithmEngineCallback(order)])
        hand = fit(SmoothedTokenModule(add_z_loss=True), token_loader(), [])
        assert_close_weights(weights_of(ours), weights_of(hand))
