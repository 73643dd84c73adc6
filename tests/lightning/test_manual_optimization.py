"""Manual optimization: every optimizer step is clipped, and the step count is Lightning's ``global_step``.

Semantics (docs/how-it-works.md): ``AFTER_TRAIN_BATCH`` fires before *every* ``optimizer.step()``
with ``state.stepping_optimizer`` set; a batch ends (``BATCH_END``) after the ``training_step`` in
which any optimizer stepped, and ``timestamp.batch`` adds the number of steps taken, so it equals
``trainer.global_step``. With several optimizers, GradientClipping clips the parameters of the
optimizer about to step, each against its own threshold.
"""

from __future__ import annotations

from typing import Any

import torch
from helpers.support import L, quiet_trainer
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import AlgorithmEngineCallback, Event
from composer_bridge.algorithms import GradientClipping

THRESHOLD = 1e-3


class GAN(L.LightningModule):
    """A two-optimizer module stepping D then G in one training_step, as Lightning's GAN example does."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.generator = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6))
        self.discriminator = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        self.norms: dict[str, list[float]] = {"D": [], "G": []}

    def training_step(self, batch: Any, batch_idx: int) -> None:
        real, noise = batch
        opt_d, opt_g = self.optimizers()
        fake = self.generator(noise)
        d_loss = torch.nn.functional.softplus(-self.discriminator(real)).mean() + torch.nn.functional.softplus(
            self.discriminator(fake.detach())).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss * 100)  # large gradients, so clipping must bind
        opt_d.step()
        g_loss = torch.nn.functional.softplus(-self.discriminator(self.generator(noise))).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss * 100)
        opt_g.step()

    def configure_optimizers(self) -> Any:
        return (torch.optim.SGD(self.discriminator.parameters(), lr=0.01),
                torch.optim.SGD(self.generator.parameters(), lr=0.01))


class RecordNorms(L.Callback):
    """Reads each optimizer's gradient norm at the moment it steps (after the bridge's hook)."""

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: GAN, optimizer: Any) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))
        pl_module.norms["D" if optimizer is trainer.optimizers[0] else "G"].append(norm)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(32, 6, generator=g) + 2, torch.randn(32, 4, generator=g)), batch_size=4)


def test_every_optimizer_step_of_a_two_optimizer_module_is_clipped_and_steps_match_global_step() -> None:
    model = GAN()
    bridge = AlgorithmEngineCallback([GradientClipping("norm", THRESHOLD)])
    trainer = quiet_trainer(max_epochs=1, callbacks=[bridge, RecordNorms()])
    trainer.fit(model, loader())
    assert trainer.global_step == 16
    assert int(bridge.state.timestamp.batch) == trainer.global_step == 16
    assert len(model.norms["D"]) == len(model.norms["G"]) == 8
    for who in ("D", "G"):
        assert max(model.norms[who]) <= THRESHOLD * 1.0001, f"{who} was not clipped: {max(model.norms[who])}"
    trace_steps = sorted(step for step in bridge.traces if bridge.traces[step])
    assert trace_steps[-1] <= trainer.global_step
    assert bridge.traces.stats["GradientClipping/AFTER_TRAIN_BATCH"].count == 16


def test_without_the_bridge_the_generator_gradients_exceed_the_threshold() -> None:
    """The check above can fail: unclipped, the norms are far above the threshold."""
    model = GAN()
    quiet_trainer(max_epochs=1, callbacks=[RecordNorms()]).fit(model, loader())
    assert max(model.norms["G"]) > 10 * THRESHOLD and max(model.norms["D"]) > 10 * THRESHOLD


def test_a_manual_module_that_steps_every_other_batch_counts_one_step_per_optimizer_step() -> None:
    class Accumulating(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.layer = torch.nn.Linear(6, 1)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt = self.optimizers()
            self.manual_backward(self.layer(batch[0]).pow(2).mean())
            if batch_idx % 2 == 1:
                opt.step()
                opt.zero_grad()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    counts = {"BATCH_START": 0, "BATCH_END": 0, "AFTER_BACKWARD": 0}
    bridge = AlgorithmEngineCallback([GradientClipping("norm", 1.0)])
    trainer = quiet_trainer(max_epochs=1, callbacks=[bridge])

    class Count(L.Callback):
        def on_fit_start(self, trainer: L.Trainer, pl_module: Any) -> None:
            for name in counts:
                bridge.engine.on(Event[name])(lambda state, event, n=name: counts.__setitem__(n, counts[n] + 1))

    trainer.callbacks.append(Count())
    trainer.fit(Accumulating(), loader())
    assert trainer.global_step == 4 and int(bridge.state.timestamp.batch) == 4
    assert int(bridge.state.timestamp.sample) == 32
    assert counts == {"BATCH_START": 4, "BATCH_END": 4, "AFTER_BACKWARD": 8}
