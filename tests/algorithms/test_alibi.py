"""Alibi: distance-biased attention instead of position embeddings; shorter training sequences."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from composer_bridge.algorithms import Alibi, NoEffectWarning
from composer_bridge.algorithms.alibi import AlibiCausalSelfAttention, AlibiMultiheadAttention, alibi_slopes
from composer_bridge.core import Event, Logger, State
from composer_bridge.functional import apply_alibi
from composer_bridge.models import GPT


def gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=16, block_size=8, d_model=16, n_layers=2, n_heads=4)


def attention_by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: list[float],
                      causal: bool) -> torch.Tensor:
    """Per head h: softmax(q k^T / sqrt(d) - slope_h |i - j|, masked) v; q, k, v: (heads, length, d)."""
    heads, length, d = q.shape
    out = torch.empty_like(q)
    for h in range(heads):
        scores = q[h] @ k[h].T / math.sqrt(d)
        for i in range(length):
            for j in range(length):
                scores[i, j] -= slopes[h] * abs(i - j)
                if causal and j > i:
                    scores[i, j] = float("-inf")
        out[h] = torch.softmax(scores, dim=-1) @ v[h]
    return out


def test_slopes_are_the_papers_geometric_sequences() -> None:
    assert alibi_slopes(8) == [2.0 ** -(i + 1) for i in range(8)]
    assert alibi_slopes(6) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]


def test_gpt_attention_gets_the_bias_and_loses_its_position_embedding() -> None:
    model = gpt().eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    old_position = model.pos_emb.weight
    assert apply_alibi(model, max_sequence_length=24, optimizers=opt) == 3
    attention = model.blocks[0].attn
    assert isinstance(attention, AlibiCausalSelfAttention)
    assert model.pos_emb.weight.shape == (24, 16) and not model.pos_emb.weight.requires_grad
    assert not model.pos_emb.weight.any() and model.block_size == 24
    assert not any(p is old_position for p in opt.param_groups[0]["params"])
    x = torch.randn(1, 6, 16)
    q, k, v = attention.qkv(x).split(16, dim=2)
    q, k, v = (t.view(6, 4, 4).transpose(0, 1) for t in (q, k, v))
    heads = attention_by_hand(q, k, v, alibi_slopes(4), causal=True)
    expected = attention.proj(heads.transpose(0, 1).reshape(1, 6, 16))
    torch.testing.assert_close(attention(x), expected, atol=1e-5, rtol=1e-5)
    assert model(torch.randint(0, 16, (2, 20))).shape == (2, 20, 16)  # longer than the old block_size


def test_pytorch_attention_inside_encoder_layers_gets_the_bias_even_in_fused_inference_conditions() -> None:
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True, dropout=0.0), num_layers=1,
        enable_nested_tensor=True,
    )
    assert apply_alibi(encoder, max_sequence_length=16) == 1
    mha = encoder.layers[0].self_attn
    assert isinstance(mha, AlibiMultiheadAttention)
    encoder.eval()
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        encoder(torch.randn(2, 5, 16), src_key_padding_mask=torch.tensor([[False] * 5, [False] * 4 + [True]]))
        q, k, v = (x[0] @ w.T + b for w, b in zip(mha.in_proj_weight.chunk(3), mha.in_proj_bias.chunk(3), strict=True))
        q, k, v = (t.view(5, 4, 4).transpose(0, 1) for t in (q, k, v))
        heads = attention_by_hand(q, k, v, alibi_slopes(4), causal=False)
        expected = mha.out_proj(heads.transpose(0, 1).reshape(1, 5, 16))
        torch.testing.assert_close(mha(x, x, x, need_weights=False)[0], expected, atol=1e-5, rtol=1e-5)
        causal = nn.Transformer.generate_square_subsequent_mask(5)
        expected_causal = mha.out_proj(attention_by_hand(q, k, v, alibi_slopes(4), causal=True).transpose(0, 1)
                                       .reshape(1, 5, 16))
        torch.testing.assert_close(mha(x, x, x, attn_mask=causal)[0], expected_causal, atol=1e-5, rtol=1e-5)


class UserAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def test_users_register_their_attention_classes_through_the_policy_argument() -> None:
    def convert(module: nn.Module, max_sequence_length: int) -> nn.Module:
        module.bias = torch.tensor(alibi_slopes(2))  # changed in place
        return module

    model = nn.Sequential(UserAttention())
    with pytest.warns(NoEffectWarning, match="policy="):
        assert apply_alibi(model, 16) == 0
    assert apply_alibi(model, 16, policy={UserAttention: convert}) == 1 and model[0].bias is not None
    with pytest.raises(TypeError, match="policy entry"):
        Alibi(16, policy={"UserAttention": convert})


def test_training_batches_are_cut_into_shorter_sequences() -> None:
    state = State(nn.Linear(1, 1))
    alibi = Alibi(max_sequence_length=32, train_sequence_length_scaling=0.25)
    tokens = torch.arange(64).view(2, 32)
    state.batch = (tokens, tokens + 1)
    assert alibi.match(Event.AFTER_DATALOADER, state)
    alibi.apply(Event.AFTER_DATALOADER, state, Logger())
    assert state.batch[0].shape == (8, 8) and torch.equal(state.batch[0][1], torch.arange(8, 16))
    assert torch.equal(state.batch[1], state.batch[0] + 1)
    state.batch = {"input_ids": torch.zeros(2, 30)}
    with pytest.raises(ValueError, match="sequence length 30 times 0.25"):
        alibi.apply(Event.AFTER_DATALOADER, state, Logger())
    assert not Alibi(32, train_sequence_length_scaling=1).match(Event.AFTER_DATALOADER, state)


def test_twice_equals_once_and_arguments_are_checked() -> None:
    model = gpt()
    apply_alibi(model, 16)
    keys = list(model.state_dict())
    with pytest.warns(NoEffectWarning):
        assert apply_alibi(model, 16) == 0
    assert list(model.state_dict()) == keys
    with pytest.raises(ValueError, match="max_sequence_length=0"):
        Alibi(0)
    with pytest.raises(ValueError, match="train_sequence_length_scaling=2"):
        Alibi(64, train_sequence_length_scaling=2)
    algorithm = Alibi(max_sequence_length=64, train_sequence_length_scaling=0.5)
    assert eval(repr(algorithm)) == algorithm and Alibi.required_on_load() and Alibi.unique
