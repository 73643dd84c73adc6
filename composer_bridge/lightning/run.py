"""One model's run inside the bridge: everything that belongs to it, built in one place and dropped in one place.

:class:`~composer_bridge.AlgorithmEngineCallback` holds its configuration (algorithms, passes,
seed, trace settings) and one :class:`BridgeRun`, which it gives that configuration as a
:class:`~composer_bridge.lightning.run_settings.RunSettings`. The run holds its parts:

- ``steps``, the module-facing step API (:class:`~composer_bridge.lightning.steps.ModuleSteps`):
  the :class:`~composer_bridge.State`, the :class:`~composer_bridge.training.step_clock.StepClock`,
  whether anything listens, and the engine's ``fire``. The module holds it weakly;
- ``checkpoint``, its part in Lightning's checkpoints
  (:class:`~composer_bridge.lightning.run_checkpoint.RunCheckpoint`);
- the :class:`~composer_bridge.Engine` and its logger, the hooks installed on the module
  (:class:`~composer_bridge.lightning.module_hooks.ModuleHooks`), the traces
  (:class:`~composer_bridge.lightning.traces.TraceReporting`), the cost of each algorithm and
  the conflicts found at setup.

A copy of the callback, or a *different* model given to it, gets a new run; the same model
keeps its run across ``fit``/``validate``/``test``/``predict``.

Each Lightning hook of the callback hands itself to the method of the same moment here, which
keeps the state in step with the Trainer and fires the events
:data:`~composer_bridge.lightning.hook_map.HOOK_EVENTS` lists for the hook. The run holds no
handle back to the callback: it says when :attr:`BridgeRun.listening` changes to whoever set
:attr:`BridgeRun.on_listening_changed` (the callback then shows or hides its per-step hooks), and
the callback reads the rest (an epoch reopened when :meth:`BridgeRun.train_start` says so) from it.

Examples:
    >>> from composer_bridge.algorithms import LabelSmoothing
    >>> from composer_bridge.lightning.run_settings import RunSettings
    >>> run = BridgeRun(RunSettings(algorithms=[LabelSmoothing(0.1)]))
    >>> run.state is None, run.listening, run.cost
    (True, False, {})
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from composer_bridge.core.algorithm import declaring
from composer_bridge.core.engine import Engine, resolve_passes
from composer_bridge.core.logger import Logger
from composer_bridge.core.passes import AlgorithmPass
from composer_bridge.core.state import State
from composer_bridge.core.time import Time, Timestamp, TimeUnit
from composer_bridge.lightning import _compat
from composer_bridge.lightning.batch_keys import give_declared_keys
from composer_bridge.lightning.module import ComposerModuleMixin, attach_run, detach_run
from composer_bridge.lightning.module_hooks import ModuleHooks
from composer_bridge.lightning.optimizers import hand_over
from composer_bridge.lightning.package import package_of
from composer_bridge.lightning.profiling import markers_for
from composer_bridge.lightning.run_checkpoint import RunCheckpoint
from composer_bridge.lightning.run_settings import RunSettings
from composer_bridge.lightning.setup_checks import check_module, check_one_package, check_trainer
from composer_bridge.lightning.steps import ModuleSteps
from composer_bridge.lightning.traces import TraceReporting
from composer_bridge.lightning.training_loop import TrainingLoop
from composer_bridge.lightning.wandb_report import wandb_run_config
from composer_bridge.training import algorithm_runs
from composer_bridge.training.cost_report import CostReport
from composer_bridge.training.cost_report import cost_report as build_cost_report
from composer_bridge.training.plan import Plan, make_plan
from composer_bridge.training.step_clock import StepClock

if TYPE_CHECKING:  # hints name lightning.pytorch's classes; pytorch_lightning's work the same (package.py)
    import lightning as L

__all__ = ["BridgeRun"]

log = logging.getLogger(__name__)


class BridgeRun:
    """The run in progress for one model: its step API, checkpoint part, engine, logger, module hooks, traces.

    Args:
        settings: what the run uses of the :class:`~composer_bridge.AlgorithmEngineCallback` that
            starts it (its algorithms, engine callbacks, passes, seed, trace settings, checkpoint rules).
    """

    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings
        #: the module-facing step API: state, clock, listening, the engine's fire
        self.steps = ModuleSteps(before_load=self._before_checkpoint_load)
        #: what the run writes into and reads from Lightning's checkpoints
        self.checkpoint = RunCheckpoint(settings.checkpoint, settings.state_key)
        #: the engine (a new one after a ``teardown`` closed the previous one)
        self.engine: Engine | None = None
        self.logger = Logger()
        self.trainer: L.Trainer | None = None
        #: the run's part in Lightning's training loop (it refreshes who listens after each step)
        self.loop = TrainingLoop(self.steps, self.logger, self.refresh_listening)
        #: called with the new value whenever :attr:`listening` changes (the callback shows or hides
        #: its per-step hooks from Lightning then, so nothing is read per dispatch)
        self.on_listening_changed: Callable[[bool], None] | None = None
        self.hooks: ModuleHooks | None = None
        self.reporting = TraceReporting(settings.trace_mode, settings.trace_file)
        self._cost: dict[str, list[float]] = {}  # kept across the engines of this run (see cost)
        #: known conflicts with the Trainer found at setup, listed by ``plan()``
        self.conflicts: list[str] = []
        self.initialized = False  # INIT ran for this model

    @property
    def state(self) -> State | None:
        """The run's state, built at the first ``setup`` (``None`` before)."""
        return self.steps.state

    @property
    def listening(self) -> bool:
        """Whether anything listens to the per-step events (an algorithm, engine callback or handler)."""
        return self.steps.listening

    @property
    def clock(self) -> StepClock:
        """Micro-batches and steps of the training loop."""
        return self.steps.clock

    @property
    def model(self) -> torch.nn.Module | None:
        """The model this run serves (``None`` before setup)."""
        return self.state.model if self.state is not None else None

    @property
    def cost(self) -> dict[str, list[float]]:
        """``"<Algorithm>/<EVENT>"`` → ``[calls, seconds in apply]``, kept across the engines of this run."""
        return self.engine.cost if self.engine is not None else self._cost

    def current_step(self) -> int:
        return self.state.batch_count if self.state is not None else 0

    def fire_hook(self, hook: str) -> None:
        """Fire the events :data:`~composer_bridge.lightning.hook_map.HOOK_EVENTS` lists for ``hook``, in order."""
        self.steps.fire_hook(hook)

    # ------------------------------------------------------------------------------------------
    # setup: the state, INIT, checks, module hooks
    # ------------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_one_package(trainer, pl_module)
        self.trainer = trainer
        if self.state is None:
            self._start(pl_module)
        state = self.steps.live_state()
        state.trainer = trainer
        state.rank = trainer.global_rank
        state.world_size = trainer.world_size
        state.precision = str(trainer.precision)
        state.device = trainer.strategy.root_device
        state.accumulate_grad_batches = trainer.accumulate_grad_batches
        state.automatic_optimization = bool(pl_module.automatic_optimization)
        state.max_duration = _max_duration(trainer)
        # One destination: the traces' store and reports, which also forwards metrics to the Lightning loggers.
        self.logger.destinations = [self.reporting.destination(trainer, self.current_step)]
        self.logger.step = self.current_step()
        if self.engine is None or self.engine.closed:
            self.engine = self._new_engine(state)
        # the Trainer's profiler gets the engine's markers (none under the default PassThroughProfiler)
        self.engine.profiler = markers_for(trainer)
        self.steps.connect(state, self.engine.fire)
        self.steps.marker_only = self.engine.run_marker_only_event if self.engine.profiler is not None else None
        give_declared_keys(state.algorithms, pl_module)
        check_module(state.algorithms, pl_module, isinstance(pl_module, ComposerModuleMixin))
        if stage == "fit":  # TrainerFn.FITTING of either package
            self.conflicts = check_trainer(state.algorithms, trainer, state.automatic_optimization)
            for sentence in self.conflicts:
                warnings.warn(sentence, stacklevel=3)
            _configure_ddp(state, trainer)
        if self.hooks is None:
            self.hooks = ModuleHooks(pl_module, self.steps)
        attach_run(pl_module, self.steps)
        self.refresh_listening()
        if not self.initialized:
            self.initialized = True
            self.fire_hook("setup")
        if self.checkpoint.load_deferred(state):
            self.fire_hook("load_state_dict")

    def _start(self, pl_module: L.LightningModule) -> None:
        """The first setup: the state; algorithms that served another run start fresh."""
        settings = self.settings
        run = algorithm_runs.new_run_id()
        for algorithm in settings.algorithms:
            if algorithm_runs.bind(algorithm, run):
                log.info("%s served another run: it starts fresh for %s.", type(algorithm).__name__, type(pl_module).__name__)
        state = State(pl_module, algorithms=settings.algorithms, callbacks=settings.engine_callbacks)
        state.seed = settings.seed if settings.seed is not None else _default_seed()
        self.steps.connect(state)

    def _new_engine(self, state: State) -> Engine:
        engine = Engine(state, self.logger, self.settings.algorithm_passes, measure_cost=self.settings.measure_cost)
        engine.cost = self._cost
        engine.on_handler_added = self.refresh_listening
        return engine

    def refresh_listening(self) -> None:
        """Read whether anything listens; the first time something does, install the module's event hooks.

        Called at setup, between steps and at the start of evaluation. While no algorithm, engine
        callback or handler exists, the bridge fires no per-step event and hooks nothing into the
        module (and the callback's per-step hooks stay hidden from Lightning), so an empty bridge
        costs only its step bookkeeping. A handler (``engine.on``) is heard at once; an algorithm
        or engine callback added during a run, from the next step on.
        """
        # Runs after every optimizer step: attribute reads only, until something changes.
        engine, steps = self.engine, self.steps
        listening = engine is not None and engine.has_listeners()
        steps.clock.timing = listening  # only a listener can read the wall-clock (see StepClock)
        hooks = self.hooks
        if listening and hooks is not None and not hooks.events_installed and self.trainer is not None:
            hooks.install_events(self.trainer)
        if listening is not steps.listening:
            self._set_listening(listening)
            if listening and steps.state is not None:  # an idle bridge leaves the logger's step behind
                self.logger.step = steps.state.batch_count

    def _set_listening(self, listening: bool) -> None:
        self.steps.listening = listening
        if self.on_listening_changed is not None:
            self.on_listening_changed(listening)

    # ------------------------------------------------------------------------------------------
    # checkpoints (the callback's state_dict / load_state_dict / on_*_checkpoint; see RunCheckpoint)
    # ------------------------------------------------------------------------------------------
    def checkpoint_entry(self, version: str) -> dict[str, Any]:
        return self.checkpoint.entry(self.state, self.state is not None and self.step_open(), version)

    def restore(self, state_dict: dict[str, Any]) -> None:
        engine_open = self.engine is not None and not self.engine.closed
        if self.checkpoint.restore(self.state, state_dict, engine_open):
            self.fire_hook("load_state_dict")

    def save_loss_record(self, checkpoint: dict[str, Any]) -> None:
        """Write the loss a plain module's steps computed into ``checkpoint`` (during fit and after it)."""
        self.checkpoint.save_loss_record(checkpoint, self.hooks.loss_record() if self.hooks is not None else None)

    def load_loss_record(self, checkpoint: dict[str, Any]) -> None:
        """Give a checkpoint's loss record to the plain loss step (Lightning restores after setup, before training)."""
        if self.hooks is not None:
            self.hooks.load_loss_record(checkpoint)

    def _before_checkpoint_load(self, checkpoint: dict[str, Any]) -> None:
        """The module's ``on_load_checkpoint`` (:meth:`ModuleSteps.before_checkpoint_load`): BEFORE_LOAD, then the fit check."""
        state = self.steps.live_state()
        self.fire_hook("on_load_checkpoint")
        self.checkpoint.add_missing(state, checkpoint, self.trainer, self.logger, self.settings.algorithms)

    # ------------------------------------------------------------------------------------------
    # fit
    # ------------------------------------------------------------------------------------------
    def fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = self.steps.live_state()
        state.device = pl_module.device
        self.logger.step = self.current_step()  # after a checkpoint restored the timestamp
        # the user's optimizers and schedulers, handed to the algorithms that replace them (SAM, Muon, ...)
        hand_over(trainer, state, lambda: self.fire_hook("on_fit_start"))
        self.reporting.fit_start(trainer, lambda: self.plan().text, self._run_config)
        self.refresh_listening()

    def train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
        """``on_train_start``; returns whether the fit resumed from an epoch's last batch (see :meth:`TrainingLoop.start`)."""
        reopen = self.loop.start(trainer, pl_module, self.checkpoint.restored)
        self.checkpoint.restored = False
        return reopen

    def train_epoch_start(self, trainer: L.Trainer) -> None:
        if self.loop.epoch_start(trainer):
            self.refresh_listening()
            self.fire_hook("on_train_epoch_start")

    def train_end(self, trainer: L.Trainer) -> None:
        self.loop.end()
        self.reporting.fit_end(trainer, self.current_step(), self.cost)

    def step_open(self) -> bool:
        """Whether Lightning finished an optimizer step the clock has not counted yet (see ``StepClock.step_open``)."""
        return self.loop.step_open()

    # ------------------------------------------------------------------------------------------
    # evaluation and prediction
    # ------------------------------------------------------------------------------------------
    def eval_start(self, trainer: L.Trainer, hook: str) -> None:
        state = self.steps.live_state()
        if self.steps.marker_only is not None:
            self.steps.mark_hook("on_validation_start[marker]")
        self.refresh_listening()
        self.clock.start_eval()
        state.sanity_checking = bool(trainer.sanity_checking)
        state.eval_timestamp = Timestamp()
        state.evaluating = True
        self.fire_hook(_variant(trainer, hook))

    def eval_end(self, trainer: L.Trainer, hook: str) -> None:
        state = self.steps.live_state()
        try:
            self.fire_hook(_variant(trainer, hook))
        finally:
            state.evaluating = False
            state.sanity_checking = False
            self.clock.end_eval()  # evaluation is not batch time

    def eval_batch_end(self, hook: str) -> None:
        state = self.steps.live_state()
        state.eval_timestamp = state.eval_timestamp.to_next_batch()
        self.fire_hook(hook)

    def predict_start(self) -> None:
        state = self.steps.live_state()
        self.refresh_listening()
        state.eval_timestamp = Timestamp()
        state.evaluating = True
        self.fire_hook("on_predict_start")

    def predict_end(self) -> None:
        state = self.steps.live_state()
        try:
            self.fire_hook("on_predict_end")
        finally:
            state.evaluating = False

    # ------------------------------------------------------------------------------------------
    # shutdown
    # ------------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """``teardown`` (and ``on_exception``): close the trace file and the engine, remove the module hooks."""
        self.reporting.close()
        if self.engine is not None:
            self.engine.close()
        self.remove_hooks()

    def fail(self, trainer: L.Trainer) -> None:
        """``on_exception``: report what ran, then shut down."""
        self.reporting.fit_end(trainer, self.current_step(), self.cost, failed=True)
        self.shutdown()

    def remove_hooks(self) -> None:
        """Remove the hooks on the module and stop listening (a later setup installs them again)."""
        if self.hooks is not None:
            self.checkpoint.kept_loss_record = self.hooks.loss_record() or self.checkpoint.kept_loss_record
            detach_run(self.hooks.module)
            self.hooks.remove()
            self.hooks = None
        if self.steps.listening:
            self._set_listening(False)

    # ------------------------------------------------------------------------------------------
    # what ran, in which order, at what cost
    # ------------------------------------------------------------------------------------------
    def plan(self) -> Plan:
        algorithms = self.state.algorithms if self.state is not None else self.settings.algorithms
        plan = make_plan(algorithms, self._passes(), self.state, self.reporting.store.stats)
        plan.warnings.extend(w for w in self.conflicts if w not in plan.warnings)
        return plan

    def cost_report(self) -> CostReport:
        train = self.state.timestamp.total_wct.total_seconds() if self.state is not None else None
        note = "" if self.settings.measure_cost else "Cost measurement is off: create the callback with measure_cost=True."
        return build_cost_report(self.cost, train_seconds=train, note=note)

    def _passes(self) -> list[AlgorithmPass]:
        if self.engine is not None:
            return self.engine.passes
        return resolve_passes(self.settings.algorithm_passes)

    def _run_config(self) -> dict[str, Any]:
        algorithms = self.state.algorithms if self.state is not None else self.settings.algorithms
        return wandb_run_config(algorithms, self._passes(), self.plan().orders)


def _variant(trainer: L.Trainer, hook: str) -> str:
    """``on_validation_start``/``_end`` under ``trainer.validate``/``test`` read the table's ``[standalone]`` row."""
    fn = package_of(trainer).TrainerFn  # the Trainer's own package
    if hook in ("on_validation_start", "on_validation_end") and trainer.state.fn in (fn.VALIDATING, fn.TESTING):
        return f"{hook}[standalone]"
    return hook


def _configure_ddp(state: State, trainer: L.Trainer) -> None:
    """Tell DDP about algorithms that may leave parameters without gradients."""
    needy = [type(a).__name__ for a in declaring(state.algorithms, "find_unused_parameters")]
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
            stacklevel=3,
        )


def _default_seed() -> int:
    env = os.environ.get("PL_GLOBAL_SEED")
    if env is not None and env.lstrip("-").isdigit():
        return int(env)
    return int(torch.initial_seed() % (2**63))


def _max_duration(trainer: L.Trainer) -> Time | None:
    """The run's length from ``max_steps``/``max_epochs``; ``None`` when only ``max_time`` (or nothing) bounds it."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return Time(int(trainer.max_steps), TimeUnit.BATCH)
    max_epochs = trainer.max_epochs
    if max_epochs is not None and max_epochs > 0:
        return Time(int(max_epochs), TimeUnit.EPOCH)
    return None
