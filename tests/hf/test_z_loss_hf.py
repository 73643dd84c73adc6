"""ZLoss on Hugging Face models: HuggingFaceModel's shifted logits and labels, and a plain module's model(**batch).loss."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from helpers.support import L, quiet_trainer
from torch.utils.data import DataLoader

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import ZLoss

if L.__name__.startswith("pytorch_lightning"):
    from composer_bridge.pl import HuggingFaceModel
else:
    from composer_bridge.hf import HuggingFaceModel

ROWS, SEQ, VOCAB, COEFFICIENT = 4, 10, 64, 0.05


def batches() -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :3] = -100  # a prompt
    labels[1, 6] = -100
    return [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}]


def hand_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Next-token cross-entropy plus the z-loss of the positions that have a next token, written out here."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    labels = batch["labels"][:, 1:]
    kept = labels != -100
    ce = torch.nn.functional.cross_entropy(logits[kept], labels[kept])
    return ce + COEFFICIENT * (torch.logsumexp(logits[kept], dim=-1) ** 2).mean()


def assert_one_sgd_step_of_the_hand_loss(model: torch.nn.Module, reference: torch.nn.Module, lr: float) -> None:
    """``model`` holds ``reference`` after one plain SGD step (``lr``) on the hand-written loss of the first batch."""
    hand_loss(reference, batches()[0]).backward()
    with torch.no_grad():
        for p in reference.parameters():
            if p.grad is not None:
                p -= lr * p.grad
    for (name, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_huggingface_model_adds_the_z_loss_of_the_shifted_logits(family: str, request: Any) -> None:
    model = request.getfixturevalue(family)()
    reference = copy.deepcopy(model)
    module = HuggingFaceModel(model, optimizer=lambda p: torch.optim.SGD(p, lr=0.5))
    callback = AlgorithmEngineCallback([ZLoss(coefficient=COEFFICIENT)])
    quiet_trainer(max_steps=1, callbacks=[callback]).fit(module, DataLoader(batches(), batch_size=None))
    assert_one_sgd_step_of_the_hand_loss(model, reference, lr=0.5)


class PlainHFModule(L.LightningModule):
    """The usual plain module around a Hugging Face causal LM: the model computes its own loss."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.model(**batch).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_plain_module_returning_the_models_own_loss_trains_as_the_hand_written_loss(llama: Any) -> None:
    model = llama()
    reference = copy.deepcopy(model)
    callback = AlgorithmEngineCallback([ZLoss(coefficient=COEFFICIENT, target_key="labels")])
    quiet_trainer(max_steps=1, callbacks=[callback]).fit(PlainHFModule(model), DataLoader(batches(), batch_size=None))
    assert_one_sgd_step_of_the_hand_loss(model, reference, lr=0.1)


def test_beside_label_smoothing_on_the_models_own_loss_it_is_refused_before_any_weight_changes(llama: Any) -> None:
    from composer_bridge.algorithms import LabelSmoothing

    model = llama()
    before = copy.deepcopy(model.state_dict())
    callback = AlgorithmEngineCallback([ZLoss(target_key="labels"), LabelSmoothing(0.1, target_key="labels")])
    with pytest.raises(Exception, match=r"LabelSmoothing replaced them first.*Fix: "):
        quiet_trainer(max_steps=1, callbacks=[callback]).fit(PlainHFModule(model), DataLoader(batches(), batch_size=None))
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
