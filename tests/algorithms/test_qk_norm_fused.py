"""QKNorm on attention with one fused [q | k | v] projection: timm's Attention (its q_norm/k_norm slots), nanoGPT's
c_attn, vit-pytorch's to_qkv; recognised by structure, whatever the class."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers.support import L, quiet_trainer
from helpers.tolerances import assert_within, rounding_bound
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import NoEffectWarning, QKNorm
from composer_bridge.algorithms.qk_norm import HeadRMSNorm, QKNormProjection, fused_qkv_layout
from composer_bridge.functional import apply_qk_norm

DIM, HEADS = 16, 4


class TimmAttention(nn.Module):
    """Written after timm's ``Attention``: fused qkv, optional q/k norms applied per head after the reshape."""

    def __init__(self, qk_norm: bool = False) -> None:
        super().__init__()
        self.num_heads, self.head_dim = HEADS, DIM // HEADS
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.proj = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))


class NanoGPTAttention(nn.Module):
    """Written after nanoGPT's ``CausalSelfAttention``: ``c_attn`` split in three, no norm slots."""

    def __init__(self) -> None:
        super().__init__()
        self.n_head = HEADS
        self.c_attn = nn.Linear(DIM, 3 * DIM)
        self.c_proj = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(DIM, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        return self.c_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c))


def by_hand(attention: nn.Module, projection: nn.Linear, x: torch.Tensor, out: nn.Linear) -> torch.Tensor:
    """The attention with queries and keys RMS-normalised per head (unit scales), computed here."""
    b, n, _ = x.shape
    q, k, v = projection(x).split(DIM, dim=-1)
    q, k, v = (z.view(b, n, HEADS, DIM // HEADS).transpose(1, 2) for z in (q, k, v))
    q, k = (z / torch.sqrt(z.square().mean(-1, keepdim=True) + 1e-6) for z in (q, k))
    causal = isinstance(attention, NanoGPTAttention)
    return out(F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2).reshape(b, n, DIM))


def scale_queries_and_keys(projection: nn.Linear, factor: float) -> None:
    with torch.no_grad():
        projection.weight[: 2 * DIM] *= factor
        projection.bias[: 2 * DIM] *= factor


@pytest.mark.parametrize("cls", [TimmAttention, NanoGPTAttention])
@pytest.mark.parametrize("normalised", [True, False])
def test_fused_qkv_attention_is_normalised_per_head_and_no_longer_depends_on_the_scale_of_wq_and_wk(
        cls: type, normalised: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(cls())
    attention = model[0]
    name = "qkv" if cls is TimmAttention else "c_attn"
    projection, out = getattr(attention, name), attention.proj if cls is TimmAttention else attention.c_proj
    x = torch.randn(2, 6, DIM)

    def exact() -> torch.Tensor:  # by hand, in float64
        return by_hand(attention, copy.deepcopy(projection).double(), x.double(), copy.deepcopy(out).double())

    # What float32 rounding may change (helpers/tolerances.py): the model and by_hand order their sums differently
    # (rsqrt against 1 / sqrt, the attention kernel's blocking, which follows the CPU's vector width). The chain of
    # sums after the shared projection is REDUCTIONS terms end to end: the RMS over a head (4), the scores (4), the
    # softmax (6), the weighted values (6), the output projection (16), and the elementwise steps; each off by at most
    # its length x eps x the magnitudes summed, at most the output projection's row sums of |weight| x the largest
    # |value| (attention averages the values) plus its |bias|.
    reductions = 4 + 4 + 6 + 6 + DIM + 8

    def bound() -> float:
        v = projection(x)[..., 2 * DIM:].abs().max()
        return rounding_bound(reductions, (out.weight.abs().sum(1).max() * v + out.bias.abs().max()).item())

    if normalised:
        assert apply_qk_norm(model) == 1
        assert_within(model(x), exact(), bound(), "the model")
        assert_within(by_hand(attention, projection, x, out), exact(), bound(), "by hand")  # the bound holds for it too
    before, before_exact = model(x), exact()
    scale_queries_and_keys(projection, 9.0)
    changed = (model(x) - before).abs().max()
    if normalised:  # the scale is gone, but for the eps under the RMS (what float64 says it changes) and rounding
        assert changed <= (exact() - before_exact).abs().max() + 2 * bound()
        assert changed < 1e-4
    else:
        assert changed > 1e-2


def test_timm_slots_are_filled_and_the_projection_is_left_as_it_was() -> None:
    attention = TimmAttention()
    qkv = attention.qkv
    assert fused_qkv_layout(attention) == ("qkv", DIM, DIM // HEADS)
    assert apply_qk_norm(nn.Sequential(attention)) == 1
    assert attention.qkv is qkv and isinstance(attention.q_norm, HeadRMSNorm) and isinstance(attention.k_norm, HeadRMSNorm)
    assert attention.q_norm.head_dim == DIM // HEADS
    with pytest.warns(NoEffectWarning):  # twice is once
        assert apply_qk_norm(nn.Sequential(attention)) == 0


def test_nanogpt_projection_is_wrapped() -> None:
    attention = NanoGPTAttention()
    apply_qk_norm(nn.Sequential(attention))
    wrapped = attention.c_attn
    assert isinstance(wrapped, QKNormProjection) and (wrapped.queries, wrapped.keys) == ((0, DIM), (DIM, 2 * DIM))


def test_attention_that_already_normalises_queries_and_keys_is_left_alone() -> None:
    attention = TimmAttention(qk_norm=True)
    with pytest.warns(NoEffectWarning):
        assert apply_qk_norm(nn.Sequential(attention)) == 0
    assert isinstance(attention.q_norm, nn.LayerNorm)


def test_a_linear_named_qkv_without_a_head_count_is_not_taken_for_attention() -> None:
    block = nn.Module()
    block.qkv = nn.Linear(DIM, 3 * DIM)
    assert fused_qkv_layout(block) is None
    block.num_heads = 5  # 16 columns are not a whole number of 5 heads
    assert fused_qkv_layout(block) is None


class ViTModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = TimmAttention()
        self.head = nn.Linear(DIM, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.head(self.attn(x).mean(1)), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def test_a_plain_module_with_timm_attention_trains_the_norm_scales_through_the_callback(tmp_path) -> None:
    data = TensorDataset(torch.randn(32, 6, DIM), torch.randint(0, 3, (32,)))
    module = ViTModule()
    trainer = quiet_trainer(max_steps=4, callbacks=[AlgorithmEngineCallback([QKNorm()])], default_root_dir=tmp_path)
    trainer.fit(module, DataLoader(data, batch_size=8))
    assert isinstance(module.attn.q_norm, HeadRMSNorm)
    assert not torch.equal(module.attn.q_norm.weight, torch.ones(DIM // HEADS))  # in the optimizer, trained
    assert not torch.equal(module.attn.k_norm.weight, torch.ones(DIM // HEADS))
