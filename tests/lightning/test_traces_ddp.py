"""DDP (2 CPU processes): only rank zero logs traces; every rank keeps its own in memory."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers.support import run_ddp_script

SCRIPT = """
import json, logging
from helpers.support import L
CSVLogger, Logger = L.loggers.CSVLogger, L.loggers.Logger
rank_zero_only = L.utilities.rank_zero.rank_zero_only
from helpers.support import image_loader, quiet_trainer, tiny_classifier
from composer_bridge import AlgorithmEngineCallback, Algorithm, Event

class Stamp(Algorithm):
    def match(self, event, state):
        return event in (Event.INIT, Event.BATCH_START, Event.BEFORE_LOSS, Event.EPOCH_END)
    def apply(self, event, state, logger):
        pass

class EveryRankLogger(Logger):
    # Not rank-zero-only, unlike Lightning's loggers: records the calls made on whichever rank it runs.
    name = "every_rank"
    version = 0
    def log_hyperparams(self, params, *args, **kwargs):
        pass
    def log_metrics(self, metrics, step=None):
        with open(f"calls_rank{rank_zero_only.rank}.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "keys": sorted(metrics)}) + "\\n")

class RankFile(logging.Handler):
    def emit(self, record):
        with open(f"log_rank{rank_zero_only.rank}.txt", "a") as f:
            f.write(record.getMessage() + "\\n")

traces_log = logging.getLogger("composer_bridge.traces")
traces_log.setLevel(logging.DEBUG)
traces_log.addHandler(RankFile())

every_rank = EveryRankLogger()
callback = AlgorithmEngineCallback([Stamp()], trace_mode="every_event", trace_file="traces.txt")
trainer = quiet_trainer(strategy="ddp", devices=2, max_epochs=2, logger=[CSVLogger(".", name="csv"), every_rank],
                        callbacks=[callback])
trainer.fit(tiny_classifier(), image_loader(n=32, batch_size=8))  # 2 steps per epoch on each rank
every_rank.log_metrics({"sentinel": 1}, 0)  # the logger itself does record on every rank
stats = {key: s.count for key, s in callback.traces.stats.items()}
with open(f"rank{trainer.global_rank}.json", "w") as f:
    json.dump({"stats": stats, "steps": sorted(callback.traces)}, f)
"""


def _calls(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(300)
def test_only_rank_zero_logs_traces_in_ddp(tmp_path: Path) -> None:
    result = run_ddp_script(SCRIPT, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # Both ranks ran the algorithm and keep their traces in memory.
    expected = {"Stamp/INIT": 1, "Stamp/BATCH_START": 4, "Stamp/BEFORE_LOSS": 4, "Stamp/EPOCH_END": 2}
    assert ranks[0]["stats"] == ranks[1]["stats"] == expected
    assert ranks[0]["steps"] == ranks[1]["steps"] == [0, 1, 2, 3, 4]

    def trace_keys(calls: list[dict]) -> set[str]:
        return {k for c in calls for k in c["keys"] if k.startswith(("algorithm_traces/", "algorithm_trace_counts/"))}

    rank0, rank1 = _calls(tmp_path / "calls_rank0.jsonl"), _calls(tmp_path / "calls_rank1.jsonl")
    assert trace_keys(rank0) == {f"algorithm_traces/{k}" for k in expected} | {f"algorithm_trace_counts/{k}" for k in expected}
    assert {"sentinel"} <= {k for c in rank1 for k in c["keys"]}  # the logger was live on rank 1 ...
    assert trace_keys(rank1) == set()  # ... and got no trace from it

    # Lightning's CSVLogger (rank zero) got the traces; the text trace was written once, by rank zero.
    (metrics_csv,) = (tmp_path / "csv").glob("version_*/metrics.csv")
    with open(metrics_csv, newline="") as f:
        columns = next(csv.reader(f))
    assert {f"algorithm_traces/{k}" for k in expected} <= set(columns)
    lines = (tmp_path / "traces.txt").read_text().splitlines()
    assert len(lines) == sum(expected.values()) and "[STEP=2][Stamp/EPOCH_END=1]" in lines
    assert (tmp_path / "log_rank0.txt").read_text().splitlines() == lines
    assert not (tmp_path / "log_rank1.txt").exists()
