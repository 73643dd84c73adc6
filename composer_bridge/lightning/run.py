"""One model's run inside the bridge: everything that belongs to it, built in one place and dropped in one place.

:class:`~composer_bridge.AlgorithmEngineCallback` holds its configuration (algorithms, passes,
seed, trace settings) and one :class:`BridgeRun`, which it gives that configuration as a
:class:`~composer_bridge.lightning.run_settings.RunSettings`. The run holds what a training run accumulates:
the :class:`~composer_bridge.State`, the :class:`~composer_bridge.Engine` and its logger, the
:class:`~composer_bridge.training.step_clock.StepClock`, the hooks installed on the module
(:class:`~composer_bridge.lightning.module_hooks.ModuleHooks`), the traces
(:class:`~composer_bridge.lightning.traces.TraceReporting`), the cost of each algorithm and the
conflicts found at setup. A copy of the callback, or a *different* model given to it, gets a
new run; the same model keeps its run across ``fit``/``validate``/``test``/``predict``.

Each Lightning hook of the callback hands itself to the method of the same moment here, which
keeps the state in step with the Trainer and fires the events
:data:`~composer_bridge.lightning.hook_map.HOOK_EVENTS` lists for the hook. The calls the module
makes during a step are the :class:`~composer_bridge.lightning.steps.ModuleSteps` API, which
the run implements.

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

from composer_bridge.core.engine import Engine, resolve_passes
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.passes import AlgorithmPass
from composer_bridge.core.state import State
from composer_bridge.core.time import Time, Timestamp, TimeUnit
from composer_bridge.lightning import _compat
from composer_bridge.lightning.batch_keys import give_declared_keys
from composer_bridge.lightning.hook_map import HOOK_EVENTS
from composer_bridge.lightning.module import ComposerModuleMixin, _batch_size, attach_run, detach_run
from composer_bridge.lightning.module_hooks import ModuleHooks
from composer_bridge.lightning.optimizers import hand_over
from composer_bridge.lightning.package import package_of
from composer_bridge.lightning.plain_loss import CHECKPOINT_KEY as PLAIN_LOSS_KEY
from composer_bridge.lightning.run_settings import RunSettings
from composer_bridge.lightning.setup_checks import check_module, check_one_package, check_trainer
from composer_bridge.lightning.steps import ModuleSteps
from composer_bridge.lightning.traces import TraceReporting
from composer_bridge.lightning.wandb_report import wandb_run_config
from composer_bridge.training import algorithm_runs
from composer_bridge.training.cost_report import CostReport
from composer_bridge.training.cost_report import cost_report as build_cost_report
from composer_bridge.training.plan import Plan, make_plan
from composer_bridge.training.resume_position import ResumePosition
from composer_bridge.training.step_clock import StepClock

if TYPE_CHECKING:  # hints name lightning.pytorch's classes; pytorch_lightning's work the same (package.py)
    import lightning as L

__all__ = ["BridgeRun"]

log = logging.getLogger(__name__)


class BridgeRun(ModuleSteps):
    """The run in progress for one model: state, engine, logger, step clock, module hooks, traces, cost, conflicts.

    Args:
        settings: what the run uses of the :class:`~composer_bridge.AlgorithmEngineCallback` that
            starts it (its algorithms, engine callbacks, passes, seed, trace settings, checkpoint rules).
    """

    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings
        #: the run's state, built at the first ``setup``
        self.state: State | None = None
        #: the engine (a new one after a ``teardown`` closed the previous one)
        self.engine: Engine | None = None
        self.logger = Logger()
        self.trainer: L.Trainer | None = None
        self.clock = StepClock()
        self.resume_position = ResumePosition()  # checked at a resumed fit's first batch
        self._restored = False  # a checkpoint's entry was restored since the last fit started
        self.hooks: ModuleHooks | None = None
        #: the loss a plain module's training_step computed, kept after teardown for checkpoints saved then
        self._loss_record: dict[str, Any] | None = None
        self.reporting = TraceReporting(settings.trace_mode, settings.trace_file)
        self._cost: dict[str, list[float]] = {}  # kept across the engines of this run (see cost)
        #: known conflicts with the Trainer found at setup, listed by ``plan()``
        self.conflicts: list[str] = []
        self.listening = False
        self.initialized = False  # INIT ran for this model
        self._global_step: Callable[[], int] = lambda: 0  # reads Lightning's global_step (set at on_train_start)
        self._fire_event: Callable[[Event], Any] = _not_set_up

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

    # ------------------------------------------------------------------------------------------
    # setup: the state, INIT, checks, module hooks
    # ------------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_one_package(trainer, pl_module)
        self.trainer = trainer
        if self.state is None:
            self._start(pl_module)
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
        self.logger.destinations = [self.reporting.destination(trainer, self.current_step)]
        self.logger.step = self.current_step()
        if self.engine is None or self.engine.closed:
            self.engine = self._new_engine()
        self._fire_event = self.engine.fire
        give_declared_keys(state.algorithms, pl_module)
        check_module(state.algorithms, pl_module, isinstance(pl_module, ComposerModuleMixin))
        if stage == "fit":  # TrainerFn.FITTING of either package
            self.conflicts = check_trainer(state.algorithms, trainer, state.automatic_optimization)
            for sentence in self.conflicts:
                warnings.warn(sentence, stacklevel=3)
            _configure_ddp(state, trainer)
        if self.hooks is None:
            self.hooks = ModuleHooks(pl_module, self)
        attach_run(pl_module, self)
        self.refresh_listening()
        if not self.initialized:
            self.initialized = True
            self.fire_hook("setup")
        self._load_deferred()

    # ------------------------------------------------------------------------------------------
    # checkpoints (the callback's state_dict / load_state_dict; the entry is BridgeCheckpoint's)
    # ------------------------------------------------------------------------------------------
    def checkpoint_entry(self, version: str) -> dict[str, Any]:
        checkpoint = self.settings.checkpoint
        if self.state is None:
            return dict(checkpoint.deferred or {})
        checkpoint.warn_if_step_open(self.step_open())
        return checkpoint.save(self.state, version)

    def _current_loss_record(self) -> dict[str, Any] | None:
        live = self.hooks.loss_record() if self.hooks is not None else None
        return live or self._loss_record

    def save_loss_record(self, checkpoint: dict[str, Any]) -> None:
        """Write the loss a plain module's steps computed into ``checkpoint`` (during fit and after it), so a
        run resumed from it can rank examples (SelectiveBackprop) before its first training_step."""
        record = self._current_loss_record()
        if record is not None:
            checkpoint[PLAIN_LOSS_KEY] = record

    def load_loss_record(self, checkpoint: dict[str, Any]) -> None:
        """Give a checkpoint's loss record to the plain loss step (Lightning restores after setup, before training)."""
        if self.hooks is not None:
            self.hooks.load_loss_record(checkpoint)

    def restore(self, state_dict: dict[str, Any]) -> None:
        checkpoint = self.settings.checkpoint
        self._restored = True
        # Lightning restores callbacks before setup (ahead of validate/test/predict) and after
        # teardown (its HPC restore): the first is kept for setup, the second fires AFTER_LOAD there.
        if self.state is None:
            checkpoint.defer(state_dict)
            return
        checkpoint.load(self.state, state_dict)
        if self.engine is None or self.engine.closed:
            checkpoint.after_load_due = True
            return
        self.fire_hook("load_state_dict")

    def _load_deferred(self) -> None:
        """Apply a checkpoint entry restored before setup, or fire the AFTER_LOAD a restore after teardown left due."""
        checkpoint = self.settings.checkpoint
        raw = checkpoint.take_deferred()
        if raw is not None:
            checkpoint.load(self.state, raw)
        if raw is not None or checkpoint.after_load_due:
            checkpoint.after_load_due = False
            self.fire_hook("load_state_dict")

    def _start(self, pl_module: L.LightningModule) -> None:
        """The first setup: the state; algorithms that served another run start fresh."""
        settings = self.settings
        run = algorithm_runs.new_run_id()
        for algorithm in settings.algorithms:
            if algorithm_runs.bind(algorithm, run):
                log.info("%s served another run: it starts fresh for %s.", type(algorithm).__name__, type(pl_module).__name__)
        self.state = State(pl_module, algorithms=settings.algorithms, callbacks=settings.engine_callbacks)
        self.state.seed = settings.seed if settings.seed is not None else _default_seed()
        self.clock = StepClock(self.state)

    def _new_engine(self) -> Engine:
        assert self.state is not None
        engine = Engine(self.state, self.logger, self.settings.algorithm_passes, measure_cost=self.settings.measure_cost)
        engine.cost = self._cost
        engine.on_handler_added = self.refresh_listening
        return engine

    def refresh_listening(self) -> None:
        """Read whether anything listens; the first time something does, install the module's event hooks.

        Called at setup, between steps and at the start of evaluation. While no algorithm, engine
        callback or handler exists, the bridge fires no per-step event and hooks nothing into the
        module, so an empty bridge costs only its step bookkeeping. A handler (``engine.on``) is
        heard at once; an algorithm or engine callback added during a run, from the next step on.
        """
        listening = self.engine is not None and self.engine.has_listeners()
        self.clock.timing = listening  # only a listener can read the wall-clock (see StepClock)
        if listening and self.hooks is not None and self.trainer is not None:
            self.hooks.install_events(self.trainer)
        if listening is not self.listening:
            self.listening = listening
            self.settings.show_step_hooks(listening)
            if listening and self.state is not None:  # an idle bridge leaves the logger's step behind
                self.logger.step = self.current_step()

    # ------------------------------------------------------------------------------------------
    # the module's step API (steps.ModuleSteps): the part that needs the run's checkpoint rules
    # ------------------------------------------------------------------------------------------
    def before_checkpoint_load(self, checkpoint: dict[str, Any]) -> None:
        state = self.state
        assert state is not None
        self.fire_hook("on_load_checkpoint")
        settings = self.settings
        raw = (checkpoint.get("callbacks") or {}).get(settings.state_key)
        strategy = self.trainer.strategy if self.trainer is not None else None
        rebuilt = settings.checkpoint.check_fits(
            state, raw, "state_dict" in checkpoint, _compat.restores_checkpoint_after_setup(strategy)
        )
        (init,) = HOOK_EVENTS["setup"]  # the re-created algorithm missed the run's INIT: it gets its own
        for algorithm in rebuilt:
            algorithm_runs.bind(algorithm, algorithm_runs.new_run_id())
            state.algorithms = [*state.algorithms, algorithm]
            settings.algorithms.append(algorithm)  # the callback's list: its next run has the algorithm too
            if algorithm.match(init, state):
                algorithm.apply(init, state, self.logger)

    # ------------------------------------------------------------------------------------------
    # fit
    # ------------------------------------------------------------------------------------------
    def fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = self.state
        assert state is not None
        state.device = pl_module.device
        self.logger.step = self.current_step()  # after a checkpoint restored the timestamp
        # the user's optimizers and schedulers, handed to the algorithms that replace them (SAM, Muon, ...)
        hand_over(trainer, state, lambda: self.fire_hook("on_fit_start"))
        self.reporting.fit_start(trainer, lambda: self.plan().text, self._run_config)
        self.refresh_listening()

    def train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = self.state
        assert state is not None
        state.dataloader = trainer.train_dataloader
        batches = trainer.num_training_batches
        if isinstance(batches, int) or (isinstance(batches, float) and batches != float("inf")):
            state.dataloader_len = -(-int(batches) // max(1, trainer.accumulate_grad_batches))
        self._global_step = _compat.step_counter(trainer, bool(pl_module.automatic_optimization))
        self.clock.start_fit(self._global_step())
        if state.timestamp.batch.value == 0 and state.timestamp.epoch.value == 0:
            self.fire_hook("on_train_start")
        if self.clock.epoch_left_open(state, trainer.current_epoch):  # resumed from an epoch's last batch
            if self.settings.reopen_epoch is not None:  # through the callback's hooks (a subclass may extend them)
                self.settings.reopen_epoch(trainer, pl_module)
            else:
                self.train_epoch_end(trainer)
                self.train_epoch_start(trainer)
        # a resumed fit should start where the restored timestamp is; Lightning may start elsewhere (#19403).
        # Under manual optimization a batch may be several steps: no batch-to-step position to compare.
        if self._restored and self._global_step() > 0 and pl_module.automatic_optimization:
            timestamp = state.timestamp
            self.resume_position.expect(timestamp.epoch.value, timestamp.batch_in_epoch.value, state.dataloader_len)
        else:
            self.resume_position.disarm()
        self._restored = False

    def train_epoch_start(self, trainer: L.Trainer) -> None:
        if not self.clock.start_epoch(trainer.current_epoch):
            return
        self.refresh_listening()
        self.fire_hook("on_train_epoch_start")

    def train_batch_start(self, trainer: L.Trainer, batch_idx: int) -> None:
        # Hidden while nothing listens. The first micro-batch of a step opens it (the clock counts
        # micro-batches also while this hook was hidden, so a bridge that began listening mid-step
        # waits for the next step).
        if self.clock.micro == 0 and self.listening:
            self.resume_position.check(trainer.current_epoch, batch_idx // max(1, trainer.accumulate_grad_batches))
            self.logger.step = self.current_step()
            self.fire_hook("on_train_batch_start")

    def after_backward(self, trainer: L.Trainer) -> None:
        if self.listening and _compat.is_training(trainer):
            self.fire_hook("on_after_backward")

    def before_optimizer_step(self, optimizer: Any) -> None:
        state = self.state
        if state is None or not self.listening:
            return
        state.stepping_optimizer = optimizer
        try:
            self.fire_hook("on_before_optimizer_step")
        finally:
            state.stepping_optimizer = None

    def train_batch_end(self, trainer: L.Trainer, batch: Any) -> None:
        state = self.state
        assert state is not None
        self.resume_position.disarm()  # only a fit's first batch is compared (a bridge idle then has no check)
        # The data hook counted the micro-batch's samples as loaded; without it (an idle bridge), counted here.
        samples = (_batch_size(batch) or 0) if self.clock.loaded_samples is None else 0
        if not self.clock.end_micro_batch(state, samples, self._global_step()):
            return
        if self.listening:
            self.logger.step = self.current_step()
            self.fire_hook("on_train_batch_end")
            self._honour_stop(trainer)
        self.refresh_listening()

    def train_epoch_end(self, trainer: L.Trainer) -> None:
        state = self.state
        assert state is not None
        state.timestamp = state.timestamp.to_next_epoch()
        self.clock.reset_step()
        self.fire_hook("on_train_epoch_end")
        self._honour_stop(trainer)

    def train_end(self, trainer: L.Trainer) -> None:
        state = self.state
        assert state is not None
        state.timestamp = state.timestamp.to_next_iteration()
        self.fire_hook("on_train_end")
        self.reporting.fit_end(trainer, self.current_step(), self.cost)

    def step_open(self) -> bool:
        """Whether Lightning finished an optimizer step the clock has not counted yet (see ``StepClock.step_open``)."""
        return self.clock.step_open(self._global_step())

    def _honour_stop(self, trainer: L.Trainer) -> None:
        if self.state is not None and self.state.stop_requested:
            trainer.should_stop = True

    # ------------------------------------------------------------------------------------------
    # evaluation and prediction
    # ------------------------------------------------------------------------------------------
    def eval_start(self, trainer: L.Trainer, hook: str) -> None:
        state = self.state
        assert state is not None
        self.refresh_listening()
        self.clock.start_eval()
        state.sanity_checking = bool(trainer.sanity_checking)
        state.eval_timestamp = Timestamp()
        state.evaluating = True
        self.fire_hook(_variant(trainer, hook))

    def eval_end(self, trainer: L.Trainer, hook: str) -> None:
        state = self.state
        assert state is not None
        try:
            self.fire_hook(_variant(trainer, hook))
        finally:
            state.evaluating = False
            state.sanity_checking = False
            self.clock.end_eval()  # evaluation is not batch time

    def eval_batch_end(self, hook: str) -> None:
        state = self.state
        assert state is not None
        state.eval_timestamp = state.eval_timestamp.to_next_batch()
        self.fire_hook(hook)

    def predict_start(self) -> None:
        assert self.state is not None
        self.refresh_listening()
        self.state.eval_timestamp = Timestamp()
        self.state.evaluating = True
        self.fire_hook("on_predict_start")

    def predict_end(self) -> None:
        assert self.state is not None
        try:
            self.fire_hook("on_predict_end")
        finally:
            self.state.evaluating = False

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
            self._loss_record = self._current_loss_record()
            detach_run(self.hooks.module)
            self.hooks.remove()
            self.hooks = None
        if self.listening:
            self.listening = False
            self.settings.show_step_hooks(False)

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


def _not_set_up(event: Event) -> Any:
    raise RuntimeError("AlgorithmEngineCallback.run_event was called before Trainer setup.")


def _variant(trainer: L.Trainer, hook: str) -> str:
    """``on_validation_start``/``_end`` under ``trainer.validate``/``test`` read the table's ``[standalone]`` row."""
    fn = package_of(trainer).TrainerFn  # the Trainer's own package
    if hook in ("on_validation_start", "on_validation_end") and trainer.state.fn in (fn.VALIDATING, fn.TESTING):
        return f"{hook}[standalone]"
    return hook


def _configure_ddp(state: State, trainer: L.Trainer) -> None:
    """Tell DDP about algorithms that may leave parameters without gradients."""
    needy = [type(a).__name__ for a in state.algorithms if a.find_unused_parameters]
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
