"""Our SWA against Lightning's ``StochasticWeightAveraging`` where their definitions coincide.

Lightning averages at the *start* of epochs ``swa_epoch_start - 1 .. max_epochs - 1`` (0-based), i.e.
the weights after ``swa_epoch_start - 1, ..., max_epochs - 1`` completed epochs; it then trains the
last epoch anyway, throws those weights away for the average and (with BatchNorm) spends one extra
forward-only epoch re-estimating the BatchNorm statistics. Ours averages at ``EPOCH_END`` from
``swa_start`` completed epochs, so SWA(swa_start='1ep', swa_end='3ep') in a 3-epoch run averages the
same three points as Lightning's ``swa_epoch_start=2`` in a 4-epoch run and ends with the average in
the model. With ``swa_lrs`` equal to the optimizer's rate Lightning's SWALR is a no-op, so the
trajectories are the same; BatchNorm statistics are then compared after ``update_bn`` on ours, and
Lightning's run validates once per epoch so its BatchNorm epoch's stray optimizer step finds no gradients.
The annealed learning rates differ by one epoch (second test); docs/algorithms/swa.md lists the differences.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from helpers.support import image_loader, quiet_trainer, tiny_classifier, weights_of
from torch.optim.swa_utils import update_bn

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms.swa import SWA

LR = 0.05


class LearningRates(L.Callback):
    """The learning rate of every optimizer step, in order."""

    def __init__(self) -> None:
        self.rates: list[float] = []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.rates.append(float(trainer.optimizers[0].param_groups[0]["lr"]))


def lightning_swa(swa_lrs: float = LR, annealing_epochs: int = 1) -> tuple[Any, Any, list[float]]:
    model = tiny_classifier(lr=LR)
    rates = LearningRates()
    swa = L.pytorch.callbacks.StochasticWeightAveraging(
        swa_lrs=swa_lrs, swa_epoch_start=2, annealing_epochs=annealing_epochs, annealing_strategy="linear"
    )
    # Lightning's BatchNorm epoch skips backward and zero_grad but still steps the optimizer once (at its
    # last batch) with whatever gradients are left: the last training step's, unless validation ran in
    # between (it sets them to None, making that step a no-op). One validation batch per epoch does that.
    trainer = quiet_trainer(max_epochs=4, callbacks=[swa, rates], limit_val_batches=1)
    trainer.fit(model, image_loader(n=48, batch_size=16), image_loader(n=16))
    return model, swa, rates.rates


def our_swa(max_epochs: int, **kwargs: Any) -> tuple[Any, SWA, list[float], L.Trainer]:
    model = tiny_classifier(lr=LR)
    rates = LearningRates()
    swa = SWA(swa_start="1ep", update_interval="1ep", **kwargs)
    trainer = quiet_trainer(max_epochs=max_epochs, callbacks=[AlgorithmEngineCallback([swa], seed=0), rates])
    trainer.fit(model, image_loader(n=48, batch_size=16))
    return model, swa, rates.rates, trainer


def test_final_weights_and_batchnorm_statistics_agree_with_lightning() -> None:
    theirs, their_swa, their_rates = lightning_swa()
    with pytest.warns(UserWarning, match="very end of training"):
        ours, swa, our_rates, trainer = our_swa(3, swa_end="3ep")
    assert swa.num_averaged == 3 and swa.swa_completed and int(their_swa.n_averaged) == 3
    their_average = dict(their_swa._average_model.named_parameters())
    ours_average = {k: v.cpu() for k, v in (swa.swa_weights or {}).items()}
    torch.testing.assert_close(ours_average, {k: v.detach().cpu() for k, v in their_average.items()})
    # Lightning's extra BatchNorm epoch is a forward pass in training mode with momentum None over
    # the training data: update_bn does the same on the averaged model.
    with trainer.precision_plugin.train_step_context():
        update_bn((x.to(ours.device) for x, _ in image_loader(n=48, batch_size=16)), ours.module)
    torch.testing.assert_close(weights_of(ours), weights_of(theirs))
    # Same learning rate on every step they share (Lightning's 4th epoch is discarded).
    assert our_rates == pytest.approx(their_rates[: len(our_rates)], rel=1e-12)


def test_annealed_learning_rate_lags_one_average_behind_ours() -> None:
    # Lightning sets the rate for an epoch from the averages taken *before* the one at its start;
    # ours (like PyTorch's SWALR example) from all averages so far, so ours anneals one epoch earlier.
    _, _, their_rates = lightning_swa(swa_lrs=0.01, annealing_epochs=2)
    with pytest.warns(UserWarning, match="very end of training"):
        _, _, our_rates, _ = our_swa(4, swa_end="4ep", schedule_swa_lr=True, anneal_strategy="linear",
                                     anneal_steps=2, swa_lr=0.01)
    per_epoch = lambda rates: [rates[3 * e] for e in range(4)]  # noqa: E731 - three steps per epoch
    assert per_epoch(their_rates) == pytest.approx([LR, LR, (LR + 0.01) / 2, 0.01])
    assert per_epoch(our_rates) == pytest.approx([LR, (LR + 0.01) / 2, 0.01, 0.01])
