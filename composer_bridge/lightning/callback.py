"""The :class:`AlgorithmEngineCallback`: Composer's algorithm engine inside ``lightning.Trainer``.

Example:
    >>> import lightning as L
    >>> from composer_bridge.algorithms import LabelSmoothing
    >>> trainer = L.Trainer(
    ...     max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
    ...     callbacks=[AlgorithmEngineCallback([LabelSmoothing(0.1)])])

Which Lightning hook fires which event is documented in ``docs/how-it-works.md``; in short:
``INIT`` at ``setup`` (before optimizers, DDP wrapping and checkpoint loading), the data events
around the module's batch-transfer hooks, forward/loss events inside ``training_step``,
``AFTER_BACKWARD`` per micro-batch, ``AFTER_TRAIN_BATCH`` at ``on_before_optimizer_step``, and
the step events once per optimizer step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities.model_helpers import is_overridden

from composer_bridge.core.algorithm import Algorithm, check_algorithms
from composer_bridge.core.callback import Callback as EngineCallback
from composer_bridge.core.engine import Engine
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.passes import normalize_passes
from composer_bridge.core.state import State
from composer_bridge.core.time import Time, Timestamp, TimeUnit
from composer_bridge.lightning.checkpoint_state import (
    FORMAT,
    CheckpointStateError,
    algorithm_entry,
    check_bridge_state,
    known_algorithm_classes,
    rebuild_algorithm,
)
from composer_bridge.lightning.cost_report import CostReport
from composer_bridge.lightning.cost_report import cost_report as build_cost_report
from composer_bridge.lightning.loggers import LightningLoggers
from composer_bridge.lightning.module import ComposerModule, _batch_size, attach_bridge, detach_bridge
from composer_bridge.lightning.module_patches import ModulePatches
from composer_bridge.lightning.plan import Plan, make_plan
from composer_bridge.lightning.traces import TraceMode, TraceReporting, TraceStore
from composer_bridge.lightning.wandb_report import wandb_run_config

__all__ = ["AlgorithmEngineCallback", "BridgeConfigurationError"]

log = logging.getLogger(__name__)

# Lightning dispatches every hook to every callback, each through a profiler context (a few µs
# each), but skips a hook whose attribute is not callable. The bridge shadows with ``None`` on the
# instance the per-step hooks it has no use for (always), and while nothing listens those that only
# fire events, so an idle bridge receives two hooks per step instead of six (see _shadow_hooks).
_UNUSED_STEP_HOOKS = ("on_before_zero_grad", "on_before_backward")
_EVENT_ONLY_STEP_HOOKS = ("on_train_batch_start", "on_after_backward")


class BridgeConfigurationError(ValueError):
    """The algorithms cannot run with this module, strategy or checkpoint; the message says how to fix it."""


class AlgorithmEngineCallback(L.Callback):
    """Run Composer-style algorithms (and engine callbacks) inside a ``lightning.Trainer``.

    Args:
        algorithms: the :class:`~composer_bridge.Algorithm` instances to run.
        callbacks: engine-side :class:`~composer_bridge.Callback` instances; they run after the
            algorithms at every event and are closed at teardown and on exceptions.
        algorithm_passes: extra ordering passes (a pass, ``(pass, index)``, or a list of these).
        seed: seed for the algorithms' randomness; default: Lightning's ``seed_everything`` seed,
            else ``torch.initial_seed()``. A resumed run uses the seed stored in its checkpoint.
        add_missing_on_load: when a checkpoint was written with surgery algorithms this run lacks,
            re-create them (from the library or ``known_algorithms``) instead of raising.
        known_algorithms: your own ``Algorithm`` classes that ``add_missing_on_load`` may re-create.
        measure_cost: time each algorithm's ``apply`` (see :meth:`cost_report`).
        trace_mode: how often traces go to the Lightning loggers as ``algorithm_traces/<Algo>/<EVENT>``:
            ``"summary"`` (each key once, plus totals at fit end; the default), ``"every_event"``,
            or an int ``n`` (each key at most once every n steps). See ``docs/traces.md``.
        trace_file: also write the text trace (``[STEP=3][LayerFreezing/EPOCH_END=1]``) to this file.

    Example:
        >>> from composer_bridge.algorithms import LabelSmoothing
        >>> callback = AlgorithmEngineCallback([LabelSmoothing(smoothing=0.1)])
        >>> callback.algorithms
        [LabelSmoothing(smoothing=0.1, target_key=1)]
    """

    def __init__(
        self,
        algorithms: Sequence[Algorithm] | Algorithm | None = None,
        callbacks: Sequence[EngineCallback] | EngineCallback | None = None,
        algorithm_passes: Any = None,
        *,
        seed: int | None = None,
        add_missing_on_load: bool = False,
        known_algorithms: Sequence[type] = (),
        measure_cost: bool = True,
        trace_mode: TraceMode = "summary",
        trace_file: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        self.algorithms: list[Algorithm] = check_algorithms(algorithms if algorithms is not None else [])
        _check_unique(self.algorithms)
        self.engine_callbacks: list[EngineCallback] = _check_engine_callbacks(callbacks)
        self.algorithm_passes = normalize_passes(algorithm_passes)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"AlgorithmEngineCallback(seed={seed!r}): seed must be an int or None.")
        self.seed = seed
        self.add_missing_on_load = add_missing_on_load
        self.known_algorithms = tuple(known_algorithms)
        self.measure_cost = measure_cost
        self.logger = Logger()
        self._cost: dict[str, list[float]] = {}  # kept across fit/validate calls (see cost)
        self._reporting = TraceReporting(trace_mode, trace_file)
        self.state: State | None = None
        self.engine: Engine | None = None
        self._trainer: L.Trainer | None = None
        self._patches: ModulePatches | None = None
        self._data_patches: ModulePatches | None = None
        self._initialized: weakref.ref[torch.nn.Module] | None = None
        # Whether anything listens to the per-step events (Engine.has_listeners), read between steps;
        # the module's event hooks are installed the first time something does.
        self._listening = False
        self._stepped = False
        self._micro = 0
        self._step_samples = 0
        self._loaded_samples: int | None = None
        self._batch_started_at = 0.0
        self._eval_started_at = 0.0
        self._fit_started_at = 0.0
        # The hooks call the engine directly (set in setup); before setup this raises a clear error.
        self._run: Any = self.run_event
        self._shadow_hooks(_UNUSED_STEP_HOOKS + _EVENT_ONLY_STEP_HOOKS, shadow=True)

    def _shadow_hooks(self, names: tuple[str, ...], *, shadow: bool) -> None:
        """Hide (``shadow=True``) or restore this instance's ``names`` hooks from Lightning's dispatch.

        A hook a subclass overrides is never hidden: the subclass's code runs as written.
        """
        for name in names:
            if getattr(type(self), name) is not getattr(AlgorithmEngineCallback, name):
                continue
            if shadow:
                setattr(self, name, None)
            else:
                with contextlib.suppress(AttributeError):  # not hidden: nothing to restore
                    delattr(self, name)

    # ------------------------------------------------------------------------------------------
    # engine plumbing
    # ------------------------------------------------------------------------------------------
    @property
    def cost(self) -> dict[str, list[float]]:
        """``"<Algorithm>/<EVENT>"`` → ``[calls, seconds in apply]``, kept across fit/validate calls.

        See :attr:`Engine.cost <composer_bridge.Engine.cost>` for how seconds are sampled, and
        :meth:`cost_report` for a table.
        """
        return self.engine.cost if self.engine is not None else self._cost

    def run_event(self, event: Event) -> Any:
        """Run ``event`` through the engine now (the hooks below call this)."""
        assert self.engine is not None, "AlgorithmEngineCallback used before Trainer setup"
        return self.engine.run_event(event)

    def _new_engine(self) -> Engine:
        assert self.state is not None
        engine = Engine(self.state, self.logger, self.algorithm_passes, measure_cost=self.measure_cost)
        engine.cost = self._cost
        engine.on_handler_added = self._refresh_listening
        return engine

    def _make_destinations(self, trainer: L.Trainer) -> list[Any]:
        """Where the engine logger writes: the Trainer's Lightning loggers."""
        return [LightningLoggers(trainer), self._reporting.destination(trainer, self._current_step)]

    # ------------------------------------------------------------------------------------------
    # setup: INIT, capability checks, module hooks
    # ------------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer
        if self.state is None or self.state.model is not pl_module:
            self.state = State(pl_module, algorithms=self.algorithms, callbacks=self.engine_callbacks)
            self.state.seed = self.seed if self.seed is not None else _default_seed()
        state = self.state
        state.trainer = trainer
        state.rank = trainer.global_rank
        state.world_size = trainer.world_size
        state.precision = str(trainer.precision)
        state.device = trainer.strategy.root_device
        state.accumulate_grad_batches = trainer.accumulate_grad_batches
        state.max_duration = _max_duration(trainer)
        self.logger.destinations = self._make_destinations(trainer)
        self.logger.step = int(state.timestamp.batch.value)
        if self.engine is None or self.engine.closed:
            self.engine = self._new_engine()
        self._run = self.engine.run_event
        self._check_module(pl_module)
        if stage == TrainerFn.FITTING.value or stage == "fit":
            self._configure_ddp(trainer)
        self._install_patches(pl_module, trainer)
        attach_bridge(pl_module, self)
        initialized = self._initialized() if self._initialized is not None else None
        if initialized is not pl_module:
            self._run(Event.INIT)
            self._initialized = weakref.ref(pl_module)

    def _check_module(self, pl_module: L.LightningModule) -> None:
        if isinstance(pl_module, ComposerModule):
            return
        needy = [type(a).__name__ for a in self.algorithms if a.needs_loss_events]
        if needy:
            raise BridgeConfigurationError(
                f"{', '.join(needy)} need{'s' if len(needy) == 1 else ''} the BEFORE_FORWARD/BEFORE_LOSS events, "
                f"which {type(pl_module).__name__} cannot provide: its training_step computes forward and loss "
                "together. Fix: subclass composer_bridge.ComposerModule (implement forward(batch) and "
                "loss(outputs, batch)) or wrap your network in composer_bridge.ComposerClassifier; or remove "
                "these algorithms (algorithms that act on data, weights or the optimizer work with any module)."
            )

    def _configure_ddp(self, trainer: L.Trainer) -> None:
        needy = [type(a).__name__ for a in self.algorithms if a.find_unused_parameters]
        kwargs = getattr(trainer.strategy, "_ddp_kwargs", None)
        if not needy or kwargs is None:
            return
        if "find_unused_parameters" not in kwargs:
            kwargs["find_unused_parameters"] = True
            log.info("Set DDP find_unused_parameters=True for %s.", ", ".join(needy))
        elif not kwargs["find_unused_parameters"]:
            warnings.warn(
                f"{', '.join(needy)} may leave parameters without gradients, but the strategy was created with "
                "find_unused_parameters=False; DDP may then hang or fail. Use strategy='ddp_find_unused_parameters_true' "
                "(or DDPStrategy(find_unused_parameters=True)).",
                stacklevel=2,
            )

    def _install_patches(self, pl_module: L.LightningModule, trainer: L.Trainer) -> None:
        if self._patches is not None and self._patches.module is pl_module:
            self._refresh_listening()
            return
        self._remove_patches()
        patches = self._patches = ModulePatches(pl_module)
        on_load = patches.original("on_load_checkpoint")

        def on_load_checkpoint(checkpoint: dict[str, Any]) -> None:
            self._run(Event.BEFORE_LOAD)
            self._check_checkpoint_fits(checkpoint)
            return on_load(checkpoint)

        patches.set("on_load_checkpoint", on_load_checkpoint)
        self._refresh_listening()

    def _refresh_listening(self) -> None:
        """Read whether anything listens; the first time something does, install the module's event hooks.

        Called at setup, between steps and at the start of evaluation. While no algorithm, engine
        callback or handler exists, the bridge fires no per-step event and hooks nothing into the
        module, so an empty bridge costs only its step bookkeeping. A handler (``engine.on``) is
        heard at once; an algorithm or engine callback added during a run, from the next step on.
        """
        listening = self.engine is not None and self.engine.has_listeners()
        if listening and self._data_patches is None and self._patches is not None and self._trainer is not None:
            self._install_event_patches(self._patches, self._trainer)
        if listening is not self._listening:
            self._set_listening(listening)

    def _set_listening(self, listening: bool) -> None:
        self._shadow_hooks(_EVENT_ONLY_STEP_HOOKS, shadow=not listening)
        self._listening = listening
        if listening and self.state is not None:  # an idle bridge leaves the logger's step behind
            self.logger.step = self._current_step()

    def _install_event_patches(self, patches: ModulePatches, trainer: L.Trainer) -> None:
        pl_module = patches.module
        # With a LightningDataModule, Lightning runs the batch-transfer hooks of the DataModule when it
        # overrides them (and warns when only the module does): the data events go on the DataModule then.
        datamodule = trainer.datamodule
        data_patches = patches if datamodule is None else ModulePatches(datamodule)  # type: ignore[arg-type]
        self._data_patches = data_patches
        before_transfer = data_patches.original("on_before_batch_transfer")
        after_transfer = data_patches.original("on_after_batch_transfer")
        backward = patches.original("backward")

        def on_before_batch_transfer(batch: Any, dataloader_idx: int) -> Any:
            if self._listening and _training(trainer):
                self._run(Event.BEFORE_DATALOADER)
            return before_transfer(batch, dataloader_idx)

        def on_after_batch_transfer(batch: Any, dataloader_idx: int) -> Any:
            batch = after_transfer(batch, dataloader_idx)
            if not _training(trainer):
                return batch
            return self._after_dataloader(batch)

        def backward_hook(loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            if self.state is not None and any(a.backwards_create_graph for a in self.state.algorithms):
                kwargs.setdefault("create_graph", True)
            return backward(loss, *args, **kwargs)

        data_patches.set("on_before_batch_transfer", on_before_batch_transfer)
        data_patches.set("on_after_batch_transfer", on_after_batch_transfer)
        patches.set("backward", backward_hook)
        if not isinstance(pl_module, ComposerModule):
            self._patch_plain_steps(pl_module, patches)

    def _patch_plain_steps(self, pl_module: L.LightningModule, patches: ModulePatches) -> None:
        """A plain module gets BEFORE_BACKWARD after its training_step, and eval/predict forward events."""
        training_step = patches.original("training_step")

        def wrapped_training_step(*args: Any, **kwargs: Any) -> Any:
            output = training_step(*args, **kwargs)
            loss = output.get("loss") if isinstance(output, dict) else output
            if not isinstance(loss, torch.Tensor):
                return output
            state = self.state
            assert state is not None
            state.outputs, state.loss = output, loss
            self._run(Event.BEFORE_BACKWARD)
            if state.loss is loss:
                return output
            if isinstance(output, dict):
                return {**output, "loss": state.loss}
            return state.loss

        patches.set("training_step", wrapped_training_step)
        for name, before, after in (
            ("validation_step", Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD),
            ("test_step", Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD),
            ("predict_step", Event.PREDICT_BEFORE_FORWARD, Event.PREDICT_AFTER_FORWARD),
        ):
            if not is_overridden(name, pl_module):
                continue
            patches.set(name, self._wrap_eval_step(patches.original(name), before, after))

    def _wrap_eval_step(self, step: Any, before: Event, after: Event) -> Any:
        def wrapped(batch: Any, *args: Any, **kwargs: Any) -> Any:
            state = self.state
            assert state is not None
            state.batch = batch
            self._run(before)
            state.outputs = step(state.batch, *args, **kwargs)
            self._run(after)
            return state.outputs

        return wrapped

    # ------------------------------------------------------------------------------------------
    # the step bodies ComposerModule calls while the bridge is attached
    # ------------------------------------------------------------------------------------------
    def composer_train_step(self, module: ComposerModule, batch: Any) -> tuple[Any, Any, torch.Tensor]:
        """Forward and loss of one training micro-batch, with their events; returns (batch, outputs, loss)."""
        state = self.state
        assert state is not None and self.engine is not None
        run = self.engine.run_event
        state.batch = batch
        run(Event.BEFORE_FORWARD)
        state.outputs = module(state.batch)
        run(Event.AFTER_FORWARD)
        run(Event.BEFORE_LOSS)
        state.loss = module.loss(state.outputs, state.batch)
        run(Event.AFTER_LOSS)
        run(Event.BEFORE_BACKWARD)
        return state.batch, state.outputs, state.loss

    def composer_eval_forward(self, module: ComposerModule, batch: Any) -> Any:
        """The evaluation forward pass, between EVAL_BEFORE_FORWARD and EVAL_AFTER_FORWARD."""
        return self._forward_between(module, batch, Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD)

    def composer_predict_forward(self, module: ComposerModule, batch: Any) -> Any:
        """The prediction forward pass, between PREDICT_BEFORE_FORWARD and PREDICT_AFTER_FORWARD."""
        return self._forward_between(module, batch, Event.PREDICT_BEFORE_FORWARD, Event.PREDICT_AFTER_FORWARD)

    def _forward_between(self, module: ComposerModule, batch: Any, before: Event, after: Event) -> Any:
        state = self.state
        assert state is not None
        state.batch = batch
        self._run(before)
        state.outputs = module.eval_forward(state.batch)
        self._run(after)
        return state.outputs

    def _after_dataloader(self, batch: Any) -> Any:
        state = self.state
        assert state is not None
        state.microbatch_index = self._micro
        state.batch = batch
        self._loaded_samples = _batch_size(batch) or 0  # as loaded, before AFTER_DATALOADER (Composer's count)
        if self._listening:
            self._run(Event.AFTER_DATALOADER)
        return state.batch

    # ------------------------------------------------------------------------------------------
    # fit
    # ------------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = self.state
        assert state is not None
        state.optimizers = list(trainer.optimizers)
        state.schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        state.device = pl_module.device
        self._fit_started_at = time.perf_counter()
        self.logger.step = int(state.timestamp.batch.value)  # after a checkpoint restored the timestamp
        self._run(Event.FIT_START)
        self._reporting.fit_start(trainer, lambda: self.plan().text, self._run_config)
        self._refresh_listening()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = self.state
        assert state is not None
        state.dataloader = trainer.train_dataloader
        batches = trainer.num_training_batches
        if isinstance(batches, int) or (isinstance(batches, float) and batches != float("inf")):
            state.dataloader_len = -(-int(batches) // max(1, trainer.accumulate_grad_batches))
        if state.timestamp.batch.value == 0 and state.timestamp.epoch.value == 0:
            self._run(Event.ITERATION_START)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset_step()
        self._refresh_listening()
        self._batch_started_at = time.perf_counter()
        self._run(Event.EPOCH_START)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        # The first micro-batch of a step: ``_micro`` counts the step's micro-batches done (also while
        # this hook was hidden, so a bridge that began listening mid-step waits for the next step).
        if self._micro == 0 and self._listening:
            self.logger.step = int(self.state.timestamp.batch.value) if self.state else None
            self._run(Event.BATCH_START)
            self._run(Event.BEFORE_TRAIN_BATCH)

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._listening and _training(trainer):
            self._run(Event.AFTER_BACKWARD)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not self._stepped:
            self._stepped = True
            if self._listening:
                self._run(Event.AFTER_TRAIN_BATCH)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # The micro-batch's samples, as the data hook saw them; without one (an idle bridge, or one that
        # began listening after this micro-batch was loaded), counted here.
        loaded = self._loaded_samples
        if loaded is None:
            self._step_samples += _batch_size(batch) or 0
        else:
            self._step_samples += loaded
            self._loaded_samples = None
        if not self._stepped:
            self._micro += 1
            return
        state = self.state
        assert state is not None
        # As in Composer, a batch's wall-clock time runs from the end of the previous one (data
        # loading included, evaluation excluded: see _eval_start/_eval_end). The Timestamp itself
        # is built when something reads it (State.count_batch): an idle bridge only adds numbers.
        now = time.perf_counter()
        state.count_batch(self._step_samples, now - self._batch_started_at)
        self._batch_started_at = now
        self._reset_step()
        if self._listening:
            self.logger.step = state.timestamp.batch.value
            self._run(Event.BATCH_END)
            self._run(Event.BATCH_CHECKPOINT)
            self._honour_stop(trainer)
        self._refresh_listening()

    def _reset_step(self) -> None:
        self._stepped = False
        self._micro = 0
        self._step_samples = 0
        if self.state is not None:
            self.state.microbatch_index = 0

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = self.state
        assert state is not None
        state.timestamp = state.timestamp.to_next_epoch()
        self._reset_step()
        self._run(Event.EPOCH_END)
        self._run(Event.EPOCH_CHECKPOINT)
        self._honour_stop(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = self.state
        assert state is not None
        state.timestamp = state.timestamp.to_next_iteration()
        self._run(Event.ITERATION_END)
        self._run(Event.ITERATION_CHECKPOINT)
        self._run(Event.FIT_END)
        self._reporting.fit_end(trainer, self._current_step(), self.cost)

    def _honour_stop(self, trainer: L.Trainer) -> None:
        if self.state is not None and self.state.stop_requested:
            trainer.should_stop = True

    # ------------------------------------------------------------------------------------------
    # evaluation and prediction
    # ------------------------------------------------------------------------------------------
    def _eval_start(self, trainer: L.Trainer) -> None:
        state = self.state
        assert state is not None
        self._refresh_listening()
        self._eval_started_at = time.perf_counter()
        state.sanity_checking = bool(trainer.sanity_checking)
        state.eval_timestamp = Timestamp()
        standalone = trainer.state.fn in (TrainerFn.VALIDATING, TrainerFn.TESTING)
        self._run(Event.EVAL_STANDALONE_START if standalone else Event.EVAL_BEFORE_ALL)
        self._run(Event.EVAL_START)

    def _eval_end(self, trainer: L.Trainer) -> None:
        state = self.state
        assert state is not None
        standalone = trainer.state.fn in (TrainerFn.VALIDATING, TrainerFn.TESTING)
        self._run(Event.EVAL_END)
        self._run(Event.EVAL_STANDALONE_END if standalone else Event.EVAL_AFTER_ALL)
        state.sanity_checking = False
        self._batch_started_at += time.perf_counter() - self._eval_started_at  # evaluation is not batch time

    def _eval_batch_end(self) -> None:
        state = self.state
        assert state is not None
        state.eval_timestamp = state.eval_timestamp.to_next_batch()
        self._run(Event.EVAL_BATCH_END)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._eval_start(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._eval_end(trainer)

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._run(Event.EVAL_BATCH_START)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end()

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._eval_start(trainer)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._eval_end(trainer)

    def on_test_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._run(Event.EVAL_BATCH_START)

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end()

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert self.state is not None
        self._refresh_listening()
        self.state.eval_timestamp = Timestamp()
        self._run(Event.PREDICT_START)

    def on_predict_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._run(Event.PREDICT_BATCH_START)

    def on_predict_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        assert self.state is not None
        self.state.eval_timestamp = self.state.eval_timestamp.to_next_batch()
        self._run(Event.PREDICT_BATCH_END)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run(Event.PREDICT_END)

    # ------------------------------------------------------------------------------------------
    # shutdown
    # ------------------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        self._reporting.close()
        if self.engine is not None:
            self.engine.close()
        self._remove_patches()

    def _remove_patches(self) -> None:
        if self._data_patches is not None:
            self._data_patches.remove()
            self._data_patches = None
        if self._patches is not None:
            detach_bridge(self._patches.module)
            self._patches.remove()
            self._patches = None
        self._set_listening(False)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._shutdown()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._reporting.fit_end(trainer, self._current_step(), self.cost, failed=True)
        self._shutdown()

    # ------------------------------------------------------------------------------------------
    # what ran, in which order, at what cost (traces.py, plan.py, cost_report.py, wandb_report.py)
    # ------------------------------------------------------------------------------------------
    @property
    def traces(self) -> TraceStore:
        """Every trace of the run by step: ``callback.traces[step]`` lists that step's traces in run order.

        ``callback.traces.stats[key]`` holds the totals of each ``"<Algorithm>/<EVENT>"`` key. In
        ``trace_mode="summary"`` only the first and latest steps are kept in full (the totals cover all).
        """
        return self._reporting.store

    def plan(self) -> Plan:
        """For each event that has algorithms, the order they run in after the passes, and known conflicts.

        ``print(callback.plan())``; works before ``fit`` too (``match`` is then probed on a bare state).
        """
        algorithms = self.state.algorithms if self.state is not None else self.algorithms
        return make_plan(algorithms, self._passes(), self.state, self.traces.stats)

    def cost_report(self) -> CostReport:
        """Wall time each algorithm spent in ``apply``, per event, as a printable table (``print(...)``)."""
        train = self.state.timestamp.total_wct.total_seconds() if self.state is not None else None
        note = "" if self.measure_cost else "Cost measurement is off: create the callback with measure_cost=True."
        return build_cost_report(self.cost, train_seconds=train, note=note)

    def _passes(self) -> list[Any]:
        if self.engine is not None:
            return self.engine.passes
        return Engine(State(torch.nn.Module()), algorithm_passes=self.algorithm_passes).passes

    def _current_step(self) -> int:
        return int(self.state.timestamp.batch.value) if self.state is not None else 0

    def _run_config(self) -> dict[str, Any]:
        algorithms = self.state.algorithms if self.state is not None else self.algorithms
        return wandb_run_config(algorithms, self._passes(), self.plan().orders)

    # ------------------------------------------------------------------------------------------
    # checkpoints
    # ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = self.state
        if state is None:
            return {}
        from composer_bridge import __version__

        return {
            "format": FORMAT,
            "version": __version__,
            "seed": int(state.seed) if state.seed is not None else None,
            "timestamp": state.timestamp.state_dict(),
            "algorithms": [algorithm_entry(a) for a in state.algorithms],
            "callbacks": [{"class": type(c).__name__, "state": c.state_dict()} for c in state.callbacks],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = check_bridge_state(state_dict)
        state = self.state
        assert state is not None, "load_state_dict before setup"
        state.timestamp.load_state_dict(saved["timestamp"])
        if saved.get("seed") is not None:
            state.seed = saved["seed"]
        entries = list(saved["algorithms"])
        for algorithm in state.algorithms:
            index = next((i for i, e in enumerate(entries) if e["class"] == type(algorithm).__name__), None)
            if index is None:
                log.info("%s is new in this run: it starts fresh (no state for it in the checkpoint).", type(algorithm).__name__)
                continue
            entry = entries.pop(index)
            try:
                algorithm.load_state_dict(dict(entry.get("state", {})))
            except Exception as error:
                raise CheckpointStateError(
                    f"Could not restore {type(algorithm).__name__} from the checkpoint: {error}. "
                    "Was the checkpoint written with different hyper-parameters for it?"
                ) from error
        callback_entries = list(saved.get("callbacks", []))
        for callback in state.callbacks:
            index = next((i for i, e in enumerate(callback_entries) if e.get("class") == type(callback).__name__), None)
            if index is not None:
                callback.load_state_dict(dict(callback_entries.pop(index).get("state", {})))
        self._run(Event.AFTER_LOAD)

    def _check_checkpoint_fits(self, checkpoint: dict[str, Any]) -> None:
        """Before the weights load: refuse (or repair) a checkpoint that needs surgery this run lacks."""
        state = self.state
        assert state is not None
        raw = (checkpoint.get("callbacks") or {}).get(self.state_key)
        surgery_here = [type(a).__name__ for a in state.algorithms if type(a).required_on_load()]
        if raw is None:
            if surgery_here and "state_dict" in checkpoint:
                warnings.warn(
                    "This checkpoint holds no composer_bridge state (it was written without AlgorithmEngineCallback); "
                    f"its weights were saved without the model surgery of {', '.join(surgery_here)}, so they may "
                    "not fit this run's modified model.",
                    stacklevel=2,
                )
            return
        saved = check_bridge_state(raw)
        needed = [e for e in saved["algorithms"] if e.get("required_on_load")]
        present = [type(a).__name__ for a in state.algorithms]
        missing = []
        for entry in needed:
            if entry["class"] in present:
                present.remove(entry["class"])
            else:
                missing.append(entry)
        if not missing:
            return
        if not self.add_missing_on_load:
            names = ", ".join(f"{e['class']}({', '.join(f'{k}={v!r}' for k, v in e.get('hparams', {}).items())})" for e in missing)
            raise CheckpointStateError(
                f"The checkpoint was written with model-surgery algorithms this run lacks: {names}. Its weights "
                "belong to the modified model and cannot load into this one. Fix: add them to "
                "AlgorithmEngineCallback(algorithms=[...]), or pass add_missing_on_load=True to re-create them."
            )
        if getattr(self._trainer.strategy if self._trainer else None, "restore_checkpoint_after_setup", False):
            raise CheckpointStateError(
                f"The checkpoint needs {', '.join(e['class'] for e in missing)}, and this strategy restores "
                "checkpoints after the model is wrapped and the optimizers exist, too late to re-create model "
                "surgery. Add them to AlgorithmEngineCallback(algorithms=[...]) instead of add_missing_on_load."
            )
        known = known_algorithm_classes(self.known_algorithms)
        for entry in missing:
            algorithm = rebuild_algorithm(entry, known)
            warnings.warn(f"Re-created {algorithm!r} from the checkpoint (add_missing_on_load=True).", stacklevel=2)
            state.algorithms = [*state.algorithms, algorithm]
            self.algorithms = state.algorithms
            if algorithm.match(Event.INIT, state):
                algorithm.apply(Event.INIT, state, self.logger)


def _check_unique(algorithms: list[Algorithm]) -> None:
    seen: set[str] = set()
    for algorithm in algorithms:
        name = type(algorithm).__name__
        if algorithm.unique and name in seen:
            raise ValueError(
                f"{name} appears more than once in algorithms; it must be unique in a run (two instances would "
                f"apply it twice). Keep one {name}(...) with the settings you want."
            )
        seen.add(name)


def _check_engine_callbacks(callbacks: Any) -> list[EngineCallback]:
    if callbacks is None:
        return []
    items = [callbacks] if isinstance(callbacks, EngineCallback) else callbacks
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"callbacks must be a list of composer_bridge.Callback, got {type(callbacks).__name__}.")
    for i, callback in enumerate(items):
        if isinstance(callback, L.Callback):
            raise TypeError(
                f"callbacks[{i}] = {callback!r} is a Lightning callback; pass it to lightning.Trainer(callbacks=[...]). "
                "AlgorithmEngineCallback(callbacks=...) takes engine-side composer_bridge.Callback objects."
            )
        if not isinstance(callback, EngineCallback):
            raise TypeError(
                f"callbacks[{i}] = {callback!r} ({type(callback).__name__}) is not a composer_bridge.Callback."
            )
    return list(items)


def _training(trainer: L.Trainer) -> bool:
    """``trainer.training``, read without the string comparison its property makes (a per-step hot path)."""
    return trainer.state.stage is RunningStage.TRAINING


def _default_seed() -> int:
    env = os.environ.get("PL_GLOBAL_SEED")
    if env is not None and env.lstrip("-").isdigit():
        return int(env)
    return int(torch.initial_seed() % (2**63))


def _max_duration(trainer: L.Trainer) -> Time | None:
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return Time(int(trainer.max_steps), TimeUnit.BATCH)
    max_epochs = trainer.max_epochs
    if max_epochs is not None and max_epochs > 0:
        return Time(int(max_epochs), TimeUnit.EPOCH)
    return None
