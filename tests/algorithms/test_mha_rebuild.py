"""ALiBi and QKNorm rebuild ``nn.MultiheadAttention`` the same way (``algorithms/_mha.py``): the new module
holds the very parameters of the old one (optimizers and checkpoints stay valid) and keeps its train/eval mode."""

from __future__ import annotations

import pytest
import torch

from composer_bridge.algorithms._mha import rebuild_multihead_attention
from composer_bridge.algorithms.alibi import AlibiMultiheadAttention
from composer_bridge.algorithms.qk_norm import QKNormMultiheadAttention


@pytest.mark.parametrize("cls", [AlibiMultiheadAttention, QKNormMultiheadAttention])
@pytest.mark.parametrize("training", [True, False])
def test_the_rebuilt_attention_shares_every_parameter_and_keeps_the_mode(cls, training) -> None:
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True, kdim=16, vdim=16).train(training)
    before = {name: p for name, p in mha.named_parameters()}
    new = cls.from_multihead_attention(mha)
    after = dict(new.named_parameters())
    for name, param in before.items():
        assert after[name] is param, name  # the same tensor, not a copy
    assert new.training is training and new.batch_first and new.num_heads == 4
    assert all(p.device.type == "cpu" for p in new.parameters())  # nothing left on the meta device


def test_a_plain_rebuild_computes_what_the_original_computes() -> None:
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True, add_bias_kv=True).eval()
    twin = rebuild_multihead_attention(torch.nn.MultiheadAttention, mha)
    x = torch.randn(2, 5, 16)
    assert torch.equal(twin(x, x, x)[0], mha(x, x, x)[0])
    assert twin.bias_k is mha.bias_k


@pytest.mark.parametrize("register", ["register_alibi_policy", "register_qk_norm_policy", "register_glu_policy"])
def test_each_surgery_registry_refuses_what_is_not_a_module_class_and_takes_a_class_into_its_default_policy(register):
    import composer_bridge.algorithms.alibi as alibi
    import composer_bridge.algorithms.gated_linear_units as glu
    import composer_bridge.algorithms.qk_norm as qk_norm

    module = {"register_alibi_policy": alibi, "register_qk_norm_policy": qk_norm, "register_glu_policy": glu}[register]
    default = {"register_alibi_policy": alibi.default_alibi_policy, "register_qk_norm_policy": qk_norm.default_qk_norm_policy,
               "register_glu_policy": glu.default_glu_policy}[register]
    with pytest.raises(TypeError, match=f"{register}\\(3, .*needs an nn.Module subclass and a function"):
        getattr(module, register)(3, lambda m, n: None)

    class Custom(torch.nn.Module):
        pass

    def convert(*args):
        return None

    getattr(module, register)(Custom, convert)
    try:
        assert default()[Custom] is convert
    finally:
        module._POLICIES._registered.pop(Custom)
    assert Custom not in default()
