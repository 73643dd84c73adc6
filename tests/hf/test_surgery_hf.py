"""GatedLinearUnits, LowPrecisionLayerNorm, Factorize and the Conv1D swap on Hugging Face models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import composer_bridge.hf as hf
from composer_bridge.algorithms import NoEffectWarning
from composer_bridge.algorithms.gated_linear_units import GatedProjection
from composer_bridge.algorithms.low_precision_layernorm import LPLayerNorm
from composer_bridge.functional import (
    apply_factorization,
    apply_gated_linear_units,
    apply_low_precision_layernorm,
)


def test_bert_feed_forward_becomes_the_glu_formula(bert):
    model = bert()
    assert apply_gated_linear_units(model) == 2
    layer = model.bert.encoder.layer[0]
    gate = layer.intermediate.dense
    assert isinstance(gate, GatedProjection) and gate.gated_layer.bias is None and gate.non_gated_layer.bias is None
    x = torch.randn(3, 5, 32)
    with torch.no_grad():
        g, v = x @ gate.gated_layer.weight.T, x @ gate.non_gated_layer.weight.T
        hidden = F.gelu(g) * v  # BERT's own activation (gelu) gates
        out = layer.output
        expected = F.layer_norm(hidden @ out.dense.weight.T + out.dense.bias + x, (32,), out.LayerNorm.weight,
                                out.LayerNorm.bias, out.LayerNorm.eps)
        got = layer.feed_forward_chunk(x)
    assert torch.allclose(got, expected, atol=1e-5)


def test_gpt2_mlp_becomes_a_glu_with_the_chosen_activation_and_biases(gpt2):
    model = gpt2()
    assert apply_gated_linear_units(model, act_fn="relu", gated_layer_bias=True) == 2
    mlp = model.transformer.h[1].mlp
    gate = mlp.c_fc
    assert gate.gated_layer.bias is not None and gate.non_gated_layer.bias is None
    x = torch.randn(2, 4, 32)
    with torch.no_grad():
        hidden = torch.relu(x @ gate.gated_layer.weight.T + gate.gated_layer.bias) * (x @ gate.non_gated_layer.weight.T)
        expected = hidden @ mlp.c_proj.weight + mlp.c_proj.bias  # Conv1D: weight is (in, out)
        assert torch.allclose(mlp(x), expected, atol=1e-5)
    with pytest.warns(NoEffectWarning):
        assert apply_gated_linear_units(model) == 0  # twice = once


def test_llama_mlp_is_already_gated_and_left_alone(llama):
    with pytest.warns(NoEffectWarning):
        assert apply_gated_linear_units(llama()) == 0


def test_low_precision_layernorm_covers_gpt2_and_bert_norms_and_changes_nothing_in_fp32(gpt2, bert):
    for model, norms in ((gpt2(), 2 * 2 + 1), (bert(), 1 + 2 * 2 + 1)):  # GPT-2: ln_1, ln_2, ln_f; BERT: + head
        ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            before = model(ids).logits
        assert apply_low_precision_layernorm(model, precision="bf16-mixed") == norms
        with torch.no_grad():
            assert torch.equal(model(ids).logits, before)  # outside autocast: an ordinary LayerNorm
    norm = model.bert.embeddings.LayerNorm
    assert isinstance(norm, LPLayerNorm)
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = norm(x)
    expected = F.layer_norm(x.bfloat16(), (32,), norm.weight.bfloat16(), norm.bias.bfloat16(), norm.eps)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


def test_factorize_bert_linears_to_their_best_low_rank_approximation_and_leave_tied_ones(bert):
    model = bert(hidden_size=64, intermediate_size=256, num_attention_heads=2)
    decoder = model.cls.predictions.decoder  # tied to the word embeddings
    original = model.bert.encoder.layer[0].intermediate.dense.weight.detach().clone()
    replaced = apply_factorization(model, min_features=64, latent_features=16)
    assert replaced == 2 * 6 + 1  # query, key, value, 3 dense per layer, the head's transform; not the decoder
    assert model.cls.predictions.decoder is decoder
    factorized = model.bert.encoder.layer[0].intermediate.dense
    u, s, vh = torch.linalg.svd(original.double())
    best = (u[:, :16] * s[:16]) @ vh[:16]
    product = factorized.module1.weight.double() @ factorized.module0.weight.double()
    assert torch.allclose(product, best, atol=1e-5)


def test_gpt2_conv1d_swaps_to_linear_with_the_same_outputs_then_factorizes(gpt2):
    model = gpt2(n_embd=64, n_head=2)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
        original = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(NoEffectWarning):
        apply_factorization(model, min_features=64, latent_features=16)  # Conv1D is not nn.Linear
    assert hf.conv1d_to_linear(model) == 4 * 2
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, before, atol=1e-5)
    assert hf.linear_to_conv1d(model) == 4 * 2  # and back, bit for bit
    assert all(torch.equal(v, original[k]) for k, v in model.state_dict().items())
    hf.conv1d_to_linear(model)
    assert apply_factorization(model, min_features=64, latent_features=16) == 2 * 4  # not lm_head (tied to wte)
    assert model.lm_head.weight is model.transformer.wte.weight
