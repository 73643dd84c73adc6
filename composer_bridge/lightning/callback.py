"""The :class:`AlgorithmEngineCallback`: Composer's algorithm engine inside ``lightning.Trainer`` or ``pl.Trainer``.

Example:
    >>> import lightning as L
    >>> from composer_bridge.algorithms import LabelSmoothing
    >>> trainer = L.Trainer(
    ...     max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
    ...     callbacks=[AlgorithmEngineCallback([LabelSmoothing(0.1)])])

Each Lightning hook below fires the events :data:`~composer_bridge.lightning.hook_map.HOOK_EVENTS`
lists for it, and does little else. The jobs around the mapping live in objects the callback holds:
:class:`~composer_bridge.lightning.module_hooks.ModuleHooks` (instance hooks on the module),
:class:`~composer_bridge.lightning.step_clock.StepClock` (micro-batches, steps, wall-clock),
:class:`~composer_bridge.lightning.checkpoint_state.BridgeCheckpoint` (checkpoints),
:mod:`~composer_bridge.lightning.setup_checks` (what is refused at setup),
:mod:`~composer_bridge.lightning.algorithm_runs` (a new model starts fresh), and
:class:`~composer_bridge.lightning.traces.TraceReporting` (traces to the loggers). Lightning
details that are not public API are used only through :mod:`~composer_bridge.lightning._compat`.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from composer_bridge.core.algorithm import Algorithm, check_algorithms
from composer_bridge.core.callback import Callback as EngineCallback
from composer_bridge.core.engine import Engine
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.passes import normalize_passes
from composer_bridge.core.state import State
from composer_bridge.core.time import Time, Timestamp, TimeUnit
from composer_bridge.lightning import _compat, algorithm_runs
from composer_bridge.lightning.checkpoint_state import BridgeCheckpoint, check_known_algorithms
from composer_bridge.lightning.cost_report import CostReport
from composer_bridge.lightning.cost_report import cost_report as build_cost_report
from composer_bridge.lightning.hook_map import HOOK_EVENTS
from composer_bridge.lightning.module import ComposerModuleMixin, _batch_size, attach_bridge, detach_bridge
from composer_bridge.lightning.module_hooks import ModuleHooks
from composer_bridge.lightning.package import CALLBACK_BASES, package_of
from composer_bridge.lightning.plan import Plan, make_plan
from composer_bridge.lightning.setup_checks import (
    BridgeConfigurationError,
    check_module,
    check_one_package,
    check_trainer,
)
from composer_bridge.lightning.step_clock import StepClock
from composer_bridge.lightning.traces import TraceMode, TraceReporting, TraceStore
from composer_bridge.lightning.wandb_report import wandb_run_config

if TYPE_CHECKING:  # hints name lightning.pytorch's classes; pytorch_lightning's work the same (package.py)
    import lightning as L

__all__ = ["AlgorithmEngineCallback", "BridgeConfigurationError"]

log = logging.getLogger(__name__)

# Lightning dispatches every hook to every callback (each through a profiler context), but skips a
# hook that is not callable (_compat.hide_hook). Hooks the bridge never needs stay hidden; the
# per-step hooks that only fire events are hidden while nothing listens, so an idle bridge
# receives one hook per step (on_train_batch_end, which keeps the step clock).
_UNUSED_STEP_HOOKS = ("on_before_zero_grad", "on_before_backward")
_EVENT_ONLY_STEP_HOOKS = ("on_train_batch_start", "on_after_backward", "on_before_optimizer_step")
# Lightning binds the module's log/log_dict onto every callback: they belong to the run, not to a copy.
_RUNTIME = ("state", "engine", "_trainer", "_hooks", "_initialized_model", "_run_event", "_clock", "logger", "_reporting",
            "_global_step", "log", "log_dict")


class AlgorithmEngineCallback(*CALLBACK_BASES):  # type: ignore[misc]
    """Run Composer-style algorithms (and engine callbacks) inside a ``lightning.Trainer`` or ``pl.Trainer``.

    A ``Callback`` of both Lightning packages (``lightning.pytorch`` and ``pytorch_lightning``): either
    Trainer, and ``LightningCLI``'s ``callbacks: list[Callback]``, accept it. The run's package is
    the Trainer's; a module or DataModule of the other package is refused at setup.

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

    One callback serves one model at a time. Given a *different* model (the same callback or
    algorithm instances reused in a new ``Trainer`` or ``fit``), the run starts fresh: new state,
    traces and costs, and every algorithm reset to how it was constructed. The same model keeps its
    state across ``fit``/``validate``/``test``/``predict`` calls. Copies (``copy.deepcopy``,
    ``pickle``) carry the configuration and the algorithms, not the run in progress.

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
        if isinstance(algorithms, type) and issubclass(algorithms, Algorithm):
            raise TypeError(
                f"AlgorithmEngineCallback({algorithms.__name__}) got the class {algorithms.__name__}, not an instance: "
                f"write AlgorithmEngineCallback([{algorithms.__name__}()])."
            )
        self.algorithms: list[Algorithm] = check_algorithms(algorithms if algorithms is not None else [])
        _check_unique(self.algorithms)
        self.engine_callbacks: list[EngineCallback] = _check_engine_callbacks(callbacks)
        self.algorithm_passes = normalize_passes(algorithm_passes)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"AlgorithmEngineCallback(seed={seed!r}): seed must be an int or None.")
        self.seed = seed
        self._checkpoint = BridgeCheckpoint(bool(add_missing_on_load), check_known_algorithms(known_algorithms))
        self.measure_cost = measure_cost
        self._trace_mode = trace_mode
        self._trace_file = trace_file
        self._cost: dict[str, list[float]] = {}  # kept across fit/validate calls of one model (see cost)
        self._conflicts: list[str] = []  # known conflicts found at setup, listed by plan()
        self.listening = False
        self._init_runtime()
        self._reporting = TraceReporting(trace_mode, trace_file)
        for name in _UNUSED_STEP_HOOKS + _EVENT_ONLY_STEP_HOOKS:
            self._hide(name)

    def _init_runtime(self) -> None:
        """The parts of the callback that belong to one run (dropped by copies)."""
        self.state: State | None = None
        self.engine: Engine | None = None
        self.logger = Logger()
        self._trainer: L.Trainer | None = None
        self._hooks: ModuleHooks | None = None
        self._clock = StepClock()
        self._initialized_model: int | None = None  # id() of the model INIT ran for
        self._global_step: Any = lambda: 0  # reads Lightning's global_step (set at on_train_start)
        # The hooks call the engine directly once it exists; before setup this raises a clear error.
        self._run_event: Any = self.run_event

    @property
    def add_missing_on_load(self) -> bool:
        """Re-create surgery algorithms a checkpoint needs and this run lacks (else refuse the checkpoint)."""
        return self._checkpoint.add_missing_on_load

    @property
    def known_algorithms(self) -> tuple[type, ...]:
        """Your own algorithm classes that ``add_missing_on_load`` may re-create."""
        return self._checkpoint.known_algorithms

    # ------------------------------------------------------------------------------------------
    # copies: configuration and algorithms, never the run in progress
    # ------------------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in _RUNTIME}
        state["listening"] = False
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()
        self._reporting = TraceReporting(self._trace_mode, self._trace_file)
        for name in _EVENT_ONLY_STEP_HOOKS:
            self._hide(name)

    # ------------------------------------------------------------------------------------------
    # engine plumbing
    # ------------------------------------------------------------------------------------------
    def _hide(self, name: str) -> None:
        """Hide a hook from Lightning, unless a subclass overrides it (its code then runs as written)."""
        if getattr(type(self), name) is getattr(AlgorithmEngineCallback, name):
            _compat.hide_hook(self, name)

    @property
    def cost(self) -> dict[str, list[float]]:
        """``"<Algorithm>/<EVENT>"`` → ``[calls, seconds in apply]``, kept across fit/validate calls.

        See :attr:`Engine.cost <composer_bridge.Engine.cost>` for how seconds are sampled, and
        :meth:`cost_report` for a table.
        """
        return self.engine.cost if self.engine is not None else self._cost

    def run_event(self, event: Event) -> Any:
        """Run ``event`` through the engine now (the hooks below call this)."""
        if self.engine is None:
            raise RuntimeError("AlgorithmEngineCallback.run_event was called before Trainer setup.")
        return self.engine.run_event(event)

    def fire_event(self, event: Event) -> None:
        """Run ``event`` through the engine, discarding its traces (the module hooks call this)."""
        self._run_event(event)

    def _fire(self, hook: str) -> None:
        for event in HOOK_EVENTS[hook]:
            self._run_event(event)

    def _new_engine(self) -> Engine:
        assert self.state is not None
        engine = Engine(self.state, self.logger, self.algorithm_passes, measure_cost=self.measure_cost)
        engine.cost = self._cost
        engine.on_handler_added = self._refresh_listening
        return engine

    def _refresh_listening(self) -> None:
        """Read whether anything listens; the first time something does, install the module's event hooks.

        Called at setup, between steps and at the start of evaluation. While no algorithm, engine
        callback or handler exists, the bridge fires no per-step event and hooks nothing into the
        module, so an empty bridge costs only its step bookkeeping. A handler (``engine.on``) is
        heard at once; an algorithm or engine callback added during a run, from the next step on.
        """
        listening = self.engine is not None and self.engine.has_listeners()
        self._clock.timing = listening  # only a listener can read the wall-clock (see StepClock)
        if listening and self._hooks is not None and self._trainer is not None:
            self._hooks.install_events(self._trainer)
        if listening is not self.listening:
            self.listening = listening
            for name in _EVENT_ONLY_STEP_HOOKS:
                if listening:
                    _compat.show_hook(self, name)
                else:
                    self._hide(name)
            if listening and self.state is not None:  # an idle bridge leaves the logger's step behind
                self.logger.step = self._current_step()

    # ------------------------------------------------------------------------------------------
    # setup: a run per model, INIT, checks, module hooks
    # ------------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_one_package(trainer, pl_module)
        self._trainer = trainer
        if self.state is None or self.state.model is not pl_module:
            self._start_run(pl_module)
        state = self.state
        assert state is not None
        state.trainer = trainer
        state.rank = trainer.global_rank
        state.world_size = trainer.world_size
        state.precision = str(trainer.precision)
        state.device = trainer.strategy.root_device
        state.accumulate_grad_batches = trainer.accumulate_grad_batches
        state.automatic_optimization = bool(pl_module.automatic_optimization)
        state.max_duration = _max_duration(trainer)
        # One destination: the traces' store and reports, which also forwards metrics to the Lightning loggers.
        self.logger.destinations = [self._reporting.destination(trainer, self._current_step)]
        self.logger.step = self._current_step()
        if self.engine is None or self.engine.closed:
            self.engine = self._new_engine()
        self._run_event = self.engine.fire
        check_module(state.algorithms, pl_module, isinstance(pl_module, ComposerModuleMixin))
        if stage == "fit":  # TrainerFn.FITTING of either package
            self._conflicts = check_trainer(state.algorithms, trainer, state.automatic_optimization)
            for sentence in self._conflicts:
                warnings.warn(sentence, stacklevel=2)
            self._configure_ddp(trainer)
        if self._hooks is None or self._hooks.module is not pl_module:
            self._remove_hooks()
            self._hooks = ModuleHooks(pl_module, self)
        attach_bridge(pl_module, self)
        self._refresh_listening()
        if self._initialized_model != id(pl_module):
            self._initialized_model = id(pl_module)
            self._fire("setup")
        self._load_deferred()

    def _load_deferred(self) -> None:
        """Apply a checkpoint entry restored before setup, or fire the AFTER_LOAD a restore after teardown left due."""
        raw = self._checkpoint.take_deferred()
        if raw is not None:
            self._checkpoint.load(self.state, raw)
        if raw is not None or self._checkpoint.after_load_due:
            self._checkpoint.after_load_due = False
            self._fire("load_state_dict")

    def _start_run(self, pl_module: L.LightningModule) -> None:
        """A new model: fresh state, traces and costs; algorithms that served another run start fresh."""
        if self.state is not None:
            log.info("AlgorithmEngineCallback: a new model (%s); the run starts fresh.", type(pl_module).__name__)
            self._remove_hooks()
            self._cost = {}
            self._reporting = TraceReporting(self._trace_mode, self._trace_file)
            self._clock = StepClock()
            self.engine = None
            self._initialized_model = None
            self._checkpoint.after_load_due = False  # the previous model's restore
        run = algorithm_runs.new_run_id()
        for algorithm in self.algorithms:
            if algorithm_runs.bind(algorithm, run):
                log.info("%s served another run: it starts fresh for %s.", type(algorithm).__name__, type(pl_module).__name__)
        self.state = State(pl_module, algorithms=self.algorithms, callbacks=self.engine_callbacks)
        self.state.seed = self.seed if self.seed is not None else _default_seed()

    def _configure_ddp(self, trainer: L.Trainer) -> None:
        assert self.state is not None
        needy = [type(a).__name__ for a in self.state.algorithms if a.find_unused_parameters]
        if not needy:
            return
        kwargs = _compat.ddp_kwargs(trainer.strategy)
        if kwargs is None:  # not DDP: nothing to tell
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

    # ------------------------------------------------------------------------------------------
    # the step bodies ComposerModule and the module hooks call while the bridge is attached
    # ------------------------------------------------------------------------------------------
    def composer_train_step(self, module: ComposerModuleMixin, batch: Any) -> tuple[Any, Any, torch.Tensor]:
        """Forward and loss of one training micro-batch, with their events; returns (batch, outputs, loss)."""
        state = self.state
        assert state is not None
        run = self._run_event
        before_forward, after_forward, before_loss, after_loss, before_backward = HOOK_EVENTS["training_step"]
        state.batch = batch
        run(before_forward)
        state.outputs = module(state.batch)
        run(after_forward)
        run(before_loss)
        state.loss = module.loss(state.outputs, state.batch)
        run(after_loss)
        run(before_backward)
        return state.batch, state.outputs, state.loss

    def composer_eval_forward(self, module: ComposerModuleMixin, batch: Any) -> Any:
        """The evaluation forward pass, between EVAL_BEFORE_FORWARD and EVAL_AFTER_FORWARD."""
        return self._forward_between(module, batch, "validation_step")

    def composer_predict_forward(self, module: ComposerModuleMixin, batch: Any) -> Any:
        """The prediction forward pass, between PREDICT_BEFORE_FORWARD and PREDICT_AFTER_FORWARD."""
        return self._forward_between(module, batch, "predict_step")

    def _forward_between(self, module: ComposerModuleMixin, batch: Any, hook: str) -> Any:
        state = self.state
        assert state is not None
        before, after = HOOK_EVENTS[hook]
        state.batch = batch
        self._run_event(before)
        state.outputs = module.eval_forward(state.batch)
        self._run_event(after)
        return state.outputs

    def after_dataloader(self, batch: Any) -> Any:
        """The module's ``on_after_batch_transfer`` (training): AFTER_DATALOADER may replace the batch."""
        state = self.state
        assert state is not None
        state.microbatch_index = self._clock.micro
        state.batch = batch
        self._clock.loaded_samples = _batch_size(batch) or 0  # as loaded, before AFTER_DATALOADER (Composer's count)
        if self.listening:
            self._fire("on_after_batch_transfer")
        return state.batch

    def before_load(self, checkpoint: dict[str, Any]) -> None:
        """The module's ``on_load_checkpoint``: BEFORE_LOAD, then refuse (or repair) a checkpoint that does not fit."""
        state = self.state
        assert state is not None
        self._fire("on_load_checkpoint")
        raw = (checkpoint.get("callbacks") or {}).get(self.state_key)
        strategy = self._trainer.strategy if self._trainer is not None else None
        rebuilt = self._checkpoint.check_fits(
            state, raw, "state_dict" in checkpoint, _compat.restores_checkpoint_after_setup(strategy)
        )
        for algorithm in rebuilt:
            algorithm_runs.bind(algorithm, algorithm_runs.new_run_id())
            state.algorithms = [*state.algorithms, algorithm]
            self.algorithms = state.algorithms
            if algorithm.match(Event.INIT, state):
                algorithm.apply(Event.INIT, state, self.logger)

    # ------------------------------------------------------------------------------------------
    # fit
    # ------------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = self.state
        assert state is not None
        state.optimizers = list(trainer.optimizers)
        state.schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        state.device = pl_module.device
        self.logger.step = self._current_step()  # after a checkpoint restored the timestamp
        given = list(state.optimizers)
        self._fire("on_fit_start")
        if any(a is not b for a, b in zip(state.optimizers, given, strict=False)):
            _compat.set_strategy_optimizers(trainer, state.optimizers)  # an algorithm wrapped them (SAM)
        self._reporting.fit_start(trainer, lambda: self.plan().text, self._run_config)
        self._refresh_listening()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = self.state
        assert state is not None
        state.dataloader = trainer.train_dataloader
        batches = trainer.num_training_batches
        if isinstance(batches, int) or (isinstance(batches, float) and batches != float("inf")):
            state.dataloader_len = -(-int(batches) // max(1, trainer.accumulate_grad_batches))
        self._global_step = _compat.step_counter(trainer, bool(pl_module.automatic_optimization))
        self._clock.start_fit(self._global_step())
        if state.timestamp.batch.value == 0 and state.timestamp.epoch.value == 0:
            self._fire("on_train_start")
        if self._clock.epoch_left_open(state, trainer.current_epoch):  # resumed from an epoch's last batch
            self.on_train_epoch_end(trainer, pl_module)
            self.on_train_epoch_start(trainer, pl_module)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._clock.start_epoch(trainer.current_epoch):
            return
        if self.state is not None:
            self.state.microbatch_index = 0
        self._refresh_listening()
        self._fire("on_train_epoch_start")

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        # Hidden while nothing listens. The first micro-batch of a step opens it (the clock counts
        # micro-batches also while this hook was hidden, so a bridge that began listening mid-step
        # waits for the next step).
        if self._clock.micro == 0 and self.listening:
            self.logger.step = self._current_step()
            self._fire("on_train_batch_start")

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.listening and _compat.is_training(trainer):
            self._fire("on_after_backward")

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        state = self.state
        if state is None or not self.listening:
            return
        state.stepping_optimizer = optimizer
        try:
            self._fire("on_before_optimizer_step")
        finally:
            state.stepping_optimizer = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        state = self.state
        assert state is not None
        # The data hook counted the micro-batch's samples as loaded; without it (an idle bridge), counted here.
        samples = (_batch_size(batch) or 0) if self._clock.loaded_samples is None else 0
        if not self._clock.end_micro_batch(state, samples, self._global_step()):
            return
        if self.listening:
            self.logger.step = self._current_step()
            self._fire("on_train_batch_end")
            self._honour_stop(trainer)
        self._refresh_listening()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = self.state
        assert state is not None
        state.timestamp = state.timestamp.to_next_epoch()
        self._clock.reset_step()
        state.microbatch_index = 0
        self._fire("on_train_epoch_end")
        self._honour_stop(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = self.state
        assert state is not None
        state.timestamp = state.timestamp.to_next_iteration()
        self._fire("on_train_end")
        self._reporting.fit_end(trainer, self._current_step(), self.cost)

    def _honour_stop(self, trainer: L.Trainer) -> None:
        if self.state is not None and self.state.stop_requested:
            trainer.should_stop = True

    # ------------------------------------------------------------------------------------------
    # evaluation and prediction
    # ------------------------------------------------------------------------------------------
    def _eval_start(self, trainer: L.Trainer, hook: str) -> None:
        state = self.state
        assert state is not None
        self._refresh_listening()
        self._clock.start_eval()
        state.sanity_checking = bool(trainer.sanity_checking)
        state.eval_timestamp = Timestamp()
        state.evaluating = True
        standalone = _standalone(trainer)
        self._fire(f"{hook}[standalone]" if standalone and hook == "on_validation_start" else hook)

    def _eval_end(self, trainer: L.Trainer, hook: str) -> None:
        state = self.state
        assert state is not None
        standalone = _standalone(trainer)
        try:
            self._fire(f"{hook}[standalone]" if standalone and hook == "on_validation_end" else hook)
        finally:
            state.evaluating = False
            state.sanity_checking = False
            self._clock.end_eval()  # evaluation is not batch time

    def _eval_batch_end(self, hook: str) -> None:
        state = self.state
        assert state is not None
        state.eval_timestamp = state.eval_timestamp.to_next_batch()
        self._fire(hook)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._eval_start(trainer, "on_validation_start")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._eval_end(trainer, "on_validation_end")

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._fire("on_validation_batch_start")

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end("on_validation_batch_end")

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._eval_start(trainer, "on_test_start")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._eval_end(trainer, "on_test_end")

    def on_test_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._fire("on_test_batch_start")

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end("on_test_batch_end")

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert self.state is not None
        self._refresh_listening()
        self.state.eval_timestamp = Timestamp()
        self.state.evaluating = True
        self._fire("on_predict_start")

    def on_predict_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._fire("on_predict_batch_start")

    def on_predict_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end("on_predict_batch_end")

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert self.state is not None
        try:
            self._fire("on_predict_end")
        finally:
            self.state.evaluating = False

    # ------------------------------------------------------------------------------------------
    # shutdown
    # ------------------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        self._reporting.close()
        if self.engine is not None:
            self.engine.close()
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        if self._hooks is not None:
            detach_bridge(self._hooks.module)
            self._hooks.remove()
            self._hooks = None
        if self.listening:
            self.listening = False
            for name in _EVENT_ONLY_STEP_HOOKS:
                self._hide(name)

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
        Conflicts with the Trainer (Lightning's own weight averaging or gradient clipping, ...) are
        found at setup and listed from then on.
        """
        algorithms = self.state.algorithms if self.state is not None else self.algorithms
        plan = make_plan(algorithms, self._passes(), self.state, self.traces.stats)
        plan.warnings.extend(w for w in self._conflicts if w not in plan.warnings)
        return plan

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
        return self.state.batch_count if self.state is not None else 0

    def _run_config(self) -> dict[str, Any]:
        algorithms = self.state.algorithms if self.state is not None else self.algorithms
        return wandb_run_config(algorithms, self._passes(), self.plan().orders)

    # ------------------------------------------------------------------------------------------
    # checkpoints (checkpoint_state.BridgeCheckpoint)
    # ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.state is None:
            return dict(self._checkpoint.deferred or {})
        from composer_bridge import __version__

        self._checkpoint.warn_if_step_open(self._clock.step_open(self._global_step()))
        return self._checkpoint.save(self.state, __version__)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Lightning restores callbacks before setup (ahead of validate/test/predict) and after
        # teardown (its HPC restore): the first is kept for setup, the second fires AFTER_LOAD there.
        if self.state is None:
            self._checkpoint.defer(state_dict)
            return
        self._checkpoint.load(self.state, state_dict)
        if self.engine is None or self.engine.closed:
            self._checkpoint.after_load_due = True
            return
        self._fire("load_state_dict")


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
        if isinstance(callback, CALLBACK_BASES):
            raise TypeError(
                f"callbacks[{i}] = {callback!r} is a Lightning callback; pass it to lightning.Trainer(callbacks=[...]). "
                "AlgorithmEngineCallback(callbacks=...) takes engine-side composer_bridge.Callback objects."
            )
        if not isinstance(callback, EngineCallback):
            raise TypeError(
                f"callbacks[{i}] = {callback!r} ({type(callback).__name__}) is not a composer_bridge.Callback."
            )
    return list(items)


def _default_seed() -> int:
    env = os.environ.get("PL_GLOBAL_SEED")
    if env is not None and env.lstrip("-").isdigit():
        return int(env)
    return int(torch.initial_seed() % (2**63))


def _standalone(trainer: L.Trainer) -> bool:
    """Whether the Trainer runs ``validate``/``test`` on their own (not inside ``fit``)."""
    fn = package_of(trainer).TrainerFn  # the Trainer's own package
    return trainer.state.fn in (fn.VALIDATING, fn.TESTING)


def _max_duration(trainer: L.Trainer) -> Time | None:
    """The run's length from ``max_steps``/``max_epochs``; ``None`` when only ``max_time`` (or nothing) bounds it."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return Time(int(trainer.max_steps), TimeUnit.BATCH)
    max_epochs = trainer.max_epochs
    if max_epochs is not None and max_epochs > 0:
        return Time(int(max_epochs), TimeUnit.EPOCH)
    return None
