"""Traces reach every Lightning logger at the chosen rate, the text trace, and the in-memory store."""

from __future__ import annotations

import csv
import logging
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers.support import L, image_loader, quiet_trainer, tiny_classifier

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event
from composer_bridge.core.trace import Trace
from composer_bridge.lightning.traces import TraceReporting, TraceStore, check_trace_mode, format_trace

CSVLogger = L.loggers.CSVLogger

EVENTS = ("INIT", "BATCH_START", "BEFORE_LOSS", "AFTER_LOSS", "BATCH_END", "EPOCH_END")


class Recorder(Algorithm):
    """Runs at ``events`` and counts, itself, at which (event, optimizer step) it ran."""

    def __init__(self, events: tuple[str, ...] = EVENTS) -> None:
        self.events = tuple(events)
        self.runs: Counter[tuple[str, int]] = Counter()

    def match(self, event: Event, state) -> bool:
        return event.name in self.events

    def apply(self, event: Event, state, logger) -> None:
        self.runs[(event.name, int(state.timestamp.batch))] += 1


class First(Recorder):
    pass


class Second(Recorder):
    pass


def _fit(tmp_path: Path, trace_mode="summary", epochs: int = 2, accumulate: int = 2, **options):
    algorithms = [First(), Second()]
    callback = AlgorithmEngineCallback(algorithms, trace_mode=trace_mode, **options)
    logger = CSVLogger(tmp_path, name="run")
    trainer = quiet_trainer(max_epochs=epochs, logger=logger, callbacks=[callback], accumulate_grad_batches=accumulate)
    trainer.fit(tiny_classifier(), image_loader(n=48, batch_size=8))  # 6 micro-batches, 3 steps per epoch
    return callback, algorithms, Path(logger.log_dir) / "metrics.csv"


def _csv_points(path: Path, prefix: str) -> dict[str, list[tuple[int, float]]]:
    """metric → [(step, value), ...] for the columns starting with ``prefix``, read back from the CSV file."""
    points: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            for column, value in row.items():
                if column.startswith(prefix) and value != "":
                    points.setdefault(column[len(prefix):], []).append((int(row["step"]), float(value)))
    return points


def _expected_steps(algorithms: list[Recorder]) -> dict[str, list[int]]:
    """key → sorted distinct steps where the algorithm says it ran (its own bookkeeping)."""
    steps: dict[str, set[int]] = {}
    for algorithm in algorithms:
        for event, step in algorithm.runs:
            steps.setdefault(f"{type(algorithm).__name__}/{event}", set()).add(step)
    return {key: sorted(s) for key, s in steps.items()}


def test_every_event_mode_logs_each_key_at_each_step_it_ran_to_the_csv(tmp_path: Path) -> None:
    callback, algorithms, metrics_csv = _fit(tmp_path, "every_event")
    logged = _csv_points(metrics_csv, "algorithm_traces/")
    expected = _expected_steps(algorithms)
    assert set(logged) == set(expected) == {f"{a}/{e}" for a in ("First", "Second") for e in EVENTS}
    for key, steps in expected.items():
        # Once per step even though BEFORE_LOSS ran on 2 micro-batches per step; the value is 1.
        assert sorted(step for step, _ in logged[key]) == steps, key
        assert {value for _, value in logged[key]} == {1.0}
    # 2 epochs of 3 optimizer steps: EPOCH_END at steps 3 and 6, BATCH_START at 0..5, BATCH_END at 1..6.
    assert expected["First/EPOCH_END"] == [3, 6]
    assert expected["First/BATCH_START"] == [0, 1, 2, 3, 4, 5]
    assert expected["First/BATCH_END"] == [1, 2, 3, 4, 5, 6]
    # The totals at fit end count every run, micro-batches included.
    counts = _csv_points(metrics_csv, "algorithm_trace_counts/")
    for algorithm in algorithms:
        for event in EVENTS:
            ran = sum(n for (e, _), n in algorithm.runs.items() if e == event)
            assert counts[f"{type(algorithm).__name__}/{event}"] == [(6, float(ran))]
    assert counts["First/BEFORE_LOSS"] == [(6, 12.0)]


def test_summary_mode_logs_each_key_once_at_its_first_step(tmp_path: Path) -> None:
    callback, algorithms, metrics_csv = _fit(tmp_path)  # the default mode
    logged = _csv_points(metrics_csv, "algorithm_traces/")
    expected = _expected_steps(algorithms)
    assert set(logged) == set(expected)
    for key, steps in expected.items():
        assert logged[key] == [(steps[0], 1.0)], key
    counts = _csv_points(metrics_csv, "algorithm_trace_counts/")
    assert counts["Second/BATCH_START"] == [(6, 6.0)]


def test_every_n_steps_mode_logs_a_key_at_most_once_every_n_steps(tmp_path: Path) -> None:
    callback, algorithms, metrics_csv = _fit(tmp_path, trace_mode=2, epochs=3)
    logged = _csv_points(metrics_csv, "algorithm_traces/")
    for key, steps in _expected_steps(algorithms).items():
        wanted, last = [], None
        for step in steps:  # independent re-statement of the rule
            if last is None or step - last >= 2:
                wanted.append(step)
                last = step
        assert [s for s, _ in logged[key]] == wanted, key
    assert [s for s, _ in logged["First/BATCH_START"]] == [0, 2, 4, 6, 8]
    assert [s for s, _ in logged["First/EPOCH_END"]] == [3, 6, 9]  # rarer events are never lost


def test_text_trace_goes_to_debug_logging_and_to_a_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trace_file = tmp_path / "traces" / "run.txt"
    with caplog.at_level(logging.DEBUG, logger="composer_bridge"):
        callback, algorithms, _ = _fit(tmp_path, "every_event", epochs=1, trace_file=trace_file)
    lines = trace_file.read_text().splitlines()
    pattern = re.compile(r"^\[STEP=(\d+)\]\[(\w+)/([A-Z_]+)=1\]$")
    assert all(pattern.match(line) for line in lines), lines[:5]
    # Every run, in run order, exactly as the algorithms counted them.
    from_file = Counter((m[2], m[3], int(m[1])) for m in map(pattern.match, lines))
    from_algorithms = Counter({(type(a).__name__, e, s): n for a in algorithms for (e, s), n in a.runs.items()})
    assert from_file == from_algorithms
    assert "[STEP=3][First/EPOCH_END=1]" in lines and "[STEP=0][Second/INIT=1]" in lines
    assert lines.index("[STEP=0][First/INIT=1]") < lines.index("[STEP=0][Second/INIT=1]")
    logged = [r.getMessage() for r in caplog.records if r.name == "composer_bridge.traces"]
    assert logged == lines
    plans = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Algorithm plan:")]
    assert len(plans) == 1 and "AFTER_LOSS: Second, First" in plans[0]


def test_no_text_trace_is_formatted_when_nobody_listens(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="composer_bridge"):
        _fit(tmp_path, "every_event", epochs=1)
    assert not [r for r in caplog.records if r.name == "composer_bridge.traces"]


def test_traces_property_holds_every_trace_by_step_with_its_order(tmp_path: Path) -> None:
    callback, algorithms, _ = _fit(tmp_path, "every_event", epochs=1)
    store = callback.traces
    assert sorted(store) == [0, 1, 2, 3]
    recorded = Counter((t.name, t.event.name, step) for step in store for t in store[step])
    assert recorded == Counter({(type(a).__name__, e, s): n for a in algorithms for (e, s), n in a.runs.items()})
    assert store.keys_at(3)[-2:] == ["Second/EPOCH_END", "First/EPOCH_END"]
    assert [t.order for t in store[3][-2:]] == [0, 1]
    assert store.stats["First/BATCH_START"].count == 3
    assert (store.stats["First/BATCH_END"].first_step, store.stats["First/BATCH_END"].last_step) == (1, 3)
    assert store.stats["First/AFTER_LOSS"].orders == {1}  # after-events run in reverse order


def test_summary_mode_memory_is_bounded_on_a_long_run() -> None:
    """A 20,000-step run: totals stay exact, but only a bounded number of steps and columns are kept."""
    store = TraceReporting("summary").store
    keys = {
        "A/BATCH_START": Trace("A", Event.BATCH_START, None, 0, True),
        "B/BATCH_START": Trace("B", Event.BATCH_START, None, 1, True),
    }
    for step in range(20_000):
        store.log_traces(keys, step)
        if step % 100 == 99:
            store.log_traces({"A/EPOCH_END": Trace("A", Event.EPOCH_END, None, 0, True)}, step + 1)
    assert len(store) <= 2000
    assert 0 in store and 19_999 in store and 5_000 not in store
    assert store.stats["A/BATCH_START"].count == 20_000
    assert store.stats["A/EPOCH_END"].count == 200
    assert (store.stats["A/EPOCH_END"].first_step, store.stats["A/EPOCH_END"].last_step) == (100, 20_000)
    timeline = store.timeline
    assert max(len(row) for row in timeline.rows.values()) <= timeline.max_columns
    assert sum(timeline.rows["A/BATCH_START"]) == 20_000 and sum(timeline.rows["A/EPOCH_END"]) == 200
    # A step that holds a huge evaluation keeps a bounded list too.
    eval_trace = {"A/EVAL_BATCH_START": Trace("A", Event.EVAL_BATCH_START, None, 0, True)}
    for _ in range(5_000):
        store.log_traces(eval_trace, 20_000)
    assert len(store[20_000]) <= store.max_traces_per_step
    assert store.stats["A/EVAL_BATCH_START"].count == 5_000
    assert TraceReporting("every_event").store.max_steps is None


def test_trace_store_reads_like_a_mapping_of_steps() -> None:
    store = TraceStore()
    trace = Trace("LayerFreezing", Event.EPOCH_END, None, 0, True)
    store.log_traces({"LayerFreezing/EPOCH_END": trace}, step=3)
    assert dict(store) == {3: [trace]}
    assert format_trace(3, "LayerFreezing/EPOCH_END", trace) == "[STEP=3][LayerFreezing/EPOCH_END=1]"


@pytest.mark.parametrize("mode", ["sometimes", 0, -5, 2.5, True, None])
def test_a_bad_trace_mode_is_refused_with_the_choices(mode) -> None:
    with pytest.raises(ValueError, match=r"trace_mode=.*'summary'.*'every_event'.*positive int"):
        check_trace_mode(mode)
    with pytest.raises(ValueError, match="trace_mode"):
        AlgorithmEngineCallback([], trace_mode=mode)


def test_a_bad_trace_file_is_refused() -> None:
    with pytest.raises(TypeError, match="trace_file=3 must be a path"):
        AlgorithmEngineCallback([], trace_file=3)


def test_the_trace_store_is_the_core_one_re_exported() -> None:
    from composer_bridge.core.trace_store import TraceStore as CoreTraceStore

    assert TraceStore is CoreTraceStore and AlgorithmEngineCallback([]).traces.__class__ is CoreTraceStore


def test_surgery_counts_reach_a_csv_loggers_hparams_under_composers_keys(tmp_path) -> None:
    import yaml

    from composer_bridge.algorithms import GhostBatchNorm, WeightStandardization

    model = tiny_classifier()
    batch_norms = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    callback = AlgorithmEngineCallback([GhostBatchNorm(ghost_batch_size=4), WeightStandardization()])
    trainer = quiet_trainer(logger=CSVLogger(tmp_path, name="run"), limit_train_batches=1, callbacks=[callback])
    trainer.fit(model, image_loader(n=8, batch_size=8))
    hparams = yaml.safe_load(Path(trainer.logger.log_dir, "hparams.yaml").read_text())
    assert hparams["GhostBatchNorm/num_new_modules"] == batch_norms > 0
    assert hparams["WeightStandardization/num_weights_standardized"] == convs > 0


class _RecordingLogger:
    def __init__(self) -> None:
        self.hparams: list[dict] = []

    def log_hyperparams(self, params) -> None:
        self.hparams.append(dict(params))


@pytest.mark.parametrize("global_zero", [True, False])
def test_engine_hyperparameters_go_to_the_lightning_loggers_on_rank_zero_only(global_zero) -> None:
    from types import SimpleNamespace

    from composer_bridge.core.logger import Logger
    from composer_bridge.lightning.loggers import LightningLoggers

    recording = _RecordingLogger()
    trainer = SimpleNamespace(is_global_zero=global_zero, loggers=[recording])
    Logger([LightningLoggers(trainer)]).log_hyperparameters({"blurpool/num_blurpool_layers": torch.tensor(3)})
    assert recording.hparams == ([{"blurpool/num_blurpool_layers": 3}] if global_zero else [])
