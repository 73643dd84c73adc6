"""The shared surgery module: matching, placement, shared modules, optimizers, idempotence, docs."""

from __future__ import annotations

import doctest
import importlib

import pytest
import torch
from torch import nn

from composer_bridge.algorithms import replace_modules

SURGERY_MODULES = [
    "composer_bridge.algorithms._surgery", "composer_bridge.algorithms.blurpool",
    "composer_bridge.algorithms.channels_last", "composer_bridge.algorithms.squeeze_excite",
    "composer_bridge.algorithms.stochastic_depth", "composer_bridge.algorithms.ghost_batchnorm",
    "composer_bridge.algorithms.weight_standardization", "composer_bridge.algorithms.factorize",
    "composer_bridge.algorithms.low_precision_layernorm", "composer_bridge.algorithms.low_precision_groupnorm",
    "composer_bridge.algorithms.gated_linear_units", "composer_bridge.algorithms.alibi",
    "composer_bridge.algorithms.gyro_dropout", "composer_bridge.models.gpt",
]


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 2))


def test_replaces_by_class_and_by_predicate_and_reports_each_replacement() -> None:
    model = mlp()
    done = replace_modules(model, {nn.ReLU: lambda m, i: nn.Tanh()})
    assert [r.name for r in done] == ["1", "2.1"]
    assert all(isinstance(r.old, nn.ReLU) and isinstance(r.new, nn.Tanh) for r in done)
    last = model[3]
    done = replace_modules(model, {lambda m: isinstance(m, nn.Linear) and m.out_features == 2: lambda m, i: nn.Identity()})
    assert [(r.name, r.old) for r in done] == [("3", last)] and isinstance(model[3], nn.Identity)


def test_index_counts_matches_per_policy_and_none_keeps_the_module() -> None:
    model = mlp()
    seen = []
    replace_modules(model, {nn.Linear: lambda m, i: seen.append(i)})
    assert seen == [0, 1, 2]
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Sequential", "Linear"]


def test_replacements_take_the_old_modules_device_and_dtype() -> None:
    model = mlp().to(torch.float64)
    replace_modules(model, {nn.Linear: lambda m, i: nn.Linear(m.in_features, m.out_features)})
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    model(torch.randn(2, 3, dtype=torch.float64))


def test_replacements_take_the_old_modules_train_or_eval_mode() -> None:
    model = mlp().eval()
    replace_modules(model, {nn.ReLU: lambda m, i: nn.Dropout(0.5)})
    assert not model[1].training and not model[2][1].training
    x = torch.randn(4, 3)
    assert torch.equal(model(x), model(x))  # evaluation dropout: deterministic


def test_a_module_shared_by_two_parents_stays_shared() -> None:
    relu = nn.ReLU()
    model = nn.Sequential(nn.Sequential(relu), nn.Sequential(relu))
    done = replace_modules(model, {nn.ReLU: lambda m, i: nn.GELU()})
    assert len(done) == 1 and model[0][0] is model[1][0] and isinstance(model[0][0], nn.GELU)


def test_skip_makes_a_second_application_change_nothing() -> None:
    class Wrapped(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    model = mlp()
    policy = {nn.Linear: lambda m, i: Wrapped(m)}
    assert len(replace_modules(model, policy, skip=(Wrapped,))) == 3
    before = repr(model)
    assert replace_modules(model, policy, skip=(Wrapped,)) == []
    assert repr(model) == before


def test_optimizer_drops_removed_parameters_and_their_state_and_gains_new_ones_in_the_same_group() -> None:
    model = mlp()
    head = [model[3].weight, model[3].bias]
    opt = torch.optim.Adam([
        {"params": [p for n, p in model.named_parameters() if not n.startswith("3.")], "lr": 0.1},
        {"params": head, "lr": 0.01},
    ])
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    assert all(p in opt.state for p in head)
    replace_modules(model, {lambda m: m is model[3]: lambda m, i: nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))},
                    optimizers=opt)
    new = list(model[3].parameters())
    assert [id(p) for p in opt.param_groups[1]["params"]] == [id(p) for p in new]
    assert not any(p is q for p in head for q in opt.state)
    assert len(opt.param_groups[0]["params"]) == 4
    model(torch.randn(5, 3)).sum().backward()
    opt.step()  # the optimizer runs on the new parameters


def test_in_place_changes_are_counted_descended_into_and_the_root_cannot_be_swapped() -> None:
    model = mlp()

    def mark(m: nn.Module, i: int) -> nn.Module:
        m.marked = True
        return m

    done = replace_modules(model, {nn.Sequential: mark, nn.ReLU: lambda m, i: nn.Tanh()})
    assert [r.name for r in done] == ["", "1", "2", "2.1"] and done[0].in_place and model.marked
    with pytest.raises(ValueError, match="the model itself"):
        replace_modules(nn.Sequential(nn.ReLU()), {nn.Sequential: lambda m, i: nn.Identity()})


def test_bad_policies_and_ddp_models_are_refused_with_the_fix() -> None:
    with pytest.raises(TypeError, match="nn.Module subclass or a predicate"):
        replace_modules(mlp(), {int: lambda m, i: None})
    with pytest.raises(TypeError, match="must return an nn.Module or None"):
        replace_modules(mlp(), {nn.ReLU: lambda m, i: "relu"})
    with pytest.raises(TypeError, match="optimizers must be"):
        replace_modules(mlp(), {}, optimizers=["sgd"])

    class FakeDDP(nn.parallel.DistributedDataParallel):
        def __init__(self) -> None:
            nn.Module.__init__(self)

    with pytest.raises(TypeError, match="before wrapping"):
        replace_modules(FakeDDP(), {})


@pytest.mark.parametrize("name", SURGERY_MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name, globs=vars(module).copy()):
        runner.run(test)
    assert runner.failures == 0 and runner.tries > 0
