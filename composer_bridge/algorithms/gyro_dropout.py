"""GyroDropout (Lee et al., 2022): dropout over a fixed pool of pre-selected sub-networks.

Each ``nn.Dropout`` becomes a :class:`GyroDropoutLayer`: ``sigma`` dropout masks (over the last,
feature, dimension) are drawn once; every ``period`` steps ``tau`` of them are picked and
shared out over the batch (sample ``i`` uses mask ``i * tau // batch``), so each sub-network is
trained for many consecutive steps. ``period = int(total_steps / sigma) * tau`` as in Composer.
In evaluation the layer is the identity, like dropout.

Differences from Composer: the masks come from seeded generators (the run's generator at
``INIT``), and the step count comes from the training loop rather than a counter in the layer,
so a resumed run uses the same masks as an uninterrupted one; surgery runs at ``INIT`` (Composer:
``FIT_START``) and the schedule is set once the number of steps is known.

Examples:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    >>> apply_gyro_dropout(net, iters_per_epoch=10, max_epoch=2, p=0.5, sigma=4, tau=2)
    1
    >>> y = net.train()(torch.ones(4, 8))
    >>> bool(torch.equal(y[0], y[1])), y.shape  # samples 0 and 1 share a sub-network
    (True, torch.Size([4, 8]))
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import torch
from torch import nn

from composer_bridge.algorithms._schedule import steps_of
from composer_bridge.algorithms._surgery import SurgeryAlgorithm, replace_modules, warn_no_effect
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["GyroDropout", "GyroDropoutLayer", "apply_gyro_dropout", "gyro_period"]


def gyro_period(total_steps: int, sigma: int, tau: int) -> int:
    """Steps between re-selections of the active sub-networks: ``int(total_steps / sigma) * tau`` (at least 1)."""
    return max(1, int(total_steps / sigma) * tau)


def _seeded(seed: int, *position: int) -> torch.Generator:
    material = "/".join(str(v) for v in (seed, *position)).encode()
    return torch.Generator().manual_seed(int.from_bytes(hashlib.blake2b(material, digest_size=8).digest(), "little") >> 1)


class GyroDropoutLayer(nn.Module):
    """Dropout restricted to ``sigma`` pre-selected masks, ``tau`` of them active per ``period`` steps.

    Takes Composer's arguments in Composer's order, ``(iters_per_epoch, max_epoch, p, sigma, tau)``,
    from which the period is :func:`gyro_period` ``(iters_per_epoch * max_epoch, sigma, tau)``; or
    give ``period`` directly instead of the first two.

    Args:
        iters_per_epoch: training steps per epoch (with ``max_epoch``: the run length).
        max_epoch: epochs of training.
        p: drop probability of each feature in a mask (kept features are scaled by ``1 / (1 - p)``).
        sigma: masks drawn in total.
        tau: masks active at once (the batch is split between them in consecutive groups); they are
            drawn with replacement, as in Composer, so ``tau`` may exceed ``sigma``.
        period: training steps between re-selections, instead of ``iters_per_epoch``/``max_epoch``
            (default 1 when neither is given).
        seed: seed of the masks and of their selection.

    ``training_step`` counts training forwards; a training loop may set it to its step count.
    ``dropout_mask`` holds the last training forward's mask (one row per sample), as in Composer.

    Examples:
        >>> layer = GyroDropoutLayer(iters_per_epoch=196, max_epoch=100, p=0.5, sigma=256, tau=16)
        >>> layer.period  # int(196 * 100 / 256) * 16
        1216
    """

    def __init__(
        self,
        iters_per_epoch: int | None = None,
        max_epoch: int | None = None,
        p: float = 0.5,
        sigma: int = 256,
        tau: int = 16,
        *,
        period: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        _check(p, sigma, tau, "GyroDropoutLayer")
        run = (iters_per_epoch, max_epoch)
        if period is not None and any(v is not None for v in run):
            raise ValueError(
                f"GyroDropoutLayer(iters_per_epoch={iters_per_epoch!r}, max_epoch={max_epoch!r}, period={period!r}): "
                "give either the run length (iters_per_epoch and max_epoch) or the period, not both."
            )
        if any(v is not None for v in run):
            _check_run_length(iters_per_epoch, max_epoch, "GyroDropoutLayer")
            assert iters_per_epoch is not None and max_epoch is not None
            period = gyro_period(iters_per_epoch * max_epoch, sigma, tau)
        period = 1 if period is None else period
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"GyroDropoutLayer(period={period!r}): must be an int >= 1.")
        self.iters_per_epoch = iters_per_epoch
        self.max_epoch = max_epoch
        self.p = p
        self.sigma = sigma
        self.tau = tau
        self.period = period
        self.seed = seed
        self.training_step = 0
        self.dropout_mask: torch.Tensor | None = None
        self._pool: torch.Tensor | None = None

    def extra_repr(self) -> str:
        return f"p={self.p}, sigma={self.sigma}, tau={self.tau}, period={self.period}"

    def _masks(self, features: int, device: torch.device) -> torch.Tensor:
        pool = self._pool
        if pool is None or pool.shape[1] != features:
            pool = (torch.rand(self.sigma, features, generator=_seeded(self.seed)) >= self.p).float()
        if pool.device != device:
            pool = pool.to(device)
        self._pool = pool
        return pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        pool = self._masks(x.shape[-1], x.device)
        chosen = torch.randint(
            self.sigma, (self.tau,), generator=_seeded(self.seed, self.training_step // self.period)
        ).to(x.device)
        self.training_step += 1
        owner = torch.arange(x.shape[0], device=x.device) * self.tau // x.shape[0]
        mask = pool[chosen[owner]].to(x.dtype).view(x.shape[0], *([1] * (x.dim() - 2)), x.shape[-1])
        self.dropout_mask = mask
        return x * mask / (1 - self.p)


def _check(p: float, sigma: int, tau: int, where: str = "GyroDropout") -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise ValueError(f"{where}(p={p!r}): must be a probability in [0, 1) (default 0.5).")
    for name, value in (("sigma", sigma), ("tau", tau)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}({name}={value!r}): must be an int >= 1.")


def _check_run_length(iters_per_epoch: object, max_epoch: object, where: str) -> None:
    for name, value in (("iters_per_epoch", iters_per_epoch), ("max_epoch", max_epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}({name}={value!r}): must be an int >= 1 (give both iters_per_epoch and max_epoch).")


def apply_gyro_dropout(
    model: nn.Module,
    iters_per_epoch: int,
    max_epoch: int,
    p: float = 0.5,
    sigma: int = 256,
    tau: int = 16,
    generator: torch.Generator | None = None,
) -> int:
    """Replace every ``nn.Dropout`` of ``model`` with a :class:`GyroDropoutLayer` (in place).

    Args:
        model: the model to change.
        iters_per_epoch: optimizer steps per epoch (with ``max_epoch``, the re-selection period).
        max_epoch: epochs of training.
        p: drop probability of each feature in a mask.
        sigma: masks in the pool.
        tau: masks active at once.
        generator: where the layers' seeds are drawn from (default: the global generator).

    Returns:
        The number of layers replaced (a warning is raised when it is zero). No parameter changes.
    """
    _check(p, sigma, tau)
    _check_run_length(iters_per_epoch, max_epoch, "apply_gyro_dropout")

    def convert(module: nn.Module, index: int) -> nn.Module:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        return GyroDropoutLayer(iters_per_epoch, max_epoch, p, sigma, tau, seed=seed)

    done = replace_modules(model, {nn.Dropout: convert}, skip=(GyroDropoutLayer,))
    if not done:
        warn_no_effect("GyroDropout", "nn.Dropout layer")
    return len(done)


class GyroDropout(SurgeryAlgorithm):
    """GyroDropout on every ``nn.Dropout``: surgery at ``INIT``, schedule from the run's length.

    Takes ``p``, ``sigma`` and ``tau`` of :func:`apply_gyro_dropout` (Composer's defaults).

    Examples:
        >>> GyroDropout(sigma=64, tau=8)
        GyroDropout(p=0.5, sigma=64, tau=8)
    """

    def __init__(self, p: float = 0.5, sigma: int = 256, tau: int = 16) -> None:
        _check(p, sigma, tau)
        self.p = p
        self.sigma = sigma
        self.tau = tau

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.INIT, Event.AFTER_DATALOADER)

    def surgery(self, state: State) -> int:
        # the period is set at AFTER_DATALOADER, when the number of steps is known
        return apply_gyro_dropout(
            state.model, 1, 1, self.p, self.sigma, self.tau, generator=state.generator(type(self).__name__, "cpu")
        )

    def _total_steps(self, state: State) -> int | None:
        total = state.max_duration
        steps = None if total is None else steps_of(total, state)
        return None if steps is None else int(steps)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.INIT:
            super().apply(event, state, logger)
            return
        total = self._total_steps(state)
        period = gyro_period(total, self.sigma, self.tau) if total else self.tau
        step = int(state.timestamp.batch)
        for module in state.model.modules():
            if isinstance(module, GyroDropoutLayer):
                module.period = period
                module.training_step = step
