"""Numbers that a broken implementation would get wrong, checked against independent computations.

- EMA with ``update_interval`` > 1 (the recipes use ``'20ba'``) against Lightning's own
  ``EMAWeightAveraging`` driven on the same schedule;
- MixUp/CutMix ``interpolate_loss=True``: the *gradient* equals that of the hand-written mixed loss.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import L, image_loader, quiet_trainer, tiny_classifier

import composer_bridge.algorithms as library
from composer_bridge import AlgorithmEngineCallback, Event
from composer_bridge.core.state import State

weight_averaging = pytest.importorskip(f"{L.__name__}.callbacks.weight_averaging")


class EveryNthStep(weight_averaging.EMAWeightAveraging):
    """Lightning's EMA machinery on Composer's schedule: first update at step 1, then every n-th step."""

    def __init__(self, decay: float, n: int) -> None:
        super().__init__(decay=decay, use_buffers=False)
        self.n = n

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and (step_idx == 0 or (step_idx + 1) % self.n == 0)


def test_ema_with_an_update_interval_equals_lightnings_ema_weight_averaging() -> None:
    n, half_life = 3, 6
    ours = library.EMA(half_life=f"{half_life}ba", update_interval=f"{n}ba")
    model_a = tiny_classifier()
    quiet_trainer(max_steps=10, max_epochs=2, callbacks=[AlgorithmEngineCallback([ours])]).fit(model_a, image_loader(n=64, batch_size=8))
    decay = 2.0 ** (-n / half_life)
    assert ours.smoothing_for(None) == pytest.approx(decay)
    theirs = EveryNthStep(decay, n)
    model_b = tiny_classifier()
    quiet_trainer(max_steps=10, max_epochs=2, callbacks=[theirs]).fit(model_b, image_loader(n=64, batch_size=8))
    averaged = dict(theirs._average_model.module.named_parameters())
    assert ours.num_updates == 1 + 10 // n  # steps 1, 3, 6, 9
    ema = ours.ema_weights
    for name, tensor in averaged.items():
        assert torch.allclose(ema[name], tensor.detach(), atol=1e-6, rtol=1e-5), name


@pytest.mark.parametrize("name", ["MixUp", "CutMix"])
def test_interpolate_loss_gives_the_gradient_of_the_mixed_loss(name: str) -> None:
    torch.manual_seed(0)
    model = tiny_classifier()
    x = torch.randn(8, 1, 8, 8)
    y = torch.randint(0, 4, (8,))
    algorithm = getattr(library, name)(alpha=1.0, interpolate_loss=True)
    state = State(model, algorithms=[algorithm], seed=4)
    state.batch = (x, y)
    algorithm.apply(Event.BEFORE_FORWARD, state, None)  # mixes the inputs, remembers lambda and the permutation
    mixed_x = state.batch[0]
    state.outputs = model(state.batch)
    state.loss = model.loss(state.outputs, state.batch)
    algorithm.apply(Event.BEFORE_BACKWARD, state, None)  # interpolates the loss
    model.zero_grad()
    state.loss.backward()
    ours = [p.grad.clone() for p in model.parameters()]
    # The same loss by hand: lambda * CE(y) + (1 - lambda) * CE(y[permutation]), on the same mixed inputs.
    lam, permutation = _mixing_of(algorithm, x, mixed_x)
    model.zero_grad()
    logits = model((mixed_x, y))
    expected = lam * F.cross_entropy(logits, y) + (1 - lam) * F.cross_entropy(logits, y[permutation])
    expected.backward()
    for got, want in zip(ours, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(got, want, atol=1e-6), "interpolate_loss gradient differs from the mixed loss's"
    assert not torch.allclose(ours[0], _plain_gradient(model, mixed_x, y)), "the check can fail: plain CE differs"


def _mixing_of(algorithm: Any, x: torch.Tensor, mixed: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The weight of each example's own target and the partner permutation the algorithm drew."""
    permutation = algorithm.indices
    if isinstance(algorithm, library.MixUp):
        lam = 1.0 - algorithm.mixing
        assert torch.allclose(mixed, lam * x + (1 - lam) * x[permutation]), "MixUp mixed the inputs so"
    else:  # CutMix: the fraction of the image that is still its own
        lam = algorithm.area
        kept = (mixed == x).flatten(1).float().mean().item()
        assert abs(kept - lam) < 0.2
    return float(lam), permutation


def _plain_gradient(model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    F.cross_entropy(model((x, y)), y).backward()
    return next(model.parameters()).grad.clone()
