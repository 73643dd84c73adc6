"""W&B (real wandb, offline): config, trace metrics, the summary table and the timeline image, read back from disk."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.support import L, image_loader, quiet_trainer, tiny_classifier, wandb_run_records

from composer_bridge import Algorithm, AlgorithmEngineCallback, AlgorithmError, Event

CSVLogger, WandbLogger = L.loggers.CSVLogger, L.loggers.WandbLogger

wandb = pytest.importorskip("wandb")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Recorder(Algorithm):
    """Runs at ``events``; counts its runs; raises at BATCH_START of step ``fail_at`` if given."""

    def __init__(self, events: tuple[str, ...] = ("INIT", "BATCH_START", "EPOCH_END"), strength: float = 0.5,
                 fail_at: int | None = None) -> None:
        self.events = tuple(events)
        self.strength = strength
        self.fail_at = fail_at
        self.runs: Counter[tuple[str, int]] = Counter()

    def match(self, event: Event, state) -> bool:
        return event.name in self.events

    def apply(self, event: Event, state, logger) -> None:
        step = int(state.timestamp.batch)
        if event == Event.BATCH_START and step == self.fail_at:
            raise RuntimeError("planned failure")
        self.runs[(event.name, step)] += 1


class Warmup(Recorder):
    pass


class Cooldown(Recorder):
    pass


def _items(items) -> dict[str, Any]:
    return {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in items}


def _read_run(run_files_dir: Path) -> dict[str, Any]:
    """Config, history rows and summary of an offline run, from its ``run-<id>.wandb`` file.

    wandb's service may still be writing the file when ``wandb.finish()`` returns: wait for the
    run's ``exit`` record (a few seconds at most).
    """
    (run_file,) = run_files_dir.parent.glob("run-*.wandb")
    records = wandb_run_records(run_file)
    config: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config.update(_items(record.run.config.update))
        elif kind == "config":
            config.update(_items(record.config.update))
        elif kind == "history":
            history.append(_items(record.history.item))
        elif kind == "summary":
            summary.update(_items(record.summary.update))
    return {"config": config, "history": history, "summary": summary}


def _fit_with_wandb(tmp_path: Path, algorithms: list[Recorder], **callback_options):
    callback = AlgorithmEngineCallback(algorithms, **callback_options)
    wandb_logger = WandbLogger(project="traces", save_dir=str(tmp_path), offline=True)
    csv_logger = CSVLogger(tmp_path, name="csv")
    trainer = quiet_trainer(max_epochs=2, logger=[wandb_logger, csv_logger], callbacks=[callback])
    error = None
    try:
        trainer.fit(tiny_classifier(), image_loader(n=32, batch_size=8))  # 4 steps per epoch
    except AlgorithmError as caught:
        error = caught
    finally:
        files_dir = Path(wandb_logger.experiment.dir)
        wandb.finish()
    return callback, files_dir, error


def _media(summary: dict[str, Any], key: str) -> dict[str, Any]:
    """A logged media object's fields (wandb records them as nested keys ``key/<field>``)."""
    return {k[len(key) + 1 :]: v for k, v in summary.items() if k.startswith(key + "/")}


def _table(files_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    table = _media(summary, "algorithm_report/summary")
    assert table["_type"] == "table-file"
    return json.loads((files_dir / table["path"]).read_text())


def _png(files_dir: Path, summary: dict[str, Any]) -> bytes:
    image = _media(summary, "algorithm_report/timeline")
    assert image["format"] == "png" and image["_type"] == "image-file"
    return (files_dir / image["path"]).read_bytes()


def test_wandb_run_gets_config_trace_metrics_summary_table_and_timeline(tmp_path: Path) -> None:
    algorithms = [Warmup(strength=0.25), Cooldown(("INIT", "BATCH_END", "EPOCH_END"))]
    callback, files_dir, error = _fit_with_wandb(tmp_path, algorithms)
    assert error is None
    run = _read_run(files_dir)

    # Config: algorithms with hyper-parameters, the passes in order, the per-event order.
    bridge = run["config"]["composer_bridge"]
    assert bridge["algorithms"] == {
        "Warmup": {"events": ["INIT", "BATCH_START", "EPOCH_END"], "strength": 0.25, "fail_at": None},
        "Cooldown": {"events": ["INIT", "BATCH_END", "EPOCH_END"], "strength": 0.5, "fail_at": None},
    }
    assert bridge["passes"] == [p.__qualname__ for p in callback.engine.passes]
    assert bridge["algorithm_order"]["EPOCH_END"] == ["Cooldown", "Warmup"]
    assert bridge["algorithm_order"]["INIT"] == ["Warmup", "Cooldown"]

    # Trace metrics (default summary mode): each key = 1 once, at the step where it first ran.
    first_steps = {}
    for algorithm in algorithms:
        for event, step in sorted(algorithm.runs, key=lambda r: r[1]):
            first_steps.setdefault(f"{type(algorithm).__name__}/{event}", step)
    logged = {}
    for row in run["history"]:
        for key, value in row.items():
            if key.startswith("algorithm_traces/"):
                logged.setdefault(key.removeprefix("algorithm_traces/"), []).append((row["trainer/global_step"], value))
    assert logged == {key: [(step, 1)] for key, step in first_steps.items()}

    # The summary table: one row per algorithm and event, with counts, steps and apply times.
    table = _table(files_dir, run["summary"])
    assert table["columns"] == ["algorithm", "event", "times_run", "first_step", "last_step",
                                "total_apply_seconds", "mean_apply_ms"]
    rows = {(r[0], r[1]): r for r in table["data"]}
    expected = {}
    for algorithm in algorithms:
        for (event, step), n in algorithm.runs.items():
            name = (type(algorithm).__name__, event)
            count, first, last = expected.get(name, (0, step, step))
            expected[name] = (count + n, min(first, step), max(last, step))
    assert set(rows) == set(expected)
    for name, (count, first, last) in expected.items():
        _, _, times_run, first_step, last_step, total, mean_ms = rows[name]
        assert (times_run, first_step, last_step) == (count, first, last), name
        assert total >= 0 and mean_ms == pytest.approx(total / count * 1e3)
    assert rows[("Warmup", "BATCH_START")][2:5] == [8, 0, 7]
    assert rows[("Cooldown", "EPOCH_END")][2:5] == [2, 4, 8]

    # The timeline image is a real PNG with one row per key.
    png = _png(files_dir, run["summary"])
    assert png.startswith(PNG_SIGNATURE)
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        image.load()
        assert image.width >= 500 and image.height >= 100
    assert "algorithm_cost/Warmup/apply_seconds" in run["summary"]
    assert run["summary"]["algorithm_cost/Warmup/apply_seconds"] >= 0
    assert "algorithm_report/failed_at_step" not in run["summary"]


def test_a_failed_run_still_gets_its_traces_up_to_the_failure(tmp_path: Path) -> None:
    algorithms = [Warmup(fail_at=5), Cooldown(("INIT", "BATCH_END", "EPOCH_END"))]
    callback, files_dir, error = _fit_with_wandb(tmp_path, algorithms, trace_mode="every_event")
    assert error is not None and "Warmup failed at Event.BATCH_START" in str(error)
    run = _read_run(files_dir)
    assert run["summary"]["algorithm_report/failed_at_step"] == 5
    rows = {(r[0], r[1]): r for r in _table(files_dir, run["summary"])["data"]}
    assert rows[("Warmup", "BATCH_START")][2:5] == [5, 0, 4]  # steps 0..4 ran; step 5 raised
    assert rows[("Cooldown", "BATCH_END")][2:5] == [5, 1, 5]
    steps = sorted(r["trainer/global_step"] for r in run["history"] if "algorithm_traces/Cooldown/BATCH_END" in r)
    assert steps == [1, 2, 3, 4, 5]
    assert _png(files_dir, run["summary"]).startswith(PNG_SIGNATURE)


def test_timeline_is_a_decodable_png_without_wandb(tmp_path: Path) -> None:
    from matplotlib.image import imread

    from composer_bridge.core.trace import Trace
    from composer_bridge.lightning.traces import TraceStore
    from composer_bridge.lightning.wandb_report import render_timeline

    store = TraceStore()
    for step in range(0, 3000, 7):
        store.log_traces({"A/BATCH_END": Trace("A", Event.BATCH_END, None, 0, True)}, step)
    path = tmp_path / "timeline.png"
    path.write_bytes(render_timeline(store))
    pixels = torch.as_tensor(imread(path))
    assert pixels.ndim == 3 and pixels.shape[1] == 1000  # 10 in at 100 dpi
    assert store.timeline.bin_size == 4 and store.timeline.columns <= store.timeline.max_columns


class FailAtStep(L.Callback):
    """The user's code fails in the middle of the run (not an algorithm)."""

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == 5:
            raise ValueError("the user's failure")


@pytest.mark.parametrize("bridge", ["none", "idle", "listening"])
def test_after_a_failed_fit_the_users_loggers_stay_open_for_the_users_error_handling(bridge: str, tmp_path: Path) -> None:
    """Lightning leaves a failed run's W&B run open (the user may log the error, then finish it): so does the bridge."""
    callbacks: list[L.Callback] = [FailAtStep()]
    if bridge != "none":
        callbacks.append(AlgorithmEngineCallback([Cooldown(("INIT", "BATCH_END"))] if bridge == "listening" else []))
    wandb_logger = WandbLogger(project="failures", save_dir=str(tmp_path), offline=True)
    csv_logger = CSVLogger(tmp_path, name="csv")
    trainer = quiet_trainer(max_epochs=2, logger=[wandb_logger, csv_logger], callbacks=callbacks)
    try:
        with pytest.raises(ValueError, match="the user's failure"):
            trainer.fit(tiny_classifier(), image_loader(n=32, batch_size=8))
        # the user's error handling, on the run the user owns
        wandb_logger.experiment.log({"error_handled": 1})
        wandb_logger.experiment.summary["error"] = "the user's failure"
        csv_logger.log_metrics({"error_handled": 1.0}, step=99)
        csv_logger.save()
        files_dir = Path(wandb_logger.experiment.dir)
    finally:
        wandb.finish(exit_code=1)
    run = _read_run(files_dir)
    assert [row["error_handled"] for row in run["history"] if "error_handled" in row] == [1]
    assert run["summary"]["error"] == "the user's failure"
    csv_rows = (Path(csv_logger.log_dir) / "metrics.csv").read_text().splitlines()
    assert any(row.startswith("1.0,") or ",1.0" in row for row in csv_rows if "99" in row)
    if bridge == "listening":
        assert run["summary"]["algorithm_report/failed_at_step"] == 5  # ours, written before Lightning lets go
