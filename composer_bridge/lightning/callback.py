"""The :class:`AlgorithmEngineCallback`: Composer's algorithm engine inside ``lightning.Trainer`` or ``pl.Trainer``.

Examples:
    >>> import lightning as L
    >>> from composer_bridge.algorithms import LabelSmoothing
    >>> trainer = L.Trainer(
    ...     max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
    ...     callbacks=[AlgorithmEngineCallback([LabelSmoothing(0.1)])])

This module holds the callback's configuration and its Lightning hooks, nothing else: each hook
hands itself to the run in progress, a :class:`~composer_bridge.lightning.run.BridgeRun` (its step
API, training loop and checkpoint part, engine, logger, module hooks, traces, cost, conflicts), or to
the run's :class:`~composer_bridge.lightning.training_loop.TrainingLoop`, which fire the events
:data:`~composer_bridge.lightning.hook_map.HOOK_EVENTS` lists for it. What the module calls
during a step is :class:`~composer_bridge.lightning.steps.ModuleSteps`; what is refused at setup,
:mod:`~composer_bridge.lightning.setup_checks`; checkpoints,
:class:`~composer_bridge.training.checkpoint_state.BridgeCheckpoint`. Lightning details that are
not public API are used only through :mod:`~composer_bridge.lightning._compat`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from composer_bridge._version import __version__
from composer_bridge.core.algorithm import Algorithm, check_algorithms, check_unique
from composer_bridge.core.callback import Callback as EngineCallback
from composer_bridge.core.engine import Engine
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.passes import AlgorithmPass, normalize_passes
from composer_bridge.core.state import State
from composer_bridge.lightning import _compat
from composer_bridge.lightning.package import CALLBACK_BASES
from composer_bridge.lightning.run import BridgeRun
from composer_bridge.lightning.run_settings import RunSettings, check_engine_callbacks
from composer_bridge.lightning.setup_checks import BridgeConfigurationError
from composer_bridge.lightning.steps import ModuleSteps
from composer_bridge.lightning.traces import TraceMode, TraceStore
from composer_bridge.training.checkpoint_state import BridgeCheckpoint, check_known_algorithms
from composer_bridge.training.cost_report import CostReport
from composer_bridge.training.plan import Plan

if TYPE_CHECKING:  # hints name lightning.pytorch's classes; pytorch_lightning's work the same (package.py)
    import lightning as L

__all__ = ["AlgorithmEngineCallback", "BridgeConfigurationError"]

log = logging.getLogger(__name__)

# Lightning dispatches every hook to every callback (each through a profiler context), but skips a
# hook that is not callable (_compat.hide_hook). Hooks the bridge never needs stay hidden; the
# per-step hooks that only fire events are hidden while the run has no listener (the run says when
# that changes, through on_listening_changed), so an idle bridge receives one hook per step
# (on_train_batch_end, which keeps the step clock). Hiding costs nothing per dispatch: an instance
# attribute, not a property Lightning would call at every step.
_UNUSED_STEP_HOOKS = ("on_before_zero_grad", "on_before_backward")
_EVENT_ONLY_STEP_HOOKS = ("on_train_batch_start", "on_after_backward", "on_before_optimizer_step")
# Lightning binds the module's log/log_dict onto every callback: like the run, they are not copied.
_NOT_COPIED = ("_run", "log", "log_dict")


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

    Examples:
        >>> from composer_bridge.algorithms import LabelSmoothing
        >>> callback = AlgorithmEngineCallback([LabelSmoothing(smoothing=0.1)])
        >>> callback.algorithms
        [LabelSmoothing(smoothing=0.1, target_key=1)]
    """

    def __init__(
        self,
        algorithms: Sequence[Algorithm] | Algorithm | None = None,
        callbacks: Sequence[EngineCallback] | EngineCallback | None = None,
        algorithm_passes: AlgorithmPass | tuple[AlgorithmPass, int] | Sequence[AlgorithmPass | tuple[AlgorithmPass, int]]
        | None = None,
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
        check_unique(self.algorithms)
        self.engine_callbacks: list[EngineCallback] = check_engine_callbacks(callbacks)
        self.algorithm_passes = normalize_passes(algorithm_passes)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"AlgorithmEngineCallback(seed={seed!r}): seed must be an int or None.")
        self.seed = seed
        self._checkpoint = BridgeCheckpoint(bool(add_missing_on_load), check_known_algorithms(known_algorithms))
        self.measure_cost = measure_cost
        self._trace_mode = trace_mode
        self._trace_file = trace_file
        for name in _UNUSED_STEP_HOOKS:
            self._hide(name)
        self._run = self._new_run()  # checks trace_mode and trace_file

    @property
    def add_missing_on_load(self) -> bool:
        """Re-create surgery algorithms a checkpoint needs and this run lacks (else refuse the checkpoint)."""
        return self._checkpoint.add_missing_on_load

    @property
    def known_algorithms(self) -> tuple[type, ...]:
        """Your own algorithm classes that ``add_missing_on_load`` may re-create."""
        return self._checkpoint.known_algorithms

    # ------------------------------------------------------------------------------------------
    # the run in progress (run.BridgeRun); copies get a new one
    # ------------------------------------------------------------------------------------------
    @property
    def steps(self) -> ModuleSteps:
        """The run in progress, as the module-facing step API (:class:`~composer_bridge.lightning.steps.ModuleSteps`)."""
        return self._run.steps

    @property
    def state(self) -> State | None:
        """The run's :class:`~composer_bridge.State` (``None`` before ``setup``)."""
        return self._run.state

    @property
    def engine(self) -> Engine | None:
        """The run's :class:`~composer_bridge.Engine` (``None`` before ``setup``)."""
        return self._run.engine

    @property
    def logger(self) -> Logger:
        """The engine logger the algorithms log to."""
        return self._run.logger

    @property
    def listening(self) -> bool:
        """Whether anything listens to the per-step events (an algorithm, engine callback or handler)."""
        return self._run.listening

    @property
    def cost(self) -> dict[str, list[float]]:
        """``"<Algorithm>/<EVENT>"`` → ``[calls, seconds in apply]``, kept across fit/validate calls.

        See :attr:`Engine.cost <composer_bridge.Engine.cost>` for how seconds are sampled, and
        :meth:`cost_report` for a table.
        """
        return self._run.cost

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in _NOT_COPIED}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._run = self._new_run()

    def _new_run(self) -> BridgeRun:
        """A new run, whose per-step hooks Lightning sees only while it listens (hidden until then)."""
        self._show_step_hooks(False)
        run = BridgeRun(self._run_settings())
        run.on_listening_changed = self._show_step_hooks
        return run

    def _run_settings(self) -> RunSettings:
        """What a new run uses of this callback (the algorithm list itself: a checkpoint may add to it)."""
        return RunSettings(
            algorithms=self.algorithms, engine_callbacks=self.engine_callbacks, algorithm_passes=self.algorithm_passes,
            seed=self.seed, measure_cost=self.measure_cost, trace_mode=self._trace_mode, trace_file=self._trace_file,
            checkpoint=self._checkpoint, state_key=self.state_key,
        )

    def _hide(self, name: str) -> None:
        """Hide a hook from Lightning, unless a subclass overrides it (its code then runs as written)."""
        if getattr(type(self), name) is getattr(AlgorithmEngineCallback, name):
            _compat.hide_hook(self, name)

    def _show_step_hooks(self, listening: bool) -> None:
        """Show the per-step hooks that only fire events while something listens; hide them otherwise."""
        for name in _EVENT_ONLY_STEP_HOOKS:
            if listening:
                _compat.show_hook(self, name)
            else:
                self._hide(name)

    def run_event(self, event: Event) -> Any:
        """Run ``event`` through the engine now and return its traces."""
        if self._run.engine is None:
            raise RuntimeError("AlgorithmEngineCallback.run_event was called before Trainer setup.")
        return self._run.engine.run_event(event)

    def fire_event(self, event: Event) -> None:
        """Run ``event`` through the engine, discarding its traces."""
        self._run.steps.fire_event(event)

    # ------------------------------------------------------------------------------------------
    # the hooks: each hands itself to the run
    # ------------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        run = self._run
        if run.state is not None and run.state.model is not pl_module:
            log.info("AlgorithmEngineCallback: a new model (%s); the run starts fresh.", type(pl_module).__name__)
            run.remove_hooks()
            self._checkpoint.after_load_due = False  # the previous model's restore
            self._run = self._new_run()
        self._run.setup(trainer, pl_module, stage)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run.fit_start(trainer, pl_module)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._run.train_start(trainer, pl_module):  # resumed from an epoch's last batch: it ends, the next starts
            self.on_train_epoch_end(trainer, pl_module)
            self.on_train_epoch_start(trainer, pl_module)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run.train_epoch_start(trainer)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self._run.loop.batch_start(trainer, batch_idx)

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run.loop.after_backward(trainer)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        self._run.loop.before_optimizer_step(optimizer)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._run.loop.batch_end(trainer, batch)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run.loop.epoch_end(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run.train_end(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run.eval_start(trainer, "on_validation_start")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run.eval_end(trainer, "on_validation_end")

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._run.fire_hook("on_validation_batch_start")

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._run.eval_batch_end("on_validation_batch_end")

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run.eval_start(trainer, "on_test_start")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run.eval_end(trainer, "on_test_end")

    def on_test_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._run.fire_hook("on_test_batch_start")

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._run.eval_batch_end("on_test_batch_end")

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run.predict_start()

    def on_predict_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._run.fire_hook("on_predict_batch_start")

    def on_predict_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._run.eval_batch_end("on_predict_batch_end")

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run.predict_end()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._run.shutdown()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._run.fail(trainer)

    # ------------------------------------------------------------------------------------------
    # what ran, in which order, at what cost (traces.py, plan.py, cost_report.py, wandb_report.py)
    # ------------------------------------------------------------------------------------------
    @property
    def traces(self) -> TraceStore:
        """Every trace of the run by step: ``callback.traces[step]`` lists that step's traces in run order.

        ``callback.traces.stats[key]`` holds the totals of each ``"<Algorithm>/<EVENT>"`` key. In
        ``trace_mode="summary"`` only the first and latest steps are kept in full (the totals cover all).
        """
        return self._run.reporting.store

    def plan(self) -> Plan:
        """For each event that has algorithms, the order they run in after the passes, and known conflicts.

        ``print(callback.plan())``; works before ``fit`` too (``match`` is then probed on a bare state).
        Conflicts with the Trainer (Lightning's own weight averaging or gradient clipping, ...) are
        found at setup and listed from then on.
        """
        return self._run.plan()

    def cost_report(self) -> CostReport:
        """Wall time each algorithm spent in ``apply``, per event, as a printable table (``print(...)``)."""
        return self._run.cost_report()

    # ------------------------------------------------------------------------------------------
    # checkpoints (checkpoint_state.BridgeCheckpoint)
    # ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return self._run.checkpoint_entry(__version__)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self._run.save_loss_record(checkpoint)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self._run.load_loss_record(checkpoint)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._run.restore(state_dict)
