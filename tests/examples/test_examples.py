"""Every example runs, in a tiny configuration, so none of them rots.

The demo and the LightningCLI example run as the user runs them (a subprocess with this
interpreter); the others are imported from ``examples/`` and their ``main`` called with tiny
arguments, which exercises the same code without paying for a fresh interpreter each time.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def library_lacks(*names: str) -> list[str]:
    from composer_bridge import algorithms

    return [name for name in names if not hasattr(algorithms, name)]


def load(path: Path) -> ModuleType:
    """Import a script by path (its folder on sys.path, as when it runs as a script)."""
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_script(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_demo_trains_both_runs_and_reports_speedup_plan_cost_png_and_wandb(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    result = run_script(str(EXAMPLES / "demo.py"), "--max-steps", "3", "--out", str(out), "--no-progress-bar",
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    assert "baseline" in text and "recipe mild" in text
    assert text.count("the baseline's best (at 3 steps)") == 3  # a line per seed: Q, and each side's time to it
    assert "the recipe reached it after" in text or "the recipe never reached it" in text
    assert "plan" in text and "ProgressiveResizing" in text  # the plan lists the recipe's algorithms
    assert "total ms" in text  # the cost report's header
    runs_json = json.loads((out / "demo_runs.json").read_text())
    assert {(r["task"], r["seed"]) for r in runs_json["runs"]} == {(t, s) for t in ("language", "vision") for s in (0, 1, 2)}
    png = out / "demo_accuracy.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2, "both runs are logged to W&B offline"


def test_cli_builds_the_callback_and_algorithms_from_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    if library_lacks("EMA", "SAM"):
        pytest.skip(f"the YAML configs name {library_lacks('EMA', 'SAM')}, not in composer_bridge.algorithms yet")
    monkeypatch.setattr(sys, "argv", ["cli.py"])
    cli_module = load(EXAMPLES / "cli.py")
    from composer_bridge import AlgorithmEngineCallback
    from composer_bridge.algorithms import BlurPool, ChannelsLast, LabelSmoothing, ProgressiveResizing

    cli = cli_module.main(["--config", str(EXAMPLES / "configs" / "mild.yaml")], run=False)
    bridges = [c for c in cli.trainer.callbacks if isinstance(c, AlgorithmEngineCallback)]
    assert len(bridges) == 1
    algorithms = bridges[0].algorithms
    assert [type(a).__name__ for a in algorithms] == [
        "BlurPool", "ChannelsLast", "EMA", "ProgressiveResizing", "LabelSmoothing"]
    assert algorithms[0] == BlurPool() and algorithms[1] == ChannelsLast()
    assert (algorithms[2].half_life, algorithms[2].update_interval) == ("auto", "3ba")
    assert algorithms[3] == ProgressiveResizing(initial_scale=0.75, delay_fraction=0.4, finetune_fraction=0.2,
                                                size_increment=2)
    assert algorithms[4] == LabelSmoothing(smoothing=0.08)
    assert cli.trainer.max_epochs == 12

    medium = cli_module.main(["--config", str(EXAMPLES / "configs" / "medium.yaml")], run=False)
    names = [type(a).__name__ for c in medium.trainer.callbacks if isinstance(c, AlgorithmEngineCallback)
             for a in c.algorithms]
    assert names[-2:] == ["MixUp", "SAM"]
    baseline = cli_module.main(["--config", str(EXAMPLES / "configs" / "baseline.yaml")], run=False)
    assert not any(isinstance(c, AlgorithmEngineCallback) for c in baseline.trainer.callbacks)


def test_cli_fit_command_runs(tmp_path: Path) -> None:
    if library_lacks("EMA"):
        pytest.skip("mild.yaml names EMA, not in composer_bridge.algorithms yet")
    result = run_script(
        str(EXAMPLES / "cli.py"), "fit", "--config", str(EXAMPLES / "configs" / "mild.yaml"),
        "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", "--trainer.default_root_dir", str(tmp_path), cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "max_steps=2" in result.stderr + result.stdout
    assert (tmp_path / "config.yaml").exists()


def test_vision_example_runs_the_hot_recipe() -> None:
    vision = load(EXAMPLES / "vision.py")
    result = vision.main(["--recipe", "hot", "--max-steps", "2", "--accelerator", "cpu", "--devices", "1"])
    assert len(result.points) == 1 and 0.0 <= result.final_acc <= 1.0
    ran = {row.algorithm for row in result.callback.cost_report().rows}
    hot = {"BlurPool", "ChannelsLast", "ProgressiveResizing", "LabelSmoothing", "MixUp", "SAM", "ColOut",
           "StochasticDepth", "EMA"}
    assert hot - set(library_lacks(*hot)) <= ran


def test_own_module_example_uses_data_and_weight_algorithms_with_a_plain_module() -> None:
    own = load(EXAMPLES / "own_module.py")
    metrics = own.main(["--max-steps", "3", "--accelerator", "cpu"])
    assert 0.0 <= metrics["val/acc"] <= 1.0


def test_language_example_trains_with_every_language_algorithm() -> None:
    language = load(EXAMPLES / "language.py")
    flags = ["--alibi", "--gated-linear-units", "--low-precision-layernorm"]
    if not library_lacks("SeqLengthWarmup"):
        flags.append("--seq-length-warmup")
    metrics = language.main([
        *flags, "--max-steps", "2", "--max-chars", "20000", "--block-size", "32", "--batch-size", "8",
        "--d-model", "32", "--n-layers", "1", "--sample", "10", "--accelerator", "cpu", "--devices", "1",
    ])
    assert math.isfinite(metrics["val/loss"])
    assert metrics["val/loss"] < math.log(128) + 1.0  # a trained character model, not a broken one


def test_the_language_search_examples_starting_recipes_train_on_its_module() -> None:
    # examples/search.py --task language races muon-wsd and gpt-fast whole: each trains on the example's GPT
    # and its dict batches (ZLoss finds the targets through the module's batch_keys), a few steps here.
    from composer_bridge.core import torch_versions
    from composer_bridge.search.executor import FitTask, execute

    search = load(EXAMPLES / "search.py")
    for name, recipe in {"muon-wsd": search.from_recipe("muon-wsd"),
                         "gpt-fast": [c for c in search.from_recipe("gpt-fast", max_seq_length=search.LM_BLOCK)
                                      if c.algorithm != "LowPrecisionLayerNorm"]}.items():
        if name == "muon-wsd" and not torch_versions.at_least(torch_versions.MUON):
            continue  # refused at setup there, with the version
        outcome = execute(FitTask(search.language_module, search.language_data, recipe, 3, 0, "val/bits_per_char",
                                  "steps", {"accelerator": "cpu", "devices": 1}))
        assert outcome.error is None and math.isfinite(outcome.quality), name


def test_language_text_ships_with_python() -> None:
    language = load(EXAMPLES / "language.py")
    text = language.stdlib_text(max_chars=5000)
    assert len(text) == 5000 and "def " in text
    ids = language.encode(text)
    assert int(ids.max()) < language.VOCAB_SIZE
    assert language.decode(ids[:100]) == text[:100].encode("ascii", "replace").decode()


def test_time_to_accuracy_benchmark_produces_its_table() -> None:
    benchmark = load(ROOT / "benchmarks" / "time_to_accuracy.py")
    result = benchmark.main(["--seeds", "1", "--recipes", "mild", "--max-steps", "2", "--threads", "0"])
    assert "| baseline |" in result["table"] and "| mild |" in result["table"]
    assert len(result["recipes"]["mild"]) == 1


@pytest.mark.parametrize("script", ["demo.py", "vision.py", "language.py", "own_module.py", "cli.py", "search.py",
                                    "profile_recipe.py"])
def test_every_example_explains_itself(script: str) -> None:
    source = (EXAMPLES / script).read_text()
    assert source.startswith('"""') and "python examples/" in source
