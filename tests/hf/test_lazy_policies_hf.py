"""Surgeries on transformers models work without ``import composer_bridge.hf`` first.

A user coming from Composer calls ``composer_bridge.functional.apply_alibi(gpt2, ...)`` with no
other import. A fresh interpreter (a subprocess: this test process has imported composer_bridge.hf
already) runs every surgery with Hugging Face policies, functional form and Algorithm class, and
saves what it got; the models here are built the same way with composer_bridge.hf imported
explicitly, and weights, outputs and module classes must be equal.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import transformers
from helpers.support import REPO

import composer_bridge.hf as hf
from composer_bridge.algorithms import NoEffectWarning
from composer_bridge.functional import (
    apply_alibi,
    apply_factorization,
    apply_gated_linear_units,
    apply_low_precision_layernorm,
)

# Shared by the subprocess and this process: the same tiny models and the same surgeries.
MODELS = textwrap.dedent(
    """
    import torch, transformers
    from composer_bridge import Engine, Event, Logger, State
    from composer_bridge.algorithms import Alibi, GatedLinearUnits
    from composer_bridge.functional import (apply_alibi, apply_gated_linear_units,
                                            apply_low_precision_layernorm)

    def gpt2():
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config).eval()

    def bert():
        torch.manual_seed(0)
        config = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                         intermediate_size=64, vocab_size=64, max_position_embeddings=16,
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return transformers.BertForMaskedLM(config).eval()

    def llama():
        torch.manual_seed(0)
        config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                          num_key_value_heads=4, intermediate_size=64, vocab_size=64,
                                          max_position_embeddings=16, bos_token_id=0, eos_token_id=0)
        return transformers.LlamaForCausalLM(config).eval()

    def with_engine(model, algorithm):
        Engine(State(model, algorithms=[algorithm]), Logger()).run_event(Event.INIT)
        return model

    SURGERIES = {
        "apply_alibi(gpt2)": (gpt2, lambda m: apply_alibi(m, max_sequence_length=40)),
        "apply_alibi(bert)": (bert, lambda m: apply_alibi(m, max_sequence_length=40)),
        "apply_alibi(llama)": (llama, lambda m: apply_alibi(m, max_sequence_length=40)),
        "Alibi(gpt2)": (gpt2, lambda m: with_engine(m, Alibi(40, train_sequence_length_scaling=1))),
        "apply_gated_linear_units(bert)": (bert, lambda m: apply_gated_linear_units(m, act_fn="relu")),
        "apply_gated_linear_units(gpt2)": (gpt2, lambda m: apply_gated_linear_units(m)),
        "GatedLinearUnits(bert)": (bert, lambda m: with_engine(m, GatedLinearUnits())),
        "apply_low_precision_layernorm(gpt2)": (gpt2, lambda m: apply_low_precision_layernorm(m, precision="bf16-mixed")),
    }

    def run_all():
        ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(0))  # longer than 16
        results = {}
        for name, (build, surgery) in SURGERIES.items():
            model = build()
            torch.manual_seed(1)  # GatedLinearUnits initialises fresh layers
            surgery(model)
            classes = [type(m).__name__ for m in model.modules()]
            with torch.no_grad():
                logits = model(ids if "alibi" in name.lower() else ids[:, :16]).logits
            results[name] = {"state": model.state_dict(), "logits": logits, "classes": classes}
        return results
    """
)

FRESH = MODELS + textwrap.dedent(
    """
    import sys, warnings
    from torch import nn
    import composer_bridge.functional as functional

    loaded_before = "composer_bridge.hf" in sys.modules
    with warnings.catch_warnings(record=True) as plain_warnings:  # a model with no transformers class
        warnings.simplefilter("always")
        functional.apply_alibi(nn.Sequential(nn.Linear(2, 2)), max_sequence_length=8)
    transformers_after_plain = "composer_bridge.hf" in sys.modules
    with warnings.catch_warnings(record=True) as hf_warnings:
        warnings.simplefilter("always")
        results = run_all()
    torch.save({
        "results": results,
        "loaded_before": loaded_before,
        "hf_after_plain_model": transformers_after_plain,
        "plain_warning": [str(w.message) for w in plain_warnings],
        "hf_warnings": [str(w.message) for w in hf_warnings if "replaced no module" in str(w.message)],
        "lightning_imported": any(name.split(".")[0] in ("lightning", "pytorch_lightning") for name in sys.modules),
    }, sys.argv[1])
    """
)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict:
    """What the fresh interpreter saved (one subprocess, about 10 s, shared by the tests below)."""
    tmp_path = tmp_path_factory.mktemp("fresh")
    out = tmp_path / "fresh.pt"
    script = tmp_path / "fresh.py"
    script.write_text(FRESH)
    result = subprocess.run(
        [sys.executable, str(script), str(out)], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out, weights_only=False)


def test_surgeries_in_a_fresh_interpreter_equal_those_after_importing_composer_bridge_hf(fresh):
    assert not fresh["loaded_before"], "importing composer_bridge.functional must not import composer_bridge.hf"
    assert not fresh["hf_after_plain_model"], "a model without transformers classes must not import it"
    assert not fresh["lightning_imported"], "the policies must not bring Lightning in with them"
    # nothing found in a plain model: the warning names the package that knows Hugging Face classes
    assert len(fresh["plain_warning"]) == 1 and "composer_bridge.hf (transformers)" in fresh["plain_warning"][0]
    assert fresh["hf_warnings"] == []

    namespace: dict = {}
    exec(MODELS, namespace)  # noqa: S102 - the same builders, in this process (composer_bridge.hf imported)
    expected = namespace["run_all"]()
    assert set(fresh["results"]) == set(expected)
    for name, want in expected.items():
        got = fresh["results"][name]
        assert got["classes"] == want["classes"], name
        assert got["state"].keys() == want["state"].keys(), name
        assert all(torch.equal(got["state"][k], v) for k, v in want["state"].items()), name
        assert torch.equal(got["logits"], want["logits"]), name


def test_fresh_surgeries_changed_the_models_as_the_hugging_face_policies_say(fresh):
    """Not only equal to this process: the classes and weights show each surgery happened."""
    results = fresh["results"]
    for name in ("apply_alibi(gpt2)", "Alibi(gpt2)"):
        classes, state = results[name]["classes"], results[name]["state"]
        assert classes.count("AlibiGPT2Attention") == 2, name
        assert state["transformer.wpe.weight"].shape == (40, 32) and not state["transformer.wpe.weight"].any()
        assert results[name]["logits"].shape == (2, 24, 64)  # 24 tokens: more than n_positions=16
    # transformers before 5 builds BERT's attention as BertSdpaSelfAttention by default: its ALiBi class is then
    # AlibiBertSdpaSelfAttention (composer_bridge/hf/alibi.py keeps one for each)
    bert_attention = "AlibiBertSdpaSelfAttention" if hasattr(transformers.models.bert.modeling_bert,
                                                             "BertSdpaSelfAttention") else "AlibiBertSelfAttention"
    assert results["apply_alibi(bert)"]["classes"].count(bert_attention) == 2
    assert results["apply_alibi(llama)"]["classes"].count("AlibiLlamaAttention") == 2
    for name in ("apply_gated_linear_units(bert)", "GatedLinearUnits(bert)", "apply_gated_linear_units(gpt2)"):
        assert results[name]["classes"].count("GatedProjection") == 2, name
    assert results["apply_low_precision_layernorm(gpt2)"]["classes"].count("LPLayerNorm") == 5

    # the GLU block computes relu(G x) * (V x) through the output projection, with the fresh weights
    state = results["apply_gated_linear_units(bert)"]["state"]
    prefix = "bert.encoder.layer.0."
    x = torch.randn(3, 32)
    hidden = torch.relu(x @ state[prefix + "intermediate.dense.gated_layer.weight"].T)
    hidden = hidden * (x @ state[prefix + "intermediate.dense.non_gated_layer.weight"].T)
    bert = transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=64,
        max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    apply_gated_linear_units(bert, act_fn="relu")
    bert.load_state_dict(state)
    with torch.no_grad():
        assert torch.allclose(bert.bert.encoder.layer[0].intermediate(x), hidden, atol=1e-6)


def test_the_warning_names_what_was_looked_for_when_a_transformers_model_has_none_of_it():
    config = transformers.T5Config(num_layers=1, d_model=16, num_heads=2, vocab_size=32, d_ff=16, d_kv=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert apply_alibi(transformers.T5Model(config), max_sequence_length=8) == 0
        assert apply_gated_linear_units(transformers.T5Model(config)) == 0
    alibi, glu = (str(w.message) for w in caught if issubclass(w.category, NoEffectWarning))
    assert "GPT2Attention" in alibi and "BertSelfAttention" in alibi and "policy={YourAttention" in alibi
    assert "register_alibi_policy" in alibi
    assert "GPT2MLP" in glu and "BertIntermediate" in glu and "register_glu_policy" in glu


def test_factorize_on_gpt2_names_conv1d_to_linear():
    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=32, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert apply_factorization(model, min_features=64, latent_features=16) == 0
    (message,) = (str(w.message) for w in caught if issubclass(w.category, NoEffectWarning))
    assert "composer_bridge.hf.conv1d_to_linear(model)" in message
    hf.conv1d_to_linear(model)
    assert apply_factorization(model, min_features=64, latent_features=16) == 4  # what the hint leads to
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_factorization(torch.nn.Sequential(torch.nn.Linear(4, 4)), min_features=64)
    assert "conv1d_to_linear" not in str(caught[0].message)  # no Conv1D, no hint



def test_low_precision_layernorm_on_llama_names_its_rms_norms():
    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                                      intermediate_size=64, vocab_size=64, bos_token_id=0, eos_token_id=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert apply_low_precision_layernorm(transformers.LlamaForCausalLM(config), precision="bf16-mixed") == 0
    (message,) = (str(w.message) for w in caught if issubclass(w.category, NoEffectWarning))
    assert "LlamaRMSNorm layers are RMS norms" in message
