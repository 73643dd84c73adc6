"""Factorize: low-rank pairs initialised from the SVD; exact at full rank, replaced only where it pays."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from composer_bridge.algorithms import Factorize, NoEffectWarning
from composer_bridge.algorithms.factorize import FactorizedConv2d, FactorizedLinear, factorizing_could_speedup
from composer_bridge.functional import apply_factorization, factorize_conv2d, factorize_matrix
from composer_bridge.models import GPT


def _rank_r(out: int, fan_in: int, r: int) -> torch.Tensor:
    return torch.randn(out, r) @ torch.randn(r, fan_in)


def test_a_linear_whose_weight_has_rank_k_is_reproduced_exactly_at_rank_k() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(12, 10)
    with torch.no_grad():
        linear.weight.copy_(_rank_r(10, 12, 3))
    low = FactorizedLinear.from_linear(linear, latent_features=3)
    x = torch.randn(5, 12)
    torch.testing.assert_close(low(x), linear(x), atol=1e-5, rtol=1e-5)


def test_a_conv_whose_weight_has_rank_k_is_reproduced_exactly_at_rank_k() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1)
    with torch.no_grad():
        conv.weight.copy_(_rank_r(6, 36, 2).reshape(6, 4, 3, 3))
    low = FactorizedConv2d.from_conv2d(conv, latent_channels=2)
    x = torch.randn(2, 4, 9, 9)
    torch.testing.assert_close(low(x), conv(x), atol=1e-5, rtol=1e-5)


def test_low_rank_factors_are_the_truncated_svd() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(16, 16, bias=False)
    low = FactorizedLinear.from_linear(linear, latent_features=3)
    product = low.module1.weight @ low.module0.weight
    u, s, vh = torch.linalg.svd(linear.weight.detach().double())
    best = (u[:, :3] * s[:3]) @ vh[:3]  # Eckart-Young: the closest rank-3 matrix
    torch.testing.assert_close(product.double(), best, atol=1e-5, rtol=1e-5)


def test_surgery_replaces_only_layers_wide_enough_and_where_it_saves_work() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3), nn.Conv2d(16, 4, 1), nn.Flatten(), nn.Linear(64, 64), nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    old = [model[0].weight, model[3].weight]
    n = apply_factorization(model, min_channels=8, latent_channels=0.25, min_features=16, latent_features=0.25,
                            optimizers=opt)
    assert n == 2 and isinstance(model[0], FactorizedConv2d) and isinstance(model[3], FactorizedLinear)
    assert isinstance(model[1], nn.Conv2d) and isinstance(model[4], nn.Linear)  # too narrow
    assert model[0].latent_channels == 4 and model[3].latent_features == 16
    in_opt = {id(p) for p in opt.param_groups[0]["params"]}
    assert in_opt == {id(p) for p in model.parameters()} and not any(id(p) in in_opt for p in old)
    assert not factorizing_could_speedup(nn.Linear(8, 8), 4)  # 2 * 8 * 4 multiply-adds = 8 * 8
    assert factorizing_could_speedup(nn.Linear(8, 8), 3)


def test_tied_weights_and_attention_projections_are_left_alone_and_twice_equals_once() -> None:
    torch.manual_seed(0)
    gpt = GPT(vocab_size=64, block_size=8, d_model=64, n_layers=1, n_heads=2)
    apply_factorization(gpt, min_features=32, latent_features=8)
    assert isinstance(gpt.head, nn.Linear) and gpt.head.weight is gpt.tok_emb.weight
    assert isinstance(gpt.blocks[0].mlp.fc1, FactorizedLinear)
    mha = nn.Sequential(nn.MultiheadAttention(64, 2))
    with pytest.warns(NoEffectWarning):
        assert apply_factorization(mha, min_features=32, latent_features=8) == 0
    before = copy.deepcopy(gpt.state_dict())
    with pytest.warns(NoEffectWarning):
        assert apply_factorization(gpt, min_features=32, latent_features=8) == 0
    assert gpt.state_dict().keys() == before.keys()


def test_bad_arguments_are_named_and_repr_evaluates_back() -> None:
    with pytest.raises(ValueError, match="latent_channels=1.5"):
        Factorize(latent_channels=1.5)
    with pytest.raises(ValueError, match=r"min_features=-1\).*>= 0"):
        Factorize(min_features=-1)
    assert Factorize(min_channels=0, min_features=0).min_features == 0  # Composer accepts 0: no minimum
    with pytest.raises(ValueError, match=r"latent_features=9\).*between 1 and 4"):
        FactorizedLinear(12, 7, latent_features=9)
    algorithm = Factorize(factorize_convs=False, min_features=32, latent_features=0.5)
    assert eval(repr(algorithm)) == algorithm and Factorize.required_on_load() and Factorize.unique
    assert Factorize().min_channels == 256 and Factorize().latent_features == 128  # Composer's class defaults


class _Aliased(nn.Module):
    """A model that reaches the same convolution and linear layer under two names each (common in real code)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(64, 64)
        self.layers = nn.ModuleList([self.conv1, nn.ReLU(), self.fc])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers[1](self.conv1(x))
        return self.fc(x.mean(dim=(2, 3)).repeat(1, 4))


def test_a_module_reachable_under_two_names_is_factorised_once_and_stays_shared() -> None:
    torch.manual_seed(0)
    model = _Aliased()
    n = apply_factorization(model, min_channels=8, latent_channels=4, min_features=16, latent_features=8)
    assert n == 2
    assert isinstance(model.conv1, FactorizedConv2d) and model.layers[0] is model.conv1
    assert isinstance(model.fc, FactorizedLinear) and model.layers[2] is model.fc
    assert model(torch.randn(2, 16, 6, 6)).shape == (2, 64)


def test_truly_shared_parameters_between_two_modules_are_still_left_alone() -> None:
    first, second = nn.Linear(64, 64), nn.Linear(64, 64)
    second.weight = first.weight
    model = nn.Sequential(first, nn.ReLU(), second, nn.Linear(64, 64))
    assert apply_factorization(model, min_features=16, latent_features=8) == 1
    assert model[0] is first and model[2] is second and isinstance(model[3], FactorizedLinear)


@pytest.mark.parametrize(("sizes", "largest"), [((8, 8, 4), 3), ((7, 5, 3), 2), ((10, 10, 0.5), 4)])
def test_latent_sizes_that_save_no_multiply_adds_are_refused_with_the_allowed_range(sizes: tuple, largest: int) -> None:
    n_in, n_out, latent = sizes
    with pytest.raises(ValueError, match=rf"latent_features={latent}\).*between 1 and {largest}\b"):
        FactorizedLinear(n_in, n_out, latent_features=latent)
    with pytest.raises(ValueError, match=rf"latent_channels={latent}\).*between 1 and {largest}\b"):
        FactorizedConv2d(n_in, n_out, 1, latent_channels=latent)
    assert FactorizedLinear.max_allowed_latent_features(n_in, n_out) == largest
    assert FactorizedConv2d.max_allowed_latent_channels(n_in, n_out, 1) == largest
    # the largest allowed size costs fewer multiply-adds than the original layer; one more does not
    assert largest * (n_in + n_out) < n_in * n_out <= (largest + 1) * (n_in + n_out)
    with pytest.raises(NotImplementedError, match="groups=2"):
        FactorizedConv2d(8, 8, 3, latent_channels=2, groups=2)


def test_composer_argument_order_and_method_names() -> None:
    layer = FactorizedLinear(36, 40, False, 8)  # in, out, bias, latent_features
    assert layer.module1.bias is None and layer.latent_features == 8 and layer.in_features == 36
    assert FactorizedLinear.max_allowed_latent_channels(36, 40) == FactorizedLinear.max_allowed_latent_features(36, 40)
    linear = nn.Linear(36, 40)
    assert FactorizedLinear.from_linear(linear, 0, latent_features=8).latent_features == 8  # (module, module_ix, ...)
    assert factorizing_could_speedup(layer, 4) and not factorizing_could_speedup(layer, 8)


def _low_rank_outputs(layer: FactorizedLinear | FactorizedConv2d, rank: int) -> None:
    """Make the layer's product have rank ``rank`` although its latent size is larger."""
    with torch.no_grad():
        w0 = layer.module0.weight
        w0[rank:] = torch.einsum("ij,j...->i...", torch.randn(w0.shape[0] - rank, rank), w0[:rank])


def test_set_rank_shrinks_a_linear_and_keeps_its_outputs_when_they_fit_the_new_rank() -> None:
    torch.manual_seed(0)
    layer = FactorizedLinear(36, 40, latent_features=16)
    _low_rank_outputs(layer, 5)
    x = torch.randn(64, 36)
    before = layer(x)
    layer.set_rank(x, 12)
    assert layer.module0.weight.shape == (12, 36) and layer.module1.weight.shape == (40, 12)
    assert layer.module0.out_features == 12 and layer.module1.in_features == 12 and layer.latent_features == 12
    layer.set_rank(x, 5)
    assert layer.latent_features == 5 and layer.module0.weight.shape == (5, 36)
    torch.testing.assert_close(layer(x), before, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=r"set_rank\(rank=6\).*between 1 and the current latent size 5"):
        layer.set_rank(x, 6)
    parameters = list(layer.parameters())
    layer.set_rank(x, 5)  # the current rank: nothing changes
    assert all(p is q for p, q in zip(parameters, layer.parameters(), strict=True))


def test_set_rank_shrinks_a_strided_conv_and_keeps_its_outputs_when_they_fit_the_new_rank() -> None:
    torch.manual_seed(0)
    layer = FactorizedConv2d(12, 10, 3, latent_channels=8, stride=2, padding=1)
    _low_rank_outputs(layer, 3)
    x = torch.randn(2, 12, 9, 9)
    before = layer(x)
    layer.set_rank(x, 3)
    assert layer.module0.weight.shape == (3, 12, 3, 3) and layer.module1.weight.shape == (10, 3, 1, 1)
    assert layer.latent_channels == 3 and layer.module0.out_channels == 3
    torch.testing.assert_close(layer(x), before, atol=1e-4, rtol=1e-4)


def test_set_rank_fits_as_well_as_the_best_rank_k_map_on_the_data() -> None:
    torch.manual_seed(0)
    layer = FactorizedLinear(24, 20, latent_features=10)
    x = torch.randn(400, 24)
    target = layer(x).detach()
    layer.set_rank(x, 4)
    error = (layer(x) - target).pow(2).sum()
    # independent reference: reduced-rank regression (project the least-squares fit on its top-4 directions)
    xc = torch.cat([x, torch.ones(400, 1)], dim=1).double()
    fitted = xc @ torch.linalg.lstsq(xc, target.double()).solution
    centred = fitted - fitted.mean(dim=0)
    v = torch.linalg.svd(centred, full_matrices=False).Vh[:4]
    best = ((centred @ v.T @ v + fitted.mean(dim=0)) - target.double()).pow(2).sum()
    assert error <= best * 1.02 + 1e-6, (float(error), float(best))


def test_factorize_matrix_edge_cases_and_error_falls_with_rank_and_iterations() -> None:
    torch.manual_seed(0)
    x, w, bias = torch.randn(100, 32), torch.randn(32, 24), torch.randn(24)
    y = x @ w + bias
    wide = factorize_matrix(x, y, w, bias=bias, rank=24)  # as wide as the output: no factorisation
    assert wide.rank == -1 and wide.Wb is None and wide.Wa.shape == (32, 24)
    torch.testing.assert_close(x @ wide.Wa + wide.bias, y, atol=1e-4, rtol=1e-4)
    wa, wb = torch.randn(32, 8), torch.randn(8, 24)
    same = factorize_matrix(x, x @ wa @ wb, wa, wb, rank=8)  # not below the current latent size
    assert same.rank == -1 and torch.equal(same.Wa, wa) and torch.equal(same.Wb, wb)
    by_rank = [factorize_matrix(x, y, w, bias=bias, rank=k).nmse for k in (1, 4, 8, 16)]
    assert all(a >= b for a, b in zip(by_rank, by_rank[1:], strict=False)) and by_rank[-1] < 1
    by_iters = [factorize_matrix(x, y, w, bias=bias, rank=4, n_iters=n).nmse for n in (0, 1, 2, 4)]
    assert all(a >= b - 1e-7 for a, b in zip(by_iters, by_iters[1:], strict=False))
    solution = factorize_matrix(x, y, w, bias=bias, rank=4)
    fit = x @ solution.Wa @ solution.Wb + solution.bias
    assert solution.nmse == pytest.approx(float((fit - y).pow(2).mean() / y.var()), rel=1e-4)


def test_factorize_conv2d_reports_the_error_of_the_two_convolutions_it_returns() -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 6, 10, 10), torch.randn(8, 6, 3, 3), torch.randn(8)
    y = torch.nn.functional.conv2d(x, w, b, stride=2, padding=1)
    solution = factorize_conv2d(x, w, rank=3, biasA=b, stride=2, padding=1)
    assert solution.Wa.shape == (3, 6, 3, 3) and solution.Wb.shape == (8, 3, 1, 1) and solution.rank == 3
    fit = torch.nn.functional.conv2d(torch.nn.functional.conv2d(x, solution.Wa, stride=2, padding=1),
                                     solution.Wb, solution.bias)
    assert 0 < solution.nmse < 1
    assert solution.nmse == pytest.approx(float((fit - y).pow(2).mean() / y.var()), rel=1e-4)
    with pytest.raises(RuntimeError, match="biasB"):
        factorize_conv2d(x, w, rank=3, biasB=b)


def test_low_rank_docstring_examples_run() -> None:
    import doctest

    from composer_bridge.algorithms import _low_rank

    assert doctest.testmod(_low_rank, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0


def test_factorize_conv2d_edge_cases_return_the_plain_or_current_convolution() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 4, 6, 6)
    wa, wb, ba, bb = torch.randn(3, 4, 3, 3), torch.randn(5, 3, 1, 1), torch.randn(3), torch.randn(5)
    current = factorize_conv2d(x, wa, wb, rank=3, biasA=ba, biasB=bb)  # not below the current latent size
    assert current.rank == -1 and torch.equal(current.Wa, wa) and torch.equal(current.Wb, wb)
    plain = factorize_conv2d(x, torch.randn(5, 4, 3, 3), rank=5)  # as wide as the output: one convolution
    assert plain.rank == -1 and plain.Wb is None and plain.Wa.shape == (5, 4, 3, 3)
    shrunk = factorize_conv2d(x, wa, wb, rank=2, biasA=ba, biasB=bb, padding=1)
    two = torch.nn.functional.conv2d(torch.nn.functional.conv2d(x, wa, ba, padding=1), wb, bb)
    fit = torch.nn.functional.conv2d(torch.nn.functional.conv2d(x, shrunk.Wa, padding=1), shrunk.Wb, shrunk.bias)
    assert shrunk.nmse == pytest.approx(float((fit - two).pow(2).mean() / two.var()), rel=1e-4) and shrunk.nmse < 1
