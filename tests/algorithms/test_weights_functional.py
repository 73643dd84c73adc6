"""EMA, SWA, SAM, GradientClipping and LayerFreezing: formulas, validation and behaviour in a Trainer."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from helpers.support import image_loader, quiet_trainer, tiny_classifier

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event, State
from composer_bridge.algorithms.ema import EMA, compute_ema
from composer_bridge.algorithms.gradient_clipping import GradientClipping, apply_gradient_clipping
from composer_bridge.algorithms.layer_freezing import LayerFreezing, freeze_layers
from composer_bridge.algorithms.sam import SAM
from composer_bridge.algorithms.swa import SWA


def test_compute_ema_follows_the_formula() -> None:
    torch.manual_seed(0)
    model, average = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    expected = {k: 0.9 * average.state_dict()[k] + 0.1 * v for k, v in model.state_dict().items()}
    compute_ema(model, average, smoothing=0.9)
    for k, v in average.state_dict().items():
        torch.testing.assert_close(v, expected[k])


def _grads(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(4, 3, generator=g)), torch.nn.Parameter(torch.randn(4, generator=g))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 5
    return params


def test_gradient_clipping_by_norm_and_value_follow_their_formulas() -> None:
    params = _grads()
    total = torch.sqrt(sum((p.grad**2).sum() for p in params))
    expected = [p.grad * min(1.0, 0.5 / float(total)) for p in params]
    apply_gradient_clipping(params, "norm", 0.5)
    for p, e in zip(params, expected, strict=False):
        torch.testing.assert_close(p.grad, e, rtol=1e-5, atol=1e-6)
    params = _grads()
    expected = [p.grad.clamp(-0.3, 0.3) for p in params]
    apply_gradient_clipping(params, "value", 0.3)
    for p, e in zip(params, expected, strict=False):
        torch.testing.assert_close(p.grad, e)


def test_adaptive_clipping_is_unit_wise_as_in_the_paper() -> None:
    params = _grads()
    threshold = 0.01
    expected = []
    for p in params:  # per output row: clip ||g_i|| to threshold * max(||w_i||, 1e-3)
        rows_w = p.detach().reshape(p.shape[0], -1) if p.ndim > 1 else p.detach().reshape(1, -1)
        rows_g = p.grad.reshape(rows_w.shape)
        out = []
        for w, g in zip(rows_w, rows_g, strict=False):
            limit = threshold * max(float(w.norm()), 1e-3)
            out.append(g * min(1.0, limit / max(float(g.norm()), 1e-6)))
        expected.append(torch.stack(out).reshape(p.shape))
    apply_gradient_clipping(params, "adaptive", threshold)
    for p, e in zip(params, expected, strict=False):
        torch.testing.assert_close(p.grad, e, rtol=1e-4, atol=1e-6)


def test_freeze_layers_freezes_the_first_layers_and_leaves_the_optimizer() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    depth, fraction = freeze_layers(model, optimizer, current_duration=1.0, freeze_start=0.0, freeze_level=1.0)
    assert depth == 2 and fraction == 1.0
    assert [p.requires_grad for p in model.parameters()] == [False, False, False, False, True, True]
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in model[2].parameters()}


@pytest.mark.parametrize(
    ("factory", "name"),
    [
        (lambda: EMA(smoothing=1.5), "smoothing"),
        (lambda: GradientClipping("sideways", 1.0), "clipping_type"),
        (lambda: GradientClipping("norm", -1.0), "clipping_threshold"),
        (lambda: LayerFreezing(freeze_start=2.0), "freeze_start"),
        (lambda: SAM(rho=-0.1), "rho"),
        (lambda: SWA(swa_start="garbage"), "swa_start"),
    ],
)
def test_bad_hyperparameters_are_named(factory: Any, name: str) -> None:
    with pytest.raises((ValueError, TypeError), match=name):
        factory()


@pytest.mark.parametrize("factory", [EMA, SWA, SAM, lambda: GradientClipping("norm", 1.0), LayerFreezing])
def test_repr_evaluates_back_to_an_equal_algorithm(factory: Any) -> None:
    algorithm = factory()
    assert eval(repr(algorithm), {"EMA": EMA, "SWA": SWA, "SAM": SAM, "GradientClipping": GradientClipping,
                                  "LayerFreezing": LayerFreezing}) == algorithm


class WeightsAtEval(Algorithm):
    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def match(self, event: Event, state: State) -> bool:
        return event == Event.EVAL_BATCH_START

    def apply(self, event: Event, state: State, logger: Any) -> None:
        self.seen.append(state.model.module.fc.weight.detach().clone())


def test_ema_weights_are_swapped_in_for_validation_and_out_for_training() -> None:
    ema, probe = EMA(half_life="2ba", update_interval="1ba"), WeightsAtEval()
    model = tiny_classifier()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=1,
                            callbacks=[AlgorithmEngineCallback([ema, probe])])
    trainer.fit(model, image_loader(), image_loader(n=16))
    training_weight = model.module.fc.weight.detach()
    averaged = ema.ema_weights["module.fc.weight"]
    assert torch.equal(probe.seen[-1], averaged.to(probe.seen[-1].dtype)), "validation ran on the EMA weights"
    assert not torch.equal(training_weight, averaged), "training weights are back after validation"


class WeightsAtFirstBatchEnd(Algorithm):
    """The training weights when EMA takes its first average (the end of the first step)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] | None = None

    def match(self, event: Event, state: State) -> bool:
        return event == Event.BATCH_END and self.weights is None

    def apply(self, event: Event, state: State, logger: Any) -> None:
        self.weights = {k: v.detach().clone() for k, v in state.model.named_parameters()}


def test_smoothing_one_keeps_the_first_average_for_the_whole_run() -> None:
    model, average = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    before = copy.deepcopy(average.state_dict())
    compute_ema(model, average, smoothing=1.0)
    assert all(torch.equal(v, before[k]) for k, v in average.state_dict().items())

    ema, probe = EMA(half_life=None, smoothing=1.0), WeightsAtFirstBatchEnd()
    model = tiny_classifier()
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=3, callbacks=[AlgorithmEngineCallback([ema, probe])])
    trainer.fit(model, image_loader())  # a known run length: the long-half-life check must not divide by log(1)
    averaged, first = ema.ema_weights, probe.weights
    assert averaged is not None and first is not None and ema.num_updates == 6
    for name, tensor in first.items():
        assert torch.equal(averaged[name], tensor), name
    assert not torch.equal(averaged["module.fc.weight"], model.module.fc.weight.detach()), "training moved on"


def test_sam_runs_under_bf16_mixed_and_refuses_fp16_amp_clearly() -> None:
    model = tiny_classifier()
    before = copy.deepcopy(model.state_dict())
    trainer = quiet_trainer(max_steps=2, precision="bf16-mixed", callbacks=[AlgorithmEngineCallback([SAM()])])
    trainer.fit(model, image_loader())
    assert trainer.global_step == 2
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    if torch.cuda.is_available():  # fp16 AMP needs a GPU in Lightning
        trainer = quiet_trainer(accelerator="gpu", max_steps=1, precision="16-mixed",
                                callbacks=[AlgorithmEngineCallback([SAM()])])
        with pytest.raises(ValueError, match="SAM cannot run with precision='16-mixed'"):
            trainer.fit(tiny_classifier(), image_loader())


def test_gradient_clipping_equals_lightnings_gradient_clip_val() -> None:
    ours = tiny_classifier()
    quiet_trainer(max_steps=3, callbacks=[AlgorithmEngineCallback([GradientClipping("norm", 0.05)])]).fit(
        ours, image_loader())
    theirs = tiny_classifier()
    quiet_trainer(max_steps=3, gradient_clip_val=0.05, gradient_clip_algorithm="norm").fit(theirs, image_loader())
    for (k, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=False):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=k)


def test_ema_on_a_short_digits_run_evaluates_no_worse_than_the_raw_weights() -> None:
    from composer_bridge import ComposerClassifier
    from composer_bridge.data import digits_loaders
    from composer_bridge.models import ResNetCNN

    train, test = digits_loaders(batch_size=64)
    results = {}
    for use_ema in (False, True):
        torch.manual_seed(0)
        model = ComposerClassifier(ResNetCNN(widths=(8, 16), blocks_per_stage=1), num_classes=10,
                                   optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
        trainer = quiet_trainer(max_epochs=3, callbacks=[AlgorithmEngineCallback([EMA()] if use_ema else [])])
        trainer.fit(model, train)
        results[use_ema] = trainer.validate(model, test, verbose=False)[0]["val/acc"]
    assert results[True] >= results[False] - 0.02, results


def test_ema_equals_lightnings_ema_weight_averaging_with_the_same_decay_and_interval() -> None:
    from lightning.pytorch.callbacks import EMAWeightAveraging

    ema = EMA(smoothing=0.9, update_interval="1ba")
    ours = tiny_classifier()
    quiet_trainer(max_steps=5, callbacks=[AlgorithmEngineCallback([ema])]).fit(ours, image_loader(n=96))
    theirs = tiny_classifier()
    quiet_trainer(max_steps=5, callbacks=[EMAWeightAveraging(decay=0.9, update_every_n_steps=1)]).fit(
        theirs, image_loader(n=96))
    averaged = ema.ema_weights
    for name, param in theirs.named_parameters():  # Lightning leaves the average in the model at the end
        torch.testing.assert_close(averaged[name], param.detach(), rtol=1e-5, atol=1e-6, msg=name)


def test_ema_weights_from_checkpoint_reads_the_average_a_bridge_of_any_name_saved(tmp_path) -> None:
    from composer_bridge.algorithms.ema import ema_weights_from_checkpoint

    class RenamedBridge(AlgorithmEngineCallback):  # its state_key no longer says AlgorithmEngineCallback
        pass

    ema = EMA(half_life="2ba", update_interval="1ba")
    model = tiny_classifier()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=3, callbacks=[RenamedBridge([ema])])
    trainer.fit(model, image_loader())
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    weights = ema_weights_from_checkpoint(path)
    assert set(weights) == set(model.state_dict())
    assert ema.ema_weights and all(torch.equal(weights[name], average) for name, average in ema.ema_weights.items())
    assert not torch.equal(weights["module.fc.weight"], model.module.fc.weight.detach())
    with pytest.raises(ValueError, match="holds no EMA weights"):
        ema_weights_from_checkpoint({"state_dict": {}, "callbacks": {"RenamedBridge": {"format": "other/9"}}})
