"""Profile a recipe with Lightning's own profilers: one row, or one range, per algorithm and event.

    python examples/profile_recipe.py                      # SimpleProfiler: prints the algorithms' rows
    python examples/profile_recipe.py --profiler pytorch --plot step.png   # Chrome trace + one step drawn

The bridge hands the Trainer's profiler a marker per algorithm and event
(``algorithm/<Name>/event/<event>``), per engine callback and per event span (``event/forward``,
``event/dataloader``, ...). With ``--profiler simple`` the report lists them beside Lightning's
own rows; with ``--profiler pytorch`` the Chrome trace (open it at ``chrome://tracing`` or
https://ui.perfetto.dev) holds them as ranges inside Lightning's range of the hook that fired the
event, and ``--plot`` draws one training step's ranges with matplotlib.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import lightning as L
import torch

from composer_bridge import AlgorithmEngineCallback, ComposerClassifier, recipes
from composer_bridge.data import digits_loaders
from composer_bridge.models import ResNetCNN


def fit(profiler: Any, steps: int) -> AlgorithmEngineCallback:
    torch.manual_seed(0)
    model = ComposerClassifier(ResNetCNN(num_classes=10, in_channels=1), num_classes=10)
    bridge = AlgorithmEngineCallback(recipes.vision("mild", total_steps=steps))
    train, _ = digits_loaders(batch_size=64)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, profiler=profiler, callbacks=[bridge])
    trainer.fit(model, train)
    return bridge


def simple(out: Path, steps: int) -> None:
    fit(L.pytorch.profilers.SimpleProfiler(dirpath=out, filename="simple"), steps)
    (report,) = out.glob("*simple*.txt")
    lines = report.read_text().splitlines()
    print("\n".join(lines[:5]))  # the table's head
    for line in lines:
        if "algorithm/" in line or "AlgorithmEngineCallback" in line or "|  event/" in line:
            print(line)


def pytorch(out: Path, steps: int) -> Path:
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2)
    fit(L.pytorch.profilers.PyTorchProfiler(dirpath=out, filename="trace", export_to_chrome=True, schedule=schedule),
        steps)
    return max(out.glob("*.pt.trace.json"), key=lambda p: p.stat().st_mtime)


def ranges(trace: Path) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of the profiler's ``[pl][profile]`` ranges, Lightning's and the bridge's."""
    events = json.loads(trace.read_text())["traceEvents"]
    return [(e["name"].removeprefix("[pl][profile]"), e["ts"], e["ts"] + e["dur"])
            for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("[pl][profile]")]


def plot(trace: Path, path: Path) -> None:
    """Draw one recorded training step: one lane per Lightning hook, one per algorithm and event."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = ranges(trace)
    # a step runs from its batch transfer (just before run_training_batch) to the bridge's on_train_batch_end;
    # the first recorded step whose end is in the trace (the trace stops inside the last one)
    ends = sorted(e for name, _, e in spans if name.endswith("AlgorithmEngineCallback.on_train_batch_end"))
    step_start = min(s for name, s, _ in spans if name == "run_training_batch" and ends and s < ends[-1])
    t0 = max(s for name, s, _ in spans if name.endswith("on_before_batch_transfer") and s < step_start)
    t1 = min(e for e in ends if e > step_start)
    inside = sorted(((name, s, e) for name, s, e in spans if t0 <= s and e <= t1), key=lambda r: r[1])
    hook_lanes = list(dict.fromkeys(  # the bridge's callback hooks and the module points it fires events from
        n for n, _, _ in inside if n.startswith("[Callback]AlgorithmEngineCallback")
        or n.endswith(("_batch_transfer", ".training_step", ".backward", ".optimizer_step"))))
    algo_lanes = list(dict.fromkeys(n for n, _, _ in inside if n.startswith("algorithm/")))
    lanes = hook_lanes + algo_lanes
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(lanes) + 1.5))
    colours = plt.get_cmap("tab10")
    owners = sorted({lane.split("/")[1] for lane in algo_lanes})
    for name, s, e in inside:
        if name not in lanes:
            continue
        row = lanes.index(name)
        algorithm = name.startswith("algorithm/")
        colour = colours(owners.index(name.split("/")[1]) % 10) if algorithm else "#b0b0b0"
        ax.broken_barh([((s - t0) / 1e3, max((e - s) / 1e3, (t1 - t0) / 1e3 / 400))], (row - 0.38, 0.76), color=colour)
        if algorithm:
            ax.text((e - t0) / 1e3, row, f" {(e - s):.0f} µs", va="center", fontsize=7)
    labels = [lane.replace("algorithm/", "").replace("[Callback]", "").replace("[LightningModule]", "")
              .replace("[Strategy]", "") for lane in lanes]
    ax.set_yticks(range(len(lanes)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step's batch transfer began")
    ax.set_title("One training step in PyTorchProfiler's Chrome trace: Lightning's hooks (grey), each algorithm's apply",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiler", choices=("simple", "pytorch"), default="simple")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("profiles"), help="where the report or trace goes")
    parser.add_argument("--plot", type=Path, help="with --profiler pytorch: draw one step's ranges to this PNG")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.profiler == "simple":
        simple(args.out, args.steps)
    else:
        trace = pytorch(args.out, args.steps)
        print(f"Chrome trace: {trace}")
        if args.plot is not None:
            plot(trace, args.plot)


if __name__ == "__main__":
    main()
