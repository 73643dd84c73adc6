"""LabelSmoothing on Hugging Face models: a Trainer step equals cross_entropy(..., label_smoothing=s).

The reference is PyTorch's own label-smoothed cross-entropy on a copy of the untrained model,
with Hugging Face's ``-100`` labels ignored; the bridge's step goes through the algorithm (smoothed
probability targets at ``BEFORE_LOSS``) and ``HuggingFaceModel.loss``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import transformers
from helpers.support import quiet_trainer
from torch.utils.data import DataLoader

from composer_bridge import AlgorithmEngineCallback, AlgorithmError
from composer_bridge.algorithms import LabelSmoothing
from composer_bridge.hf import HuggingFaceModel

SMOOTHING = 0.1
ROWS, SEQ, VOCAB, NUM_LABELS = 4, 12, 64, 3
INIT = 0.3  # initializer_range (Hugging Face's default is 0.02)


class RecordingModel(HuggingFaceModel):
    """Keeps the training loss, the labels the metrics saw and the gradients of the first step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: dict[str, Any] = {}

    def update_train_metrics(self, outputs: Any, batch: Any, loss: torch.Tensor) -> None:
        self.seen["loss"], self.seen["labels"] = loss.detach().clone(), batch["labels"].clone()
        super().update_train_metrics(outputs, batch, loss)

    def on_after_backward(self) -> None:
        self.seen["grads"] = {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None}


def token_labels(ids: torch.Tensor) -> torch.Tensor:
    labels = ids.clone()
    labels[:, :3] = -100  # e.g. a prompt
    labels[1, 7] = labels[2, -1] = -100
    return labels


def case(name: str, gpt2: Any, bert_config: Any) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """(model, input ids, labels) for one task; dropout is off in every model.

    Weights are initialised larger than usual so that the untrained models' predictions are far
    from uniform, where smoothing changes the loss and the gradients clearly.
    """
    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(1))
    if name == "gpt2-causal-lm":
        return gpt2(initializer_range=INIT), ids, token_labels(ids)
    torch.manual_seed(0)
    if name == "bert-masked-lm":
        return transformers.BertForMaskedLM(bert_config(initializer_range=INIT)), ids, token_labels(ids)
    model = transformers.BertForSequenceClassification(bert_config(num_labels=NUM_LABELS, initializer_range=INIT))
    return model, ids, torch.tensor([2, 0, 1, 2])


def reference_logits_and_labels(name: str, model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor):
    logits = model(input_ids=ids).logits
    if name == "gpt2-causal-lm":  # next-token prediction: the logits at t against the label at t + 1
        logits, labels = logits[:, :-1], labels[:, 1:]
    return logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)


@pytest.mark.parametrize("name", ["gpt2-causal-lm", "bert-masked-lm", "bert-sequence-classification"])
def test_a_trainer_step_with_label_smoothing_equals_torch_label_smoothed_cross_entropy(name, gpt2, bert_config):
    model, ids, labels = case(name, gpt2, bert_config)
    reference = copy.deepcopy(model)
    module = RecordingModel(model, optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    batches = DataLoader([{"input_ids": i, "labels": y} for i, y in zip(ids, labels, strict=True)], batch_size=ROWS)
    callback = AlgorithmEngineCallback([LabelSmoothing(SMOOTHING, target_key="labels")])
    quiet_trainer(accelerator="cpu", precision="32-true", max_steps=1, callbacks=[callback]).fit(module, batches)

    logits, targets = reference_logits_and_labels(name, reference, ids, labels)
    expected = F.cross_entropy(logits, targets, ignore_index=-100, label_smoothing=SMOOTHING)
    expected.backward()
    unsmoothed = F.cross_entropy(logits.detach(), targets, ignore_index=-100)
    assert abs(expected.item() - unsmoothed.item()) > 0.01  # smoothing's effect: 500x the tolerance below
    torch.testing.assert_close(module.seen["loss"], expected.detach())
    grads = module.seen["grads"]
    assert set(grads) == {n for n, p in reference.named_parameters() if p.grad is not None}
    for param_name, param in reference.named_parameters():
        if param.grad is not None:
            torch.testing.assert_close(grads[param_name], param.grad, msg=param_name)
    # AFTER_LOSS put the integer labels back (-100 included) before the metrics saw them
    assert module.seen["labels"].dtype == torch.long and torch.equal(module.seen["labels"], labels)


@pytest.mark.parametrize("name", ["gpt2-causal-lm", "bert-sequence-classification"])
def test_all_zero_soft_rows_are_ignored_like_minus_100(name, gpt2, bert_config):
    model, ids, labels = case(name, gpt2, bert_config)
    labels[1] = -100  # sequence classification: one example without a label
    module = HuggingFaceModel(model)
    classes = module.num_classes
    soft = F.one_hot(labels.clamp(min=0), classes).float() * (labels >= 0).unsqueeze(-1)
    with torch.no_grad():
        outputs = module({"input_ids": ids})
        for reduction in ("mean", "sum", "none"):
            torch.testing.assert_close(module.loss(outputs, {"labels": soft}, reduction=reduction),
                                       module.loss(outputs, {"labels": labels}, reduction=reduction))


def test_hugging_face_batches_without_target_key_labels_get_an_error_naming_the_fix(gpt2):
    class Undeclared(HuggingFaceModel):
        batch_keys = None  # HuggingFaceModel declares input_ids/labels; without that, the default key 1 is wrong

    module = Undeclared(gpt2())
    ids = torch.randint(0, VOCAB, (2, 8))
    batches = DataLoader([{"input_ids": row, "labels": row} for row in ids], batch_size=2)
    callback = AlgorithmEngineCallback([LabelSmoothing(SMOOTHING)])  # target_key left at 1
    with pytest.raises(AlgorithmError, match=r"LabelSmoothing.*KeyError.*target_key='labels'"):
        quiet_trainer(accelerator="cpu", max_steps=1, callbacks=[callback]).fit(module, batches)
