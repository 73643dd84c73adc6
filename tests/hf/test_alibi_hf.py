"""ALiBi on Hugging Face GPT-2, BERT and Llama, checked against attention computed by hand."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import composer_bridge.hf as hf
from composer_bridge.algorithms import Alibi, NoEffectWarning
from composer_bridge.functional import apply_alibi


def reference_bias(heads: int, queries: int, keys: int) -> torch.Tensor:
    """Press et al.'s bias written out: slope_h = 2^(-8 (h+1) / heads), -slope_h * |i - j|, queries last."""
    out = torch.empty(heads, queries, keys)
    for h in range(heads):
        slope = 2.0 ** (-8.0 * (h + 1) / heads)
        for i in range(queries):
            for j in range(keys):
                out[h, i, j] = -slope * abs(i + keys - queries - j)
    return out


def reference_attention(q, k, v, heads, bias, allowed):
    """softmax(q k^T / sqrt(d) + bias, over allowed keys) v, per head; q/k/v are (B, S, D)."""
    b, s, d = q.shape
    split = lambda t: t.view(b, t.shape[1], heads, d // heads).transpose(1, 2)  # noqa: E731
    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(d // heads) + bias
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ split(v)).transpose(1, 2).reshape(b, s, d)


def test_mask_holds_press_et_al_biases_under_the_masks_it_is_given():
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)])
    expected = reference_bias(4, 3, 5)
    causal = hf.alibi_attention_mask(None, slopes, 3, 5, causal=True, dtype=torch.float32)
    visible = torch.arange(5)[None, :] <= torch.arange(3)[:, None] + 2
    assert torch.allclose(causal[0][:, visible], expected[:, visible])
    assert bool((causal[0][:, ~visible] == torch.finfo(torch.float32).min).all())
    keep = torch.tensor([True, True, False, True, True]).view(1, 1, 1, 5)
    padded = hf.alibi_attention_mask(keep, slopes, 3, 5, causal=False, dtype=torch.float32)
    assert torch.allclose(padded[0, :, :, [0, 1, 3, 4]], expected[:, :, [0, 1, 3, 4]])
    additive = torch.zeros(2, 1, 3, 5)
    additive[1, ..., 0] = -7.0
    summed = hf.alibi_attention_mask(additive, slopes, 3, 5, causal=False, dtype=torch.float32)
    assert torch.allclose(summed, expected[None] + additive)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_gpt2_attention_is_causal_attention_with_alibi_biases(gpt2, implementation):
    model = gpt2()
    model.set_attn_implementation(implementation)
    assert apply_alibi(model, max_sequence_length=96) == 3  # wpe + 2 attention layers
    attention = model.transformer.h[0].attn
    assert isinstance(attention, hf.AlibiGPT2Attention)
    x = torch.randn(2, 70, 32)  # longer than n_positions=64
    q, k, v = attention.c_attn(x).split(32, dim=2)
    allowed = torch.ones(70, 70, dtype=torch.bool).tril()
    expected = attention.c_proj(reference_attention(q, k, v, 2, reference_bias(2, 70, 70), allowed))
    with torch.no_grad():
        got = model.transformer.h[0].attn(x)[0]
    assert torch.allclose(got, expected.detach(), atol=1e-5)


def test_gpt2_position_embedding_is_zeroed_frozen_resized_and_the_config_follows(gpt2):
    model = gpt2()
    apply_alibi(model, max_sequence_length=96)
    wpe = model.transformer.wpe
    assert wpe.num_embeddings == 96 and not wpe.weight.requires_grad and not bool(wpe.weight.any())
    assert model.config.n_positions == 96 and model.config.max_position_embeddings == 96
    with pytest.warns(NoEffectWarning):
        assert apply_alibi(model, max_sequence_length=96) == 0  # twice = once


# Cached decoding and the full forward do the same float32 arithmetic in other shapes (one query
# against the cached keys instead of a (12, 12) product), so they differ by rounding only: measured
# at most 1.2e-7 on logits of size ~0.5 (a few float32 ulps). 1e-6 leaves room for other CPUs'
# kernels; an ALiBi bias that misses the cached keys is off by 2e-3 to 5e-3.
DECODING_ATOL = 1e-6


def cache_keyword(forward) -> str:
    """The model's name for the key/value cache argument: ``cache`` from transformers 5.24 on."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def cache_of(output):
    return output["cache"] if "cache" in output else output["past_key_values"]


def decode_one_by_one(model, ids, prefix: int) -> torch.Tensor:
    """Logits of ids[:, prefix:], each from a call with one new token and the cache of the ones before."""
    keyword = cache_keyword(model.forward)
    out = model(ids[:, :prefix], use_cache=True)
    steps = []
    for t in range(prefix, ids.shape[1]):
        out = model(ids[:, t:t + 1], use_cache=True, **{keyword: cache_of(out)})
        steps.append(out.logits[:, -1])
    return torch.stack(steps, dim=1)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_gpt2_cached_decoding_matches_the_full_forward(gpt2, implementation):
    model = gpt2().eval()
    model.set_attn_implementation(implementation)
    apply_alibi(model, max_sequence_length=64)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids).logits
        decoded = decode_one_by_one(model, ids, prefix=8)
    assert (decoded - full[:, 8:]).abs().max() <= DECODING_ATOL


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_llama_cached_decoding_matches_the_full_forward(llama, implementation):
    model = llama().eval()
    model.set_attn_implementation(implementation)
    apply_alibi(model, max_sequence_length=64)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(ids).logits
        decoded = decode_one_by_one(model, ids, prefix=8)
    assert (decoded - full[:, 8:]).abs().max() <= DECODING_ATOL


def test_gpt2_generate_with_the_cache_gives_the_logits_of_generate_without_it(gpt2):
    model = gpt2().eval()
    apply_alibi(model, max_sequence_length=64)
    prompt = torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(5))
    runs = {}
    with torch.no_grad():
        for use_cache in (True, False):
            runs[use_cache] = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5,
                                             do_sample=False, use_cache=use_cache, output_logits=True,
                                             return_dict_in_generate=True, pad_token_id=0)
    assert torch.equal(runs[True].sequences, runs[False].sequences)
    cached, recomputed = torch.stack(runs[True].logits), torch.stack(runs[False].logits)
    assert (cached - recomputed).abs().max() <= DECODING_ATOL


@pytest.mark.filterwarnings("ignore:.*past_key_values.*")
@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
def test_gpt2_attention_reads_the_cache_under_its_old_and_new_names(gpt2, keyword):
    """Four queries after eight cached keys, no mask: the bias must span all twelve keys."""
    import transformers
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    if keyword == "cache" and cache_keyword(GPT2Attention.forward) != "cache":
        pytest.skip("transformers before 5.24 names the argument past_key_values only")
    attention = gpt2().eval().transformer.h[0].attn
    attention.config._attn_implementation = "sdpa"
    assert apply_alibi(attention, max_sequence_length=64) == 1
    x = torch.randn(1, 12, 32, generator=torch.Generator().manual_seed(4))
    cache = transformers.DynamicCache()
    with torch.no_grad():
        full = attention(x)[0]
        attention(x[:, :8], **{keyword: cache})
        assert cache.get_seq_length(0) == 8
        chunk = attention(x[:, 8:], **{keyword: cache})[0]
    assert (chunk - full[:, 8:]).abs().max() <= DECODING_ATOL


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_bert_attention_is_bidirectional_alibi_and_respects_padding(bert, implementation):
    model = bert()
    model.set_attn_implementation(implementation)
    assert apply_alibi(model, max_sequence_length=80) == 3  # BertModel's embeddings + 2 layers
    embeddings = model.bert.embeddings
    assert embeddings.position_embeddings.num_embeddings == 80 and not bool(embeddings.position_embeddings.weight.any())
    assert embeddings.position_ids.shape == (1, 80) and model.config.max_position_embeddings == 80

    ids = torch.randint(1, 64, (2, 70), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 70, dtype=torch.long)
    mask[1, 60:] = 0
    captured = {}
    layer = model.bert.encoder.layer[0].attention.self
    hook = layer.register_forward_hook(lambda m, args, kwargs, out: captured.update(x=args[0], out=out[0]),
                                       with_kwargs=True)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    hook.remove()
    x = captured["x"]
    allowed = mask.bool()[:, None, None, :].expand(2, 1, 70, 70)
    expected = reference_attention(layer.query(x), layer.key(x), layer.value(x), 2, reference_bias(2, 70, 70), allowed)
    assert torch.allclose(captured["out"][0], expected[0], atol=1e-5)
    assert torch.allclose(captured["out"][1, :60], expected[1, :60], atol=1e-5)  # padded queries: anything


def test_llama_attention_drops_rotary_for_alibi(llama):
    model = llama()
    assert apply_alibi(model, max_sequence_length=64) == 2  # no position embedding to remove
    layer = model.model.layers[0].self_attn
    assert isinstance(layer, hf.AlibiLlamaAttention)
    captured = {}
    hook = layer.register_forward_hook(lambda m, args, kwargs, out: captured.update(x=kwargs["hidden_states"],
                                                                                    out=out[0]), with_kwargs=True)
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(ids)
        hook.remove()
        x = captured["x"]
        allowed = torch.ones(20, 20, dtype=torch.bool).tril()
        heads = reference_attention(layer.q_proj(x), layer.k_proj(x), layer.v_proj(x), 4, reference_bias(4, 20, 20),
                                    allowed)
        expected = layer.o_proj(heads)
    assert torch.allclose(captured["out"], expected, atol=1e-5)


def test_alibi_from_a_recipe_finds_hf_classes_and_refuses_unsupported_attention(gpt2):
    from composer_bridge import recipes

    alibi = next(a for a in recipes.language("gpt", max_seq_length=64) if isinstance(a, Alibi))
    assert apply_alibi(gpt2(), alibi.max_sequence_length, policy=alibi.policy) == 3
    model = gpt2()
    model.config._attn_implementation = "flash_attention_2"  # what a user would have set on a GPU
    with pytest.raises(ValueError, match="attn_implementation='flash_attention_2'.*sdpa"):
        apply_alibi(model, max_sequence_length=64)


def test_alibi_gpt2_trains_with_gradients_flowing_through_the_bias_path(gpt2):
    model = gpt2()
    apply_alibi(model, max_sequence_length=64)
    ids = torch.randint(0, 64, (2, 16))
    loss = F.cross_entropy(model(ids).logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))
    loss.backward()
    assert model.transformer.wpe.weight.grad is None
    assert model.transformer.h[0].attn.c_attn.weight.grad.abs().sum() > 0
