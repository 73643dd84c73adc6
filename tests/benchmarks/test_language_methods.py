"""benchmarks/language_methods.py: the language methods side by side at the plateau lengths, checked through its dry run.

The full measurement takes about an hour; the dry run trains the same fits (the search's) at 2, 4
and 8 steps on one seed in this process, in seconds.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from helpers.support import REPO, load_script

from composer_bridge.search.scoring import strict_speedup

methods = load_script("benchmarks/language_methods.py", "language_methods_under_test")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("lm") / "lm"
    # "nodim": ZLoss cannot tell the class dimension of (4, 128, 128) logits: it fails to train and is left out
    methods.main(["--dry-run", "--out", str(out), "--configs", "glu=GatedLinearUnits",
                  'nodim=ZLoss{"target_key": "labels"}'])
    return out, json.loads(out.with_suffix(".json").read_text())


def test_the_defaults_are_the_language_search_near_the_plateau_on_its_unseen_seeds() -> None:
    state = json.loads((REPO / "benchmarks/search_language_plateau_cpu.json").read_text())["settings"]
    assert list(methods.PLATEAU_LENGTHS) == state["run_lengths"] == [2000, 4000, 8000]
    assert list(methods.UNSEEN_SEEDS) == state["confirm_seeds"] == [1000, 1001, 1002]
    assert set(methods.UNSEEN_SEEDS).isdisjoint(state["search_seeds"])
    assert {k: repr(v) for k, v in methods.TRAINER_KWARGS.items()} == state["trainer_kwargs"]
    task = methods.fit_task([], 2000, 1000)  # the search's fit: its module, its data, its clock
    assert task.make_module is methods.search_example.language_module and task.clock == "cpu"
    assert task.make_data is methods.search_example.language_data and task.monitor == state["monitor"]
    recorded = methods.state_file_baseline(list(methods.UNSEEN_SEEDS), list(methods.PLATEAU_LENGTHS))
    assert len(recorded) == 9  # docs/benchmarks.md: 1.762, 1.776, 1.736 at 8,000 steps
    assert [round(recorded[f"{s}/8000"], 3) for s in methods.UNSEEN_SEEDS] == [1.762, 1.776, 1.736]
    # the estimate: a baseline curve (2,000 + 4,000 + 8,000 steps) took the search about 183 CPU s
    baseline = methods.order(["baseline"], list(methods.UNSEEN_SEEDS), list(methods.PLATEAU_LENGTHS))
    assert 150 < methods.estimate_minutes(baseline, workers=1) * 60 / 3 < 230
    assert methods.estimate_minutes(baseline, workers=2) == pytest.approx(methods.estimate_minutes(baseline, 1) / 2)


def test_every_fit_is_recorded_and_a_configuration_that_cannot_train_is_left_out(dry_run) -> None:
    _, data = dry_run
    assert data["settings"]["configs"] == ["baseline", "glu"] and "nodim" in data["left_out"]
    assert "class_dim" in data["left_out"]["nodim"]
    assert data["settings"]["seeds"] == [1000] and data["settings"]["clock"] == "cpu"
    assert {(r["config"], r["seed"], r["budget"]) for r in data["runs"]} == {
        (c, 1000, b) for c in ("baseline", "glu") for b in (2, 4, 8)}
    assert all(r["clock"] == "cpu" and r["cpu_s"] > 0 for r in data["runs"])
    assert {"torch", "commit", "date", "cpus"} <= set(data["machine"])


def test_the_speedups_are_the_shared_strict_speedup_of_the_cpu_time_points(dry_run) -> None:
    out, data = dry_run
    curves = {c: [(r["cpu_s"], r["quality"]) for r in sorted((r for r in data["runs"] if r["config"] == c),
                                                             key=lambda r: r["budget"])] for c in ("baseline", "glu")}
    expected = strict_speedup(curves["baseline"], curves["glu"], False)[0]  # bits per character: lower is better
    got = data["results"]["speedups"]["glu"]
    assert got["per_seed"] == pytest.approx([expected])
    assert got["mean"] == pytest.approx(statistics.mean([expected or 0.0]))
    png = out.parent / data["results"]["png"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_run_again_it_trains_only_what_the_json_lacks(dry_run, capsys: pytest.CaptureFixture[str]) -> None:
    out, data = dry_run
    again = methods.main(["--dry-run", "--out", str(out), "--configs", "glu=GatedLinearUnits"])
    assert "0 fits to run (6 already in" in capsys.readouterr().out
    assert again["runs"] == data["runs"]


def test_a_default_the_library_lacks_is_left_out_but_a_named_one_must_resolve() -> None:
    configs, left_out = methods.configurations(["later=NotWrittenYet", "glu=GatedLinearUnits"], defaults=True)
    assert list(configs) == ["baseline", "glu"] and "NotWrittenYet" in left_out["later"]
    with pytest.raises(ValueError, match="NotWrittenYet"):
        methods.configurations(["later=NotWrittenYet"], defaults=False)
