"""composer_bridge.surgery: the public model-surgery helpers (Composer's module_surgery, ported)."""

from __future__ import annotations

import doctest

import pytest
import torch
from torch import nn

import composer_bridge.surgery as surgery
from composer_bridge.algorithms import SurgeryAlgorithm
from composer_bridge.surgery import count_module_instances, replace_module_classes


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.shared = nn.Linear(4, 4)
        self.head = nn.Sequential(self.shared, nn.ReLU(), self.shared)  # one module attached twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc2(torch.relu(self.fc1(x))))


def test_replacing_a_class_returns_old_to_new_and_keeps_the_optimizer_in_step():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    old_fc2, old_shared = model.fc2, model.shared

    def narrow(module: nn.Module, index: int) -> nn.Module | None:
        if module.out_features != 4:
            return None  # a policy picks instances by returning None for the others
        new = nn.Linear(module.in_features, 4, bias=False)
        with torch.no_grad():
            new.weight.copy_(module.weight * 2)
        return new

    swapped = replace_module_classes(model, {nn.Linear: narrow}, optimizers=opt)
    assert set(swapped) == {old_fc2, old_shared}
    assert model.fc2 is swapped[old_fc2] and torch.equal(model.fc2.weight, old_fc2.weight * 2)
    assert model.head[0] is model.head[2] is model.shared is swapped[old_shared]  # still shared
    params = {id(p) for group in opt.param_groups for p in group["params"]}
    assert params == {id(p) for p in model.parameters()}  # old parameters out, new ones in
    assert id(old_fc2.weight) not in params
    loss = model(torch.randn(3, 8)).sum()
    loss.backward()
    opt.step()  # the optimizer steps the new modules


def test_replacements_are_not_walked_into():
    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Linear) -> None:
            super().__init__()
            self.inner = inner

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    calls: list[int] = []

    def wrap(module: nn.Module, index: int) -> nn.Module:
        calls.append(index)
        return Wrapper(module)  # holds the Linear it replaced: must not be wrapped again

    swapped = replace_module_classes(model, {nn.Linear: wrap})
    assert calls == [0, 1] and len(swapped) == 2
    assert count_module_instances(model, Wrapper) == 2 and count_module_instances(model, nn.Linear) == 2


def test_counting_counts_each_module_once_and_refuses_a_non_class():
    model = Net()
    assert count_module_instances(model, nn.Linear) == 3  # fc1, fc2 and the shared one (attached twice)
    assert count_module_instances(model, (nn.ReLU, nn.Sequential)) == 2
    assert count_module_instances(model.fc1, nn.Linear) == 1  # the module itself counts
    with pytest.raises(TypeError, match=r"module_class='Linear'.*module class"):
        count_module_instances(model, "Linear")


def test_the_public_module_is_what_the_library_algorithms_use():
    assert surgery.SurgeryAlgorithm is SurgeryAlgorithm
    from composer_bridge.algorithms import _surgery

    assert surgery.replace_modules is _surgery.replace_modules
    result = doctest.testmod(surgery, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 3
