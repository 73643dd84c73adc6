"""HuggingFaceModel: Hugging Face batches in, the loss Hugging Face itself would compute out."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers

from composer_bridge.hf import HuggingFaceModel


def batch_with_ignored_labels(vocab: int = 64) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (3, 12), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :5] = -100
    labels[2, 7:] = -100
    mask = torch.ones_like(ids)
    mask[2, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("which", ["gpt2", "llama", "bert"])
def test_lm_loss_equals_the_models_own_loss(which, gpt2, llama, bert):
    model = {"gpt2": gpt2, "llama": llama, "bert": bert}[which]()
    module = HuggingFaceModel(model)
    assert module.task == ("masked_lm" if which == "bert" else "causal_lm")
    batch = batch_with_ignored_labels()
    with torch.no_grad():
        outputs = module(batch)
        expected = model(**batch).loss  # Hugging Face shifts (causal) and skips -100 itself
        assert torch.allclose(module.loss(outputs, batch), expected, atol=1e-6)


def test_per_example_losses_average_each_rows_labelled_tokens(gpt2):
    module = HuggingFaceModel(gpt2())
    batch = batch_with_ignored_labels()
    with torch.no_grad():
        outputs = module(batch)
        per_row = module.loss(outputs, batch, reduction="none")
        logits, labels = outputs.logits[:, :-1], batch["labels"][:, 1:]
        for row in range(3):
            keep = labels[row] != -100
            expected = F.cross_entropy(logits[row][keep], labels[row][keep])
            assert torch.allclose(per_row[row], expected, atol=1e-6)
        total = module.loss(outputs, batch, reduction="sum")
        assert torch.allclose(total, module.loss(outputs, batch) * (labels != -100).sum(), atol=1e-4)


def test_soft_labels_with_one_hot_targets_give_the_hard_label_loss(bert):
    module = HuggingFaceModel(bert())
    batch = batch_with_ignored_labels()
    batch["labels"] = batch["input_ids"].clone()
    with torch.no_grad():
        outputs = module(batch)
        soft = dict(batch, labels=F.one_hot(batch["labels"], 64).float())
        assert torch.allclose(module.loss(outputs, soft), module.loss(outputs, batch), atol=1e-6)


def test_sequence_classification_loss_and_accuracy(bert_config):
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(bert_config(num_labels=3))
    module = HuggingFaceModel(model)
    batch = batch_with_ignored_labels()
    batch["labels"] = torch.tensor([0, 2, 1])
    with torch.no_grad():
        outputs = module(batch)
        assert torch.allclose(module.loss(outputs, batch), model(**batch).loss, atol=1e-6)
        module.val_acc(outputs.logits, batch["labels"])
        expected = (outputs.logits.argmax(-1) == batch["labels"]).float().mean()
        assert torch.allclose(module.val_acc.compute(), expected)


def test_bad_input_is_refused_with_the_fix(gpt2):
    module = HuggingFaceModel(gpt2())
    with pytest.raises(TypeError, match="dict batches"):
        module((torch.zeros(1, 4, dtype=torch.long),))
    with pytest.raises(KeyError, match="labels"):
        module.loss(module({"input_ids": torch.zeros(1, 4, dtype=torch.long)}), {"input_ids": None})
    with pytest.raises(ValueError, match="task="):
        HuggingFaceModel(transformers.GPT2Model(gpt2().config))
    with pytest.raises(ValueError, match="task='translation'"):
        HuggingFaceModel(gpt2(), task="translation")
    with pytest.raises(TypeError, match="PreTrainedModel"):
        HuggingFaceModel(torch.nn.Linear(2, 2))
