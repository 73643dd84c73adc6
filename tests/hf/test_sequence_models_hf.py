"""Hugging Face sequence models the way people train them in Lightning.

- ``HuggingFaceModel`` declares its batch keys (``input_ids``, ``labels``): algorithms left on their
  default keys train exactly as with the keys spelled out (Llama-family and GPT-2 configs).
- A plain LightningModule whose step is ``loss = self.model(**batch).loss`` (causal LM: the model
  shifts the labels inside; seq2seq T5: the labels' ``-100`` padding) with LabelSmoothing equals plain
  Lightning whose step computes torch's ``cross_entropy(..., label_smoothing=)`` on the model's logits
  (what Hugging Face's ``label_smoothing_factor`` computes); per-sample algorithms are refused with the reason.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
import transformers
from helpers.support import L, quiet_trainer
from torch.utils.data import DataLoader

from composer_bridge import AlgorithmEngineCallback, AlgorithmError
from composer_bridge.algorithms import LabelSmoothing, SelectiveBackprop
from composer_bridge.lightning.setup_checks import BridgeConfigurationError

if L.__name__.startswith("pytorch_lightning"):
    from composer_bridge.pl import HuggingFaceModel
else:
    from composer_bridge.hf import HuggingFaceModel

VOCAB, ROWS, SEQ, SMOOTHING = 64, 8, 10, 0.2


def llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                      initializer_range=0.3)
    return transformers.LlamaForCausalLM(config)


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.3)
    return transformers.GPT2LMHeadModel(config)


def t5() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
                                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, initializer_factor=1.0)
    return transformers.T5ForConditionalGeneration(config)


MODELS = {"llama": llama, "gpt2": gpt2, "t5": t5}


def batches(seq2seq: bool = False) -> DataLoader:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (2 * ROWS, SEQ), generator=g)
    mask = torch.ones_like(ids)
    mask[::2, -3:] = 0  # right padding
    labels = torch.randint(1, VOCAB, (2 * ROWS, SEQ - 2), generator=g) if seq2seq else ids.clone()
    labels[::2, -3:] = -100  # padded positions, as Hugging Face's collators mark them
    rows = [{"input_ids": i, "attention_mask": m, "labels": y} for i, m, y in zip(ids, mask, labels, strict=True)]
    return DataLoader(rows, batch_size=ROWS)


@pytest.mark.parametrize("algorithm", ["LabelSmoothing", "SelectiveBackprop"])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_hugging_face_model_gives_algorithms_on_default_keys_its_batch_keys(name: str, algorithm: str) -> None:
    def make(**keys: Any) -> Any:
        if algorithm == "LabelSmoothing":
            return LabelSmoothing(SMOOTHING, target_key=keys["target_key"]) if keys else LabelSmoothing(SMOOTHING)
        return SelectiveBackprop(start="1ba", end=1.0, keep=0.5, interrupt=0, **keys)

    def train(algorithm: Any) -> HuggingFaceModel:
        module = HuggingFaceModel(MODELS[name](), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
        quiet_trainer(max_steps=2, callbacks=[AlgorithmEngineCallback([algorithm], seed=0)]).fit(module, batches())
        return module

    default = make()
    trained = train(default)  # no KeyError at the first step
    assert default.target_key == "labels" and getattr(default, "input_key", "input_ids") == "input_ids"
    expected = train(make(input_key="input_ids", target_key="labels"))
    untrained = MODELS[name]().state_dict()
    assert not all(torch.equal(v, untrained[k]) for k, v in trained.model.state_dict().items())
    for (key, got), want in zip(trained.state_dict().items(), expected.state_dict().values(), strict=True):
        assert torch.equal(got, want), key


class ModelLoss(L.LightningModule):
    """``loss = self.model(**batch).loss``; with ``smoothing`` the step computes torch's label-smoothed loss instead."""

    def __init__(self, name: str, smoothing: float = 0.0) -> None:
        super().__init__()
        self.model, self.name, self.smoothing = MODELS[name](), name, smoothing
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if not self.smoothing:
            loss = self.model(**batch).loss
        else:  # the reference: the same logits, torch's label_smoothing= (Hugging Face's label_smoothing_factor)
            logits, labels = self.model(**batch).logits, batch["labels"]
            if self.name != "t5":  # causal LM: the logits at t against the label at t + 1
                logits, labels = logits[:, :-1], labels[:, 1:]
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), label_smoothing=self.smoothing)
        self.losses.append(loss.detach().clone())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("name", ["llama", "gpt2", "t5"])
def test_label_smoothing_on_the_models_own_loss_equals_torchs_label_smoothing(name: str) -> None:
    data = batches(seq2seq=name == "t5")
    expected = ModelLoss(name, smoothing=SMOOTHING)
    quiet_trainer(max_steps=2).fit(expected, data)
    model = ModelLoss(name)
    callback = AlgorithmEngineCallback([LabelSmoothing(SMOOTHING, target_key="labels")], seed=0)
    quiet_trainer(max_steps=2, callbacks=[callback]).fit(model, data)

    # the step returns the model's .loss; the bridge's smoothed loss replaced it, to float rounding of torch's
    unsmoothed = ModelLoss(name)
    quiet_trainer(max_steps=1).fit(unsmoothed, data)
    assert abs(unsmoothed.losses[0] - expected.losses[0]) > 0.01
    torch.testing.assert_close(torch.stack(model.losses), torch.stack(expected.losses))
    for (key, got), want in zip(model.state_dict().items(), expected.state_dict().values(), strict=True):
        torch.testing.assert_close(got, want, msg=key)


def test_per_sample_algorithms_on_the_models_own_loss_are_refused_with_the_reason() -> None:
    class WithForward(ModelLoss):
        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids).logits

    model = WithForward("gpt2")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    algorithm = SelectiveBackprop(start="1ba", end=1.0, interrupt=0, input_key="input_ids", target_key="labels")
    with pytest.raises((BridgeConfigurationError, AlgorithmError),
                       match=r"SelectiveBackprop acts per sample.*shifts the labels inside model\(\*\*batch\).loss"):
        quiet_trainer(max_steps=2, callbacks=[AlgorithmEngineCallback([algorithm], seed=0)]).fit(model, batches())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_plain_module_that_declares_its_batch_keys_needs_no_key_on_the_algorithm() -> None:
    class Declared(ModelLoss):
        batch_keys = {"target_key": "labels"}

    data = batches()
    expected = ModelLoss("gpt2")
    quiet_trainer(max_steps=2, callbacks=[AlgorithmEngineCallback([LabelSmoothing(SMOOTHING, target_key="labels")],
                                                                   seed=0)]).fit(expected, data)
    model = Declared("gpt2")
    quiet_trainer(max_steps=2, callbacks=[AlgorithmEngineCallback([LabelSmoothing(SMOOTHING)], seed=0)]).fit(model, data)
    assert torch.equal(torch.stack(model.losses), torch.stack(expected.losses))


@pytest.mark.parametrize("declared", [["labels"], {"labels_key": "labels"}])
def test_a_malformed_batch_keys_declaration_is_refused_at_setup(declared: Any) -> None:
    class Declared(ModelLoss):
        batch_keys = declared

    with pytest.raises(BridgeConfigurationError, match=r"Declared.batch_keys = .*expected a dict with the keys "
                       r"\('input_key', 'target_key'\)"):
        quiet_trainer(max_steps=1, callbacks=[AlgorithmEngineCallback([LabelSmoothing(SMOOTHING)])]).fit(
            Declared("gpt2"), batches())


def test_an_undeclared_dict_batch_is_refused_with_its_keys_and_the_argument_to_pass() -> None:
    model = ModelLoss("gpt2")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(BridgeConfigurationError, match=r"LabelSmoothing reads the targets at 1: Cannot find batch item 1 "
                       r"in a dict with keys \['attention_mask', 'input_ids', 'labels'\].*Fix: pass target_key="):
        quiet_trainer(max_steps=1, callbacks=[AlgorithmEngineCallback([LabelSmoothing(SMOOTHING)])]).fit(model, batches())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
