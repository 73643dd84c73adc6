"""GatedLinearUnits: feed-forward blocks become act(G x) * (V x) then W, in the GPT and in PyTorch layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from composer_bridge.algorithms import GatedLinearUnits, NoEffectWarning
from composer_bridge.algorithms.gated_linear_units import GatedFeedForward, GatedProjection
from composer_bridge.functional import apply_gated_linear_units
from composer_bridge.models import GPT


def gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=16, block_size=8, d_model=16, n_layers=2, n_heads=2)


def test_gpt_feed_forward_becomes_a_gated_unit_with_the_blocks_own_activation() -> None:
    model = gpt().eval()
    old = model.blocks[0].mlp
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert apply_gated_linear_units(model, optimizers=opt) == 2
    glu = model.blocks[0].mlp
    assert isinstance(glu, GatedFeedForward)
    assert glu.gate.gated_layer.bias is None and glu.gate.non_gated_layer.bias is None  # Composer's defaults
    x = torch.randn(2, 5, 16)
    g, v, w = glu.gate.gated_layer.weight, glu.gate.non_gated_layer.weight, glu.wo
    expected = (F.gelu(x @ g.T) * (x @ v.T)) @ w.weight.T + w.bias
    torch.testing.assert_close(glu(x), expected)
    in_opt = {id(p) for p in opt.param_groups[0]["params"]}
    assert in_opt == {id(p) for p in model.parameters()} and id(old.fc1.weight) not in in_opt


def test_a_named_activation_replaces_the_models_own() -> None:
    model = gpt()
    apply_gated_linear_units(model, act_fn="silu", gated_layer_bias=True)
    gate = model.blocks[1].mlp.gate
    assert isinstance(gate.act, nn.SiLU) and gate.gated_layer.bias is not None


def test_pytorch_encoder_layers_get_gated_and_still_run_in_fused_inference_conditions() -> None:
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True, dropout=0.0), num_layers=2,
        enable_nested_tensor=True,
    )
    assert apply_gated_linear_units(encoder) == 2
    layer = encoder.layers[0]
    assert isinstance(layer.linear1, GatedProjection)
    encoder.eval()
    x = torch.randn(2, 5, 16)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():  # the conditions of PyTorch's fused path, which would bypass the new layer
        encoder(x, src_key_padding_mask=padding)
        h = layer.norm1(x + layer.self_attn(x, x, x, need_weights=False)[0])
        gate = layer.linear1
        ff = layer.linear2(F.relu(gate.gated_layer(h)) * gate.non_gated_layer(h))
        torch.testing.assert_close(layer(x), layer.norm2(h + ff))


class UserFFN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def test_users_register_their_feed_forward_class_through_the_policy_argument() -> None:
    def convert(module: nn.Module, act_fn, gated_layer_bias: bool, non_gated_layer_bias: bool) -> nn.Module:
        return GatedFeedForward(8, 32, act_fn or nn.ReLU(), 0.0, gated_layer_bias, non_gated_layer_bias)

    model = nn.Sequential(UserFFN(), UserFFN())
    with pytest.warns(NoEffectWarning):
        assert apply_gated_linear_units(model) == 0
    assert apply_gated_linear_units(model, policy={UserFFN: convert}) == 2
    assert isinstance(model[0], GatedFeedForward)
    algorithm = GatedLinearUnits(policy={UserFFN: convert})
    assert algorithm.policy == {UserFFN: convert}


def test_twice_equals_once_and_arguments_are_checked() -> None:
    model = gpt()
    apply_gated_linear_units(model)
    keys = list(model.state_dict())
    with pytest.warns(NoEffectWarning):
        assert apply_gated_linear_units(model) == 0
    assert list(model.state_dict()) == keys
    with pytest.raises(ValueError, match="act_fn='swiglu'"):
        GatedLinearUnits(act_fn="swiglu")
    with pytest.raises(TypeError, match="gated_layer_bias=1"):
        GatedLinearUnits(gated_layer_bias=1)
    with pytest.raises(TypeError, match="policy entry"):
        GatedLinearUnits(policy={"FFN": print})
    algorithm = GatedLinearUnits(act_fn="gelu", non_gated_layer_bias=True)
    assert eval(repr(algorithm)) == algorithm and GatedLinearUnits.required_on_load() and GatedLinearUnits.unique
