"""A :class:`~composer_bridge.ComposerModule` for any Hugging Face ``transformers`` model.

Batches are Hugging Face dicts (``input_ids``, ``attention_mask``, ``labels``, ...).
``forward(batch)`` calls the model with every key but ``labels`` and returns its output object
(``outputs.logits``); ``loss(outputs, batch)`` computes the loss from the logits and the labels
itself, so the algorithms that act between the two (SelectiveBackprop, or your own at
``BEFORE_LOSS``) see and change what the loss is computed from:

- ``"causal_lm"``: next-token cross-entropy: the logits at position ``t`` against the label at
  ``t + 1`` (labels are the input ids, shifted inside the loss, as Hugging Face does);
- ``"masked_lm"``: cross-entropy at every position;
- ``"sequence_classification"``: cross-entropy (mean squared error when ``num_labels == 1``).

Labels equal to ``-100`` are ignored; the mean is over the labelled tokens of the batch.
Probability targets shaped like the logits (soft labels) are accepted too; a position whose
target row is all zeros is ignored, as ``-100`` is (that is what LabelSmoothing makes of ``-100``).

Examples:
    >>> import torch, transformers
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16)
    >>> model = HuggingFaceModel(transformers.GPT2LMHeadModel(config))
    >>> model.task
    'causal_lm'
    >>> ids = torch.randint(0, 32, (2, 8))
    >>> outputs = model({"input_ids": ids, "labels": ids})
    >>> outputs.logits.shape, model.loss(outputs, {"input_ids": ids, "labels": ids}).ndim
    (torch.Size([2, 8, 32]), 0)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
import torchmetrics
from torch import nn

from composer_bridge.lightning.module import ComposerModule, ComposerModuleMixin

__all__ = ["IGNORE_INDEX", "TASKS", "HuggingFaceModel", "HuggingFaceModelMixin", "infer_task"]

#: Label value that the loss and the metrics skip (Hugging Face's convention).
IGNORE_INDEX = -100
TASKS = ("causal_lm", "masked_lm", "sequence_classification")

_SUFFIXES = {
    "causal_lm": ("ForCausalLM", "LMHeadModel"),
    "masked_lm": ("ForMaskedLM",),
    "sequence_classification": ("ForSequenceClassification",),
}


def infer_task(model: nn.Module) -> str:
    """The task of a ``transformers`` model, from its class name (``GPT2LMHeadModel`` → ``"causal_lm"``).

    Examples:
        >>> import transformers
        >>> infer_task(transformers.BertForMaskedLM(transformers.BertConfig(num_hidden_layers=1, hidden_size=8,
        ...     num_attention_heads=2, intermediate_size=8, vocab_size=16)))
        'masked_lm'
    """
    name = type(model).__name__
    for task, suffixes in _SUFFIXES.items():
        if name.endswith(suffixes):
            return task
    raise ValueError(
        f"HuggingFaceModel cannot tell the task of a {name} from its class name. Pass task= one of {TASKS} "
        "(the model must return .logits)."
    )


class HuggingFaceModelMixin(ComposerModuleMixin):
    """Train a ``transformers`` ``PreTrainedModel`` with Lightning and the bridge's algorithms.

    The code of :class:`HuggingFaceModel` (a ``lightning.pytorch.LightningModule``) and of
    ``composer_bridge.pl.HuggingFaceModel`` (a ``pytorch_lightning.LightningModule``).

    Args:
        model: the Hugging Face model (a ``...ForCausalLM``/``LMHeadModel``, ``...ForMaskedLM`` or
            ``...ForSequenceClassification``), built from a config or loaded.
        task: ``"causal_lm"``, ``"masked_lm"`` or ``"sequence_classification"``; inferred from the
            class name when ``None``.
        optimizer: a factory ``params -> Optimizer`` (default: AdamW, lr 5e-4).
        scheduler: optional factory ``optimizer -> LR scheduler`` (stepped every optimizer step).

    Logs ``train/loss``; ``val/loss``, ``val/acc`` (token or class accuracy, labels ``-100``
    skipped) and, for language models, ``val/perplexity`` (and ``test/*`` likewise).
    Export with ``module.model.save_pretrained(path)`` (see the Hugging Face page of the docs
    for what surgery changes in the export).

    Examples:
        >>> import transformers
        >>> config = transformers.BertConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
        ...                                  intermediate_size=32, vocab_size=32, num_labels=3)
        >>> module = HuggingFaceModel(transformers.BertForSequenceClassification(config))
        >>> module.task, module.num_classes
        ('sequence_classification', 3)
    """

    #: where the algorithms find the inputs and targets of a Hugging Face batch (see composer_bridge.lightning.batch_keys)
    batch_keys = {"input_key": "input_ids", "target_key": "labels"}

    def __init__(
        self,
        model: nn.Module,
        task: str | None = None,
        optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module) or not hasattr(model, "config"):
            raise TypeError(
                f"HuggingFaceModel(model=...) needs a transformers PreTrainedModel, got {type(model).__name__}."
            )
        if task is not None and task not in TASKS:
            raise ValueError(f"HuggingFaceModel(task={task!r}): choose one of {TASKS}, or None to infer it.")
        self.model = model
        self.task = task or infer_task(model)
        config = model.config
        self.num_classes = int(config.num_labels if self.task == "sequence_classification" else config.vocab_size)
        self._optimizer_factory = optimizer
        self._scheduler_factory = scheduler
        # Training needs no key/value cache: don't let the model build one every step.
        self._no_cache = "use_cache" in inspect.signature(model.forward).parameters
        if self.num_classes > 1:
            self.val_acc = self._accuracy()
            self.test_acc = self._accuracy()

    def _accuracy(self) -> torchmetrics.Metric:
        return torchmetrics.Accuracy(task="multiclass", num_classes=self.num_classes, ignore_index=IGNORE_INDEX)

    # --- forward and loss ---------------------------------------------------------------------
    def forward(self, batch: Any) -> Any:
        """The model's outputs for ``batch`` (every key but ``labels`` is passed to the model)."""
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"HuggingFaceModel expects dict batches ({{'input_ids': ..., 'attention_mask': ..., 'labels': ...}}), "
                f"got {type(batch).__name__}. Use a collate_fn (or a Dataset) that returns dicts."
            )
        inputs = {key: value for key, value in batch.items() if key != "labels"}
        if self._no_cache:
            inputs.setdefault("use_cache", False)
        return self.model(**inputs)

    def loss(self, outputs: Any, batch: Any, reduction: str = "mean") -> torch.Tensor:
        """The loss of ``outputs`` against ``batch["labels"]``.

        ``reduction="none"`` gives one loss per example (the mean over its labelled tokens for
        language models), which is what SelectiveBackprop ranks examples by.
        """
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"HuggingFaceModel.loss(reduction={reduction!r}): choose 'mean', 'sum' or 'none'.")
        logits, labels = self.logits_and_labels(outputs, batch)
        if self.task == "sequence_classification":
            return _classification_loss(logits, labels, reduction)
        return _token_loss(logits, labels, reduction)

    def logits_and_labels(self, outputs: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits and labels the loss compares, aligned (shifted by one token for causal LMs)."""
        logits = outputs if isinstance(outputs, torch.Tensor) else outputs.logits
        if not isinstance(batch, Mapping) or "labels" not in batch:
            raise KeyError(
                "HuggingFaceModel.loss needs batch['labels'] (for causal LMs usually a copy of input_ids, -100 "
                "where no loss is wanted)."
            )
        labels = batch["labels"]
        if self.task == "causal_lm":
            logits, labels = logits[:, :-1], labels[:, 1:]
        return logits, labels

    # --- metrics ------------------------------------------------------------------------------
    def update_eval_metrics(self, outputs: Any, batch: Any, prefix: str) -> None:
        loss = self.loss(outputs, batch).detach()
        size = _rows(batch)
        self.log(f"{prefix}/loss", loss, prog_bar=True, batch_size=size)
        if self.task != "sequence_classification":
            self.log(f"{prefix}/perplexity", loss.float().exp(), batch_size=size)
        if self.num_classes < 2:
            return
        logits, labels = self.logits_and_labels(outputs, batch)
        if labels.is_floating_point():
            labels = labels.argmax(dim=-1)
        metric = self.val_acc if prefix == "val" else self.test_acc
        metric(logits.detach().reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
        self.log(f"{prefix}/acc", metric, prog_bar=True, batch_size=size)

    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        factory = self._optimizer_factory or (lambda ps: torch.optim.AdamW(ps, lr=5e-4))
        optimizer = factory(params)
        if self._scheduler_factory is None:
            return optimizer
        scheduler = self._scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class HuggingFaceModel(HuggingFaceModelMixin, ComposerModule):
    """A Hugging Face model as a ``lightning.pytorch.LightningModule``; see :class:`HuggingFaceModelMixin`.

    With ``import pytorch_lightning as pl``, use ``composer_bridge.pl.HuggingFaceModel``.

    Examples:
        >>> import transformers
        >>> config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16)
        >>> HuggingFaceModel(transformers.GPT2LMHeadModel(config)).task
        'causal_lm'
    """


def _rows(batch: Any) -> int | None:
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.ndim:
            return int(value.shape[0])
    return None


def _token_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str) -> torch.Tensor:
    """Cross-entropy per token, reduced over the labelled tokens (``(B, S, V)`` logits)."""
    vocab = logits.shape[-1]
    if labels.is_floating_point() and labels.shape == logits.shape:  # soft labels: all-zero rows are ignored
        per_token = -(labels.float() * F.log_softmax(logits.float(), dim=-1)).sum(-1)
        counted = (labels != 0).any(dim=-1).to(per_token.dtype)
    else:
        per_token = F.cross_entropy(logits.reshape(-1, vocab).float(), labels.reshape(-1).long(),
                                    ignore_index=IGNORE_INDEX, reduction="none").view(labels.shape)
        counted = (labels != IGNORE_INDEX).to(per_token.dtype)
    if reduction == "sum":
        return per_token.sum()
    if reduction == "none":
        return per_token.sum(dim=1) / counted.sum(dim=1).clamp(min=1)
    return per_token.sum() / counted.sum().clamp(min=1)


def _classification_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str) -> torch.Tensor:
    if logits.shape[-1] == 1:  # regression, as Hugging Face does for num_labels == 1
        return F.mse_loss(logits.squeeze(-1).float(), labels.float(), reduction=reduction)
    if labels.is_floating_point() and labels.shape == logits.shape:  # all-zero rows are ignored, as -100
        per_example = -(labels.float() * F.log_softmax(logits.float(), dim=-1)).sum(-1)
        if reduction == "mean":
            return per_example.sum() / (labels != 0).any(dim=-1).sum().clamp(min=1)
        return per_example.sum() if reduction == "sum" else per_example
    return F.cross_entropy(logits.float(), labels.long(), ignore_index=IGNORE_INDEX, reduction=reduction)
