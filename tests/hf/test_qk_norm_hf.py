"""QKNorm on Hugging Face models built from tiny configs: GPT-2 and the Llama family."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from helpers.support import L, quiet_trainer
from torch import nn
from torch.utils.data import DataLoader

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import QKNorm
from composer_bridge.algorithms.qk_norm import QKNormProjection
from composer_bridge.functional import apply_qk_norm

if L.__name__.startswith("pytorch_lightning"):
    from composer_bridge.pl import HuggingFaceModel
else:
    from composer_bridge.hf import HuggingFaceModel

VOCAB, LAYERS, SEQ = 64, 2, 10
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4, vocab_size=VOCAB,
             max_position_embeddings=64, pad_token_id=0, bos_token_id=0, eos_token_id=0)


#: family -> (build, [(attention attribute path of layer 0, projection name, query rows, key rows)]) where the
#: rows are those of the projection's weight (nn.Linear: out_features; GPT-2's Conv1D: its transposed weight)
FAMILIES: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], list[tuple[nn.Module, slice | None, slice | None]]]]] = {}


def _separate(attention: nn.Module) -> list[tuple[nn.Module, slice | None, slice | None]]:
    return [(attention.q_proj, slice(None), None), (attention.k_proj, None, slice(None))]


FAMILIES["llama"] = (lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, num_key_value_heads=2)),
                     _separate)
FAMILIES["qwen2"] = (lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL, num_key_value_heads=2)),
                     _separate)
FAMILIES["mistral"] = (lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, num_key_value_heads=2)),
                       _separate)
FAMILIES["gemma"] = (lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(**SMALL, num_key_value_heads=1,
                                                                                      head_dim=8)), _separate)
FAMILIES["phi3"] = (lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(**SMALL, num_key_value_heads=2)),
                    lambda a: [(a.qkv_proj, slice(0, 32), slice(32, 48))])


def _neox_rows(heads: int, head_dim: int, part: int) -> torch.Tensor:
    return torch.cat([torch.arange(h * 3 * head_dim + part * head_dim, h * 3 * head_dim + (part + 1) * head_dim)
                      for h in range(heads)])


FAMILIES["gpt_neox"] = (
    lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**SMALL)),
    lambda a: [(a.query_key_value, _neox_rows(4, 8, 0), _neox_rows(4, 8, 1))],  # type: ignore[list-item]
)
FAMILIES["gpt2"] = (
    lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=LAYERS, n_embd=32, n_head=4, vocab_size=VOCAB,
                                                                 n_positions=64)),
    lambda a: [(a.c_attn, slice(0, 32), slice(32, 64))],
)


def attention_of(model: nn.Module) -> nn.Module:
    if isinstance(model, transformers.GPT2LMHeadModel):
        return model.transformer.h[0].attn
    if isinstance(model, transformers.GPTNeoXForCausalLM):
        return model.gpt_neox.layers[0].attention
    return model.model.layers[0].self_attn


def scale_queries_and_keys(model: nn.Module, family: str, factor: float) -> None:
    """Multiply the weights (and biases) that produce layer 0's queries and keys by ``factor``."""
    with torch.no_grad():
        for projection, queries, keys in FAMILIES[family][1](attention_of(model)):
            if isinstance(projection, QKNormProjection):
                projection = projection.projection
            transposed = type(projection).__name__ == "Conv1D"  # GPT-2: weight is (in, out)
            for rows in (queries, keys):
                if rows is None:
                    continue
                if transposed:
                    projection.weight[:, rows] *= factor
                else:
                    projection.weight[rows] *= factor
                if projection.bias is not None:
                    projection.bias[rows] *= factor


def build(family: str) -> nn.Module:
    torch.manual_seed(0)
    return FAMILIES[family][0]().eval()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_attention_layer_is_normalised_and_the_scale_of_wq_wk_no_longer_matters(family: str) -> None:
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    plain, normed = build(family), build(family)
    assert apply_qk_norm(normed) == LAYERS
    for model, invariant in ((normed, True), (plain, False)):
        with torch.no_grad():
            before = model(ids).logits
            scale_queries_and_keys(model, family, 6.0)
            after = model(ids).logits
        if invariant:
            torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
        else:
            assert (after - before).abs().max() > 1e-3, f"{family}: scaling W_q, W_k changed nothing without QKNorm"


def test_llama_queries_and_keys_reach_the_rotary_embedding_normalised(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.llama import modeling_llama

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    rotary = modeling_llama.apply_rotary_pos_emb

    def recording(q: torch.Tensor, k: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append((q.detach(), k.detach()))
        return rotary(q, k, *args, **kwargs)

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", recording)
    model = build("llama")
    apply_qk_norm(model)
    with torch.no_grad():
        model(torch.randint(0, VOCAB, (2, SEQ)))
    assert len(seen) == LAYERS
    for q, k in seen:  # (batch, heads, sequence, head_dim); the scales are still one
        for states in (q, k):
            rms = states.square().mean(-1).sqrt()
            torch.testing.assert_close(rms, torch.ones_like(rms), rtol=1e-3, atol=1e-3)  # eps: a hair below one


def test_gpt2_cross_attention_normalises_its_separate_query_projection() -> None:
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=64,
                                     add_cross_attention=True)
    model = transformers.GPT2LMHeadModel(config)
    assert apply_qk_norm(model) == 2  # self- and cross-attention
    cross = model.transformer.h[0].crossattention
    assert cross.q_attn.q_norm is not None and cross.c_attn.k_norm is not None and cross.c_attn.q_norm is None
    out = model(torch.randint(0, VOCAB, (1, 6)), encoder_hidden_states=torch.randn(1, 4, 32))
    assert out.logits.shape == (1, 6, VOCAB)


def test_qknorm_trains_a_huggingface_model_and_its_scales_are_in_the_checkpoint(tmp_path: Path) -> None:
    model = build("llama").train()
    module = HuggingFaceModel(model, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(1))
    loader = DataLoader([{"input_ids": ids, "labels": ids}] * 3, batch_size=None)
    trainer = quiet_trainer(max_steps=3, callbacks=[AlgorithmEngineCallback([QKNorm()])], default_root_dir=tmp_path)
    trainer.fit(module, loader)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)["state_dict"]
    key = "model.model.layers.0.self_attn.q_proj.q_norm.weight"
    assert key in state and not torch.equal(state[key], torch.ones(8))
