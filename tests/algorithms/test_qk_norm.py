"""QKNorm: per-head RMSNorm of queries and keys; attention made independent of the scale of W_q and W_k."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import ComposerModule, assert_same_weights, quiet_trainer, weights_of
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import NoEffectWarning, QKNorm
from composer_bridge.algorithms.qk_norm import HeadRMSNorm, QKNormMultiheadAttention, QKNormProjection
from composer_bridge.functional import apply_qk_norm
from composer_bridge.models import GPT

VOCAB, SEQ = 16, 12


def rms_norm_by_hand(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * weight


def test_head_rms_norm_matches_the_formula_and_keeps_the_dtype() -> None:
    norm = HeadRMSNorm(8, eps=1e-3)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2)
    x = torch.randn(3, 4, 8)
    torch.testing.assert_close(norm(x), rms_norm_by_hand(x, norm.weight, 1e-3))
    assert norm(x.bfloat16()).dtype == torch.bfloat16
    assert QKNorm().eps == 1e-6


def scale_query_key_columns(projection: nn.Linear, queries: slice, keys: slice, factor: float) -> None:
    """Multiply the rows of W (and b) that produce the queries and the keys by ``factor``."""
    with torch.no_grad():
        for rows in (queries, keys):
            projection.weight[rows] *= factor
            if projection.bias is not None:
                projection.bias[rows] *= factor


def gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=VOCAB, block_size=SEQ, d_model=16, n_layers=2, n_heads=2)


@pytest.mark.parametrize("normalised", [True, False])
def test_gpt_attention_does_not_depend_on_the_scale_of_wq_and_wk_after_qknorm(normalised: bool) -> None:
    model = gpt()
    if normalised:
        assert apply_qk_norm(model) == 2
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    before = model(tokens)
    for block in model.blocks:
        qkv = block.attn.qkv.projection if normalised else block.attn.qkv
        scale_query_key_columns(qkv, slice(0, 16), slice(16, 32), 7.0)
    after = model(tokens)
    if normalised:
        torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)
    else:
        assert (after - before).abs().max() > 1e-2


def test_the_projection_keeps_its_weights_and_the_values_are_untouched() -> None:
    model = gpt()
    weight = model.blocks[0].attn.qkv.weight
    apply_qk_norm(model)
    wrapped = model.blocks[0].attn.qkv
    assert isinstance(wrapped, QKNormProjection) and wrapped.projection.weight is weight
    x = torch.randn(2, 5, 16)
    out, raw = wrapped(x), wrapped.projection(x)
    torch.testing.assert_close(out[..., 32:], raw[..., 32:])  # values: as they were
    for start in (0, 8, 16, 24):  # each query and key head: RMS-normalised
        torch.testing.assert_close(out[..., start:start + 8], rms_norm_by_hand(raw[..., start:start + 8], 1.0, 1e-6))


def test_surgery_is_idempotent_and_new_parameters_join_the_optimizer() -> None:
    model = gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    count = sum(p.numel() for p in model.parameters())
    assert apply_qk_norm(model, optimizers=optimizer) == 2
    assert sum(p.numel() for p in model.parameters()) == count + 2 * 2 * 8  # q and k scales of 8, two layers
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert all(id(p) in in_optimizer for p in model.parameters())
    with pytest.warns(NoEffectWarning, match=r"QKNorm replaced no module.*already applied"):
        assert apply_qk_norm(model) == 0


def test_a_model_without_attention_warns_with_the_fix() -> None:
    with pytest.warns(NoEffectWarning, match=r"QKNorm replaced no module.*CausalSelfAttention.*policy="):
        assert apply_qk_norm(nn.Sequential(nn.Linear(4, 4))) == 0


@pytest.mark.parametrize("bad", [0, -1e-6, float("nan"), "1e-6"])
def test_a_bad_eps_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"QKNorm\(eps=.*> 0"):
        QKNorm(eps=bad)


# --- nn.MultiheadAttention ------------------------------------------------------------------------
def identity_norms(mha: QKNormMultiheadAttention) -> QKNormMultiheadAttention:
    mha.q_norm, mha.k_norm = nn.Identity(), nn.Identity()  # type: ignore[assignment]
    return mha


MHA_CASES = {
    "batch-first-padding": dict(batch_first=True, key_padding=True),
    "sequence-first-causal": dict(batch_first=False, causal=True),
    "float-mask-weights": dict(batch_first=True, float_mask=True, need_weights=True),
    "per-head-mask": dict(batch_first=True, per_head_mask=True),
    "kdim-vdim": dict(batch_first=True, kdim=6, vdim=5),
    "unbatched": dict(batch_first=True, unbatched=True, need_weights=True),
}


@pytest.mark.parametrize("name", list(MHA_CASES))
def test_the_replacement_computes_what_multihead_attention_does_when_the_norms_are_identity(name: str) -> None:
    case = MHA_CASES[name]
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=case["batch_first"], kdim=case.get("kdim"), vdim=case.get("vdim"))
    ours = identity_norms(QKNormMultiheadAttention.from_multihead_attention(mha))
    assert all(a is b for a, b in zip(ours.parameters(), mha.parameters(), strict=False))  # the same tensors
    n, length = 3, 5
    shape = (length,) if case.get("unbatched") else ((n, length) if case["batch_first"] else (length, n))
    q = torch.randn(*shape, 8)
    k = torch.randn(*shape, case.get("kdim", 8))
    v = torch.randn(*shape, case.get("vdim", 8))
    kwargs: dict[str, Any] = {"need_weights": case.get("need_weights", False)}
    if case.get("key_padding"):
        kwargs["key_padding_mask"] = torch.tensor([[False] * 4 + [True]] * n)
    if case.get("causal"):
        kwargs["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(length)
        kwargs["is_causal"] = True
    if case.get("float_mask"):
        kwargs["attn_mask"] = torch.randn(length, length)
    if case.get("per_head_mask"):
        kwargs["attn_mask"] = torch.rand(n * 2, length, length) > 0.7
        kwargs["attn_mask"][..., 0] = False  # every query may see one key
    expected, expected_weights = mha(q, k, v, **kwargs)
    got, weights = ours(q, k, v, **kwargs)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    if kwargs["need_weights"]:
        torch.testing.assert_close(weights, expected_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("normalised", [True, False])
def test_transformer_encoder_attention_does_not_depend_on_the_scale_of_wq_and_wk(normalised: bool) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    if normalised:
        assert apply_qk_norm(encoder) == 2
        assert all(isinstance(m, QKNormMultiheadAttention) for m in (lay.self_attn for lay in encoder.layers))
    x = torch.randn(2, 6, 8)
    with torch.no_grad():  # the fused inference path would bypass the replaced attention: it is turned off
        before = encoder(x)
        for lay in encoder.layers:
            lay.self_attn.in_proj_weight[:16] *= 5.0
            lay.self_attn.in_proj_bias[:16] *= 5.0
        after = encoder(x)
    if normalised:
        torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)
    else:
        assert (after - before).abs().max() > 1e-2


def test_multihead_attention_with_extra_keys_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"add_bias_kv=True.*Fix: "):
        apply_qk_norm(nn.Sequential(nn.MultiheadAttention(8, 2, add_bias_kv=True)))


# --- in the real Trainer ----------------------------------------------------------------------------
class GPTModule(ComposerModule):
    def __init__(self) -> None:
        super().__init__()
        self.gpt = gpt()

    def forward(self, batch: Any) -> torch.Tensor:
        return self.gpt(batch[0])

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.cross_entropy(outputs.reshape(-1, VOCAB), batch[1].reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def token_loader() -> DataLoader:
    tokens = torch.randint(0, VOCAB, (24, SEQ + 1), generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=8)


def train(epochs: int, tmp_path: Path, ckpt: Path | None = None, save: bool = False) -> tuple[GPTModule, Any]:
    module = GPTModule()
    callback = AlgorithmEngineCallback([QKNorm()])
    trainer = quiet_trainer(max_epochs=epochs, callbacks=[callback], default_root_dir=tmp_path)
    trainer.fit(module, token_loader(), ckpt_path=ckpt)
    if save:
        trainer.save_checkpoint(tmp_path / "one.ckpt")
    return module, callback


def test_training_learns_the_norm_scales_and_resumes_exactly_from_a_checkpoint(tmp_path: Path) -> None:
    full, callback = train(3, tmp_path)
    scales = [p for n, p in full.named_parameters() if n.endswith(("q_norm.weight", "k_norm.weight"))]
    assert len(scales) == 4 and all(not torch.equal(p, torch.ones_like(p)) for p in scales)  # trained
    rows = {(r.algorithm, r.event): r.calls for r in callback.cost_report().rows}
    assert rows[("QKNorm", "INIT")] == 1
    train(1, tmp_path, save=True)
    saved = torch.load(tmp_path / "one.ckpt", weights_only=True)["state_dict"]
    assert "gpt.blocks.0.attn.qkv.q_norm.weight" in saved and "gpt.blocks.1.attn.qkv.k_norm.weight" in saved
    resumed, _ = train(3, tmp_path, ckpt=tmp_path / "one.ckpt")
    assert_same_weights(weights_of(resumed), weights_of(full))


def test_a_checkpoint_loads_into_a_model_with_the_surgery_only(tmp_path: Path) -> None:
    module, _ = train(1, tmp_path, save=True)
    state = torch.load(tmp_path / "one.ckpt", weights_only=True)["state_dict"]
    plain = copy.deepcopy(GPTModule())
    with pytest.raises(RuntimeError, match=r"q_norm"):
        plain.load_state_dict(state)
    apply_qk_norm(plain)
    plain.load_state_dict(state)
    assert_same_weights(weights_of(plain), weights_of(module))


@pytest.mark.parametrize("qk_norm_first", [True, False])
def test_it_composes_with_alibi_in_either_order(qk_norm_first: bool) -> None:
    from composer_bridge.functional import apply_alibi

    model = gpt()
    counts = [apply_qk_norm(model), apply_alibi(model, 32)] if qk_norm_first else [apply_alibi(model, 32),
                                                                                  apply_qk_norm(model)]
    assert sorted(counts) == [2, 3]
    attention = model.blocks[0].attn
    assert type(attention).__name__ == "AlibiCausalSelfAttention" and isinstance(attention.qkv, QKNormProjection)
    assert model(torch.randint(0, VOCAB, (1, 20))).shape == (1, 20, VOCAB)  # longer than block_size: ALiBi works
