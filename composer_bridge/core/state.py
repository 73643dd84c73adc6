"""The :class:`State`: everything an algorithm may read or change during training.

Examples:
    >>> import torch
    >>> state = State(torch.nn.Linear(2, 1), max_duration="10ep")
    >>> state.batch = (torch.zeros(4, 2), torch.zeros(4))
    >>> state.batch_set_item(1, torch.ones(4))
    >>> state.batch_get_item(1).sum().item()
    4.0
    >>> state.get_elapsed_duration()
    Time(0.0, TimeUnit.DURATION)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from composer_bridge.core.batch import BatchKey, get_batch_item, set_batch_item
from composer_bridge.core.time import Time, Timestamp, TimeUnit

if TYPE_CHECKING:
    from composer_bridge.core.algorithm import Algorithm
    from composer_bridge.core.callback import Callback
    from composer_bridge.core.loss_source import LossSource

__all__ = ["State"]


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _new_generator(device: torch.device) -> torch.Generator:
    """A generator on ``device``, or on the CPU where torch has no generator for it (XLA).

    Algorithms draw on the generator's device and move the result to the batch's, which is a
    host-to-device copy, not a read back: XLA's lazy graph stays intact.
    """
    try:
        return torch.Generator(device=device)
    except RuntimeError:
        return torch.Generator(device="cpu")


class State:
    """A plain container for the training run, shared by the engine, algorithms and callbacks.

    Only ``model`` is required. Everything else starts empty and is filled in by whoever drives
    the loop (the Lightning bridge, or your own loop):

    - ``model``, ``optimizers`` (list), ``schedulers`` (list);
    - ``batch``, ``outputs``, ``loss`` of the current micro-batch (algorithms may replace them);
    - ``timestamp`` (training progress; ``batch`` counts optimizer steps), ``eval_timestamp``
      (progress within the current evaluation or prediction), ``max_duration``;
    - ``seed``, ``precision``, ``device``, ``rank``, ``world_size``;
    - ``algorithms`` and ``callbacks`` the engine runs (they may change between events);
    - ``dataloader``, ``dataloader_len``, ``microbatch_index`` (micro-batch within the step),
      ``accumulate_grad_batches``, ``sanity_checking`` (the pre-fit validation check),
      ``evaluating`` (an evaluation or prediction is running), ``automatic_optimization`` (the
      loop steps the optimizers itself; ``False`` when the user's code calls ``optimizer.step()``),
      ``stepping_optimizer`` (the optimizer about to step, at ``AFTER_TRAIN_BATCH``);
    - ``loss_source``: for a model that computes forward and loss in one step (a plain
      LightningModule), the forward pass and loss the adapter saw it use
      (:class:`~composer_bridge.core.loss_source.LossSource`); ``None`` for a model with
      ``forward(batch)`` and ``loss(outputs, batch)`` apart;
    - ``trainer``: the framework object driving the loop, for framework-specific access;
    - ``extra``: a free dict for anything else.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        schedulers: Any = None,
        algorithms: Sequence[Algorithm] | None = None,
        callbacks: Sequence[Callback] | None = None,
        max_duration: Time | str | int | None = None,
        seed: int | None = None,
        precision: str = "32-true",
        device: torch.device | str | None = None,
        rank: int = 0,
        world_size: int = 1,
        dataloader: Any = None,
        dataloader_len: int | None = None,
        run_name: str = "",
        trainer: Any = None,
    ) -> None:
        self.model = model
        self.optimizers: list[torch.optim.Optimizer] = _as_list(optimizers)
        self.schedulers: list[Any] = _as_list(schedulers)
        self._algorithms: list[Algorithm] = []
        self.algorithms = algorithms if algorithms is not None else []  # checked (and copied) by the setter
        self.callbacks: list[Callback] = list(callbacks or [])
        self.max_duration = max_duration  # type: ignore[assignment]
        self.seed = seed
        self.precision = precision
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.rank = rank
        self.world_size = world_size
        self.dataloader = dataloader
        self.dataloader_len = dataloader_len
        self.run_name = run_name
        self.trainer = trainer
        self._timestamp = Timestamp()
        # Batches counted by count_batch and not yet folded into _timestamp: [batches, samples,
        # seconds, last batch's seconds], or None.
        self._uncounted: list[Any] | None = None
        self.eval_timestamp = Timestamp()
        self.batch: Any = None
        self.outputs: Any = None
        self.loss: Any = None
        self.microbatch_index = 0
        self.accumulate_grad_batches = 1
        self.sanity_checking = False
        self.evaluating = False
        self.automatic_optimization = True
        self.stepping_optimizer: torch.optim.Optimizer | None = None
        self.stop_requested = False
        self.loss_source: LossSource | None = None
        self.extra: dict[str, Any] = {}
        self._generators: dict[tuple[str, str], tuple[torch.Generator, tuple[int, ...]]] = {}

    # --- progress -----------------------------------------------------------------------------
    @property
    def timestamp(self) -> Timestamp:
        """Training progress (``batch`` counts optimizer steps); assigning replaces it."""
        uncounted = self._uncounted
        if uncounted is not None:
            self._uncounted = None
            batches, samples, seconds, last = uncounted
            self._timestamp = self._timestamp.to_next_batches(batches, samples, duration=seconds, last_duration=last)
        return self._timestamp

    @timestamp.setter
    def timestamp(self, value: Timestamp) -> None:
        self._uncounted = None
        self._timestamp = value

    @property
    def batch_count(self) -> int:
        """Optimizer steps completed: ``timestamp.batch.value``, read without building a new Timestamp.

        Examples:
            >>> state = State(torch.nn.Linear(2, 2))
            >>> state.count_batch(samples=8, seconds=0.25)
            >>> state.batch_count, state.timestamp.batch.value
            (1, 1)
        """
        uncounted = self._uncounted
        done = self._timestamp.batch.value
        return done if uncounted is None else done + uncounted[0]

    def count_batch(self, samples: int, seconds: float, batches: int = 1) -> None:
        """Count one finished batch (optimizer step) of ``samples`` samples that took ``seconds``.

        ``batches`` > 1 counts several optimizer steps taken in one batch (several optimizers
        stepped by hand): ``timestamp.batch`` then keeps up with Lightning's ``global_step``.

        The same as ``state.timestamp = state.timestamp.to_next_batch(samples=samples, duration=seconds)``,
        except that the new :class:`Timestamp` is built when ``timestamp`` is next read: a loop that
        counts every step and whose listeners rarely read the timestamp pays a few additions.

        Examples:
            >>> state = State(torch.nn.Linear(2, 2))
            >>> state.count_batch(samples=8, seconds=0.25)
            >>> state.count_batch(samples=8, seconds=0.5)
            >>> state.timestamp.batch, state.timestamp.sample, state.timestamp.batch_wct.total_seconds()
            (Time(2, TimeUnit.BATCH), Time(16, TimeUnit.SAMPLE), 0.5)
        """
        if type(samples) is not int or samples < 0:
            raise ValueError(f"State.count_batch(samples={samples!r}): samples must be an int >= 0 (the batch's size).")
        if type(seconds) is not float:
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                raise TypeError(f"State.count_batch(seconds={seconds!r}): seconds must be a number (time.perf_counter() differences).")
            seconds = float(seconds)
        uncounted = self._uncounted
        if uncounted is None:
            self._uncounted = [batches, samples, seconds, seconds]
        else:
            uncounted[0] += batches
            uncounted[1] += samples
            uncounted[2] += seconds
            uncounted[3] = seconds

    # --- algorithms ---------------------------------------------------------------------------
    @property
    def algorithms(self) -> list[Algorithm]:
        """The algorithms the engine runs; assigning checks every item is an ``Algorithm``."""
        return self._algorithms

    @algorithms.setter
    def algorithms(self, algorithms: Sequence[Algorithm]) -> None:
        from composer_bridge.core.algorithm import check_algorithms

        self._algorithms = check_algorithms(algorithms)

    # --- duration -----------------------------------------------------------------------------
    @property
    def max_duration(self) -> Time | None:
        """How long the run lasts, as a :class:`Time` (``"10ep"``, ``"500ba"``, ...), or ``None``."""
        return self._max_duration

    @max_duration.setter
    def max_duration(self, value: Time | str | int | None) -> None:
        if value is None:
            self._max_duration = None
            return
        duration = Time.from_input(value, TimeUnit.EPOCH)
        if duration.unit == TimeUnit.DURATION:
            raise ValueError(
                f"max_duration={value!r} is a fraction of itself; give it in ep, ba, sp, tok, iter or sec, "
                "e.g. '10ep' or '2000ba'."
            )
        self._max_duration = duration

    def get_elapsed_duration(self) -> Time | None:
        """The fraction of ``max_duration`` already trained, as a ``dur`` :class:`Time` (``None`` if unknown).

        With ``max_duration`` in epochs and ``dataloader_len`` (optimizer steps per epoch) known,
        the fraction is counted in steps, so schedules advance smoothly within an epoch.
        """
        if self._max_duration is None:
            return None
        unit = self._max_duration.unit
        total = float(self._max_duration.value)
        if unit == TimeUnit.SECOND:
            elapsed = self.timestamp.total_wct.total_seconds()
        elif unit == TimeUnit.EPOCH and self.dataloader_len:
            # Count in steps so the fraction moves within an epoch, not only at its end.
            elapsed = float(self.timestamp.batch.value)
            total *= self.dataloader_len
        else:
            elapsed = float(self.timestamp.get(unit).value)
        return Time(min(elapsed / total, 1.0) if total > 0 else 1.0, TimeUnit.DURATION)

    # --- batch --------------------------------------------------------------------------------
    def batch_get_item(self, key: BatchKey) -> Any:
        """The part of the current batch named by ``key``: an index, a dict key or a ``(getter, setter)``."""
        return get_batch_item(self.batch, key)

    def batch_set_item(self, key: BatchKey, value: Any) -> None:
        """Replace the part of the current batch named by ``key`` (tuples are rebuilt, not mutated)."""
        self.batch = set_batch_item(self.batch, key, value)

    # --- randomness ---------------------------------------------------------------------------
    def generator(
        self, key: str, device: torch.device | str | None = None, *, same_on_every_rank: bool = False
    ) -> torch.Generator:
        """A ``torch.Generator`` on ``device`` for the caller named ``key`` (an algorithm's class name).

        Its seed is a pure function of ``(seed, rank, key, epoch, step, micro-batch, eval batch)``
        (without the rank when ``same_on_every_rank``: for draws every rank must agree on, such as
        which modules run under a sharded model),
        re-derived whenever the loop moves on; the eval batch counts only while ``evaluating``, so
        training draws never depend on how many evaluation batches ran before them. Randomness
        therefore depends only on *where* in training it is drawn: a run resumed from a checkpoint draws exactly what the uninterrupted
        run drew, on every rank and device, with no generator state to save; each key has its own
        stream, so adding an algorithm never changes another's draws.

        Examples:
            >>> import torch
            >>> state = State(torch.nn.Linear(1, 1), seed=7)
            >>> a = torch.rand(2, generator=state.generator("MixUp"))
            >>> state2 = State(torch.nn.Linear(1, 1), seed=7)
            >>> torch.equal(a, torch.rand(2, generator=state2.generator("MixUp")))
            True
        """
        device = torch.device(device) if device is not None else self.device
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        position = (
            int(self.timestamp.epoch.value), int(self.timestamp.batch.value), self.microbatch_index,
            int(self.eval_timestamp.batch.value) if self.evaluating else -1,
        )
        slot = (f"{key}/all-ranks" if same_on_every_rank else key, str(device))
        entry = self._generators.get(slot)
        if entry is not None and entry[1] == position:
            return entry[0]
        generator = entry[0] if entry is not None else _new_generator(device)
        rank = "all" if same_on_every_rank else self.rank
        material = f"{self.seed or 0}/{rank}/{key}/{position}".encode()
        generator.manual_seed(int.from_bytes(hashlib.blake2b(material, digest_size=8).digest(), "little") >> 1)
        self._generators[slot] = (generator, position)
        return generator

    # --- control ------------------------------------------------------------------------------
    def stop_training(self) -> None:
        """Ask the loop to stop cleanly after the current step (the bridge tells the Trainer)."""
        self.stop_requested = True

    def __repr__(self) -> str:
        names = [type(a).__name__ for a in self._algorithms]
        return (
            f"State(model={type(self.model).__name__}, timestamp={self.timestamp!r}, "
            f"max_duration={self._max_duration}, algorithms={names})"
        )
