"""The run's part in Lightning's checkpoints: its entry, restores before setup and after teardown, the loss record.

:class:`~composer_bridge.lightning.run.BridgeRun` holds one :class:`RunCheckpoint`. It keeps the
callback's checkpoint rules (:class:`~composer_bridge.training.checkpoint_state.BridgeCheckpoint`,
shared by the callback's runs), and decides what a save or a restore means at the moment Lightning
asks: before setup there is no state yet, so a restored entry waits for it; after teardown the
engine is closed, so AFTER_LOAD waits for the next setup. The run fires the events; this class
only says when.

Examples:
    >>> import torch
    >>> from composer_bridge.core import State
    >>> from composer_bridge.training.checkpoint_state import BridgeCheckpoint
    >>> first = RunCheckpoint(BridgeCheckpoint(), "AlgorithmEngineCallback")
    >>> entry = first.entry(State(torch.nn.Linear(1, 1)), step_open=False, version="0")
    >>> second = RunCheckpoint(BridgeCheckpoint(), "AlgorithmEngineCallback")
    >>> second.restore(None, entry, engine_open=False)  # before setup: kept for it, nothing fires now
    False
    >>> second.load_deferred(State(torch.nn.Linear(1, 1)))  # at setup: loaded, AFTER_LOAD due
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from composer_bridge.core.state import State
from composer_bridge.lightning import _compat
from composer_bridge.lightning.hook_map import HOOK_EVENTS
from composer_bridge.lightning.plain_loss import CHECKPOINT_KEY as PLAIN_LOSS_KEY
from composer_bridge.training import algorithm_runs
from composer_bridge.training.checkpoint_state import BridgeCheckpoint

if TYPE_CHECKING:  # hints name lightning.pytorch's classes; pytorch_lightning's work the same (package.py)
    import lightning as L

    from composer_bridge.core.algorithm import Algorithm
    from composer_bridge.core.logger import Logger

__all__ = ["RunCheckpoint"]


class RunCheckpoint:
    """What one run writes into and reads from Lightning's checkpoints.

    Args:
        rules: the callback's checkpoint rules and a restore waiting for setup (kept across its runs).
        state_key: the key of the callback's entry in a Lightning checkpoint's ``"callbacks"``.
    """

    def __init__(self, rules: BridgeCheckpoint, state_key: str) -> None:
        self.rules = rules
        self.state_key = state_key
        #: a checkpoint's entry was restored since the last fit started
        self.restored = False
        #: the loss a plain module's training_step computed, kept after teardown for checkpoints saved then
        self.kept_loss_record: dict[str, Any] | None = None

    def entry(self, state: State | None, step_open: bool, version: str) -> dict[str, Any]:
        """The callback's ``state_dict``: the run's entry (before setup: a restored entry not yet used)."""
        if state is None:
            return dict(self.rules.deferred or {})
        self.rules.warn_if_step_open(step_open)
        return self.rules.save(state, version)

    def restore(self, state: State | None, state_dict: dict[str, Any], engine_open: bool) -> bool:
        """The callback's ``load_state_dict``; returns whether AFTER_LOAD fires now.

        Lightning restores callbacks before setup (ahead of validate/test/predict) and after
        teardown (its HPC restore): the first is kept for setup, the second's AFTER_LOAD fires there.
        """
        self.restored = True
        if state is None:
            self.rules.defer(state_dict)
            return False
        self.rules.load(state, state_dict)
        if not engine_open:
            self.rules.after_load_due = True
            return False
        return True

    def load_deferred(self, state: State) -> bool:
        """At setup: load an entry restored before it; returns whether AFTER_LOAD is due."""
        raw = self.rules.take_deferred()
        if raw is not None:
            self.rules.load(state, raw)
        due = raw is not None or self.rules.after_load_due
        self.rules.after_load_due = False
        return due

    def add_missing(
        self, state: State, checkpoint: dict[str, Any], trainer: L.Trainer | None, logger: Logger,
        algorithms: list[Algorithm],
    ) -> None:
        """Before the weights load: check the checkpoint fits the run; re-create what it needs (``add_missing_on_load``).

        A re-created algorithm joins the state and ``algorithms`` (the callback's list, so its next
        run has it too) and gets the INIT it missed.
        """
        raw = (checkpoint.get("callbacks") or {}).get(self.state_key)
        strategy = trainer.strategy if trainer is not None else None
        rebuilt = self.rules.check_fits(
            state, raw, "state_dict" in checkpoint, _compat.restores_checkpoint_after_setup(strategy)
        )
        (init,) = HOOK_EVENTS["setup"]
        for algorithm in rebuilt:
            algorithm_runs.bind(algorithm, algorithm_runs.new_run_id())
            state.algorithms = [*state.algorithms, algorithm]
            algorithms.append(algorithm)
            if algorithm.match(init, state):
                algorithm.apply(init, state, logger)

    def save_loss_record(self, checkpoint: dict[str, Any], live: dict[str, Any] | None) -> None:
        """Write the loss a plain module's steps computed (``live``, else the one kept) into ``checkpoint``.

        A run resumed from it can then rank examples (SelectiveBackprop) before its first training_step.
        """
        record = live or self.kept_loss_record
        if record is not None:
            checkpoint[PLAIN_LOSS_KEY] = record
