"""What a recipe search reports: a summary, the recipe as Python and as LightningCLI YAML, tables, a plot, W&B.

Examples:
    >>> from composer_bridge.search.candidates import Candidate
    >>> print(recipe_code([Candidate("LabelSmoothing", {"smoothing": 0.1})], total_steps=200))
    import lightning
    from composer_bridge import AlgorithmEngineCallback
    from composer_bridge.algorithms import LabelSmoothing
    <BLANKLINE>
    # Found by composer_bridge.search; arguments counted in steps are scaled to a 200-step run.
    total_steps = 200  # build your module's schedule for this many steps
    algorithms = [
        LabelSmoothing(smoothing=0.1),
    ]
    callback = AlgorithmEngineCallback(algorithms)
    trainer = lightning.Trainer(max_steps=200, callbacks=[callback])  # and your module built for total_steps=200
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from composer_bridge.search.candidates import Candidate
from composer_bridge.search.prescription import run_code, run_yaml

if TYPE_CHECKING:
    from composer_bridge.search.results import SearchResult

__all__ = ["fits_table", "plot", "python_code", "recipe_code", "recipe_yaml", "summary", "to_wandb", "write_outputs",
           "yaml_fragment"]


def _name(config: Sequence[str]) -> str:
    return " + ".join(config) or "baseline"


def _unit(result: SearchResult) -> str:
    return "steps" if result.settings["clock"] == "steps" else "s"


def prescription_summary(result: SearchResult) -> str:
    """The prescription search's summary: the run to start, what it rests on, the confirmation, the cost."""
    cost, unit, p = result.cost, _unit(result), result.prescription
    assert p is not None
    lines = [f"Prescription: {p.text()}.", f"Measured: {p.measured}."]
    if result.confirmed is not None:
        lines.append(f"Confirmed as handed over on seeds {result.settings['confirm_seeds']} (never seen by the search), "
                     f"against the baseline at {p.baseline_steps} steps: {result.confirmed.text()}.")
    for name, speed in result.also_confirmed.items():
        lines.append(f"{name}: {speed.text()} on the same confirmation seeds.")
    given = " (your baseline run, read, is no part of it)" if result.settings.get("baseline_run") else ""
    lines.append(f"Search: {cost['search_fits']} runs, {cost['search_train']:.1f} {unit} of training = "
                 f"{cost['search_in_baseline_runs']:.2f} baseline runs (one = the baseline at {p.baseline_steps} steps "
                 f"on one seed, {cost['baseline_run']:.1f} {unit}){given}; confirmation apart: {cost['confirm_fits']} "
                 f"runs, {cost['confirm_train']:.1f} {unit}. Clock: {cost['clock_means']}.")
    lines.append("Train it: python_code() or yaml_fragment() set max_steps and the schedule's length.")
    return "\n".join(lines)


def summary(result: SearchResult) -> str:
    """The verdict, the recipe, its confirmed speed-up with spread, what the search cost."""
    if result.settings.get("method") == "prescribe" and result.prescription is not None:
        return prescription_summary(result)
    cost, unit = result.cost, _unit(result)
    seeds = result.settings["confirm_seeds"]
    lines = []
    if not result.recipe and result.stopped_by_budget:
        lines.append("No recipe: the budget ran out before the search's first step had scored every candidate on every "
                     f"search seed {result.settings['search_seeds']}; raise the budget and run again with the same "
                     "state to go on.")
    elif not result.recipe:
        confidence = result.settings.get("confidence")
        sure = f" with {100 * confidence:g} % confidence" if confidence else ""
        lines.append("No recipe: no candidate added to the baseline beat it on the search seeds "
                     f"{result.settings['search_seeds']}{sure}; use the baseline.")
    elif result.beats_baseline:
        lines.append(f"Recipe: {_name([c.label for c in result.recipe])}. Confirmed on seeds {seeds} (never seen by "
                     f"the search): strict speed-up {result.confirmed.text()}.")
    else:
        lines.append(f"No recipe beats the baseline: the search's pick, {_name([c.label for c in result.recipe])} "
                     f"({result.search_score:.2f}x on the search seeds), gets {result.confirmed.text()} on the "
                     f"confirmation seeds {seeds}.")
    if result.estimate is not None:
        inside = ""
        if result.confirmed is not None:
            covered = result.estimate.low <= result.confirmed.mean <= result.estimate.high
            inside = f"; the confirmed mean {result.confirmed.mean:.2f}x is {'inside' if covered else 'outside'} it"
        lines.append(f"Estimate for unseen seeds, corrected for having been chosen: {result.estimate.text()}{inside}.")
    if "proxy" in result.settings:
        lines.append(f"Searched on a proxy ({result.settings['proxy']}), confirmed at full size "
                     f"(run lengths {result.settings['run_lengths']}).")
    if result.runner_up and result.runner_up_confirmed is not None:
        lines.append(f"Best configuration tried, not taken: {_name([c.label for c in result.runner_up])}, "
                     f"{result.runner_up_confirmed.text()} on the confirmation seeds.")
    for name, speed in result.also_confirmed.items():
        lines.append(f"{name}: {speed.text()} on the same confirmation seeds.")
    if result.quality_within_baseline_time:
        within = "; ".join(f"{name} {quality.text()}" for name, quality in result.quality_within_baseline_time.items())
        lines.append(f"Best {result.settings['monitor']} within the baseline's training time (its longest run), mean "
                     f"(per seed) on the confirmation seeds: {within}.")
    lines.append(
        f"Search: {cost['search_fits']} fits, {cost['search_train']:.1f} {unit} of training "
        f"({cost['search_in_baseline_runs']:.1f} baseline-run equivalents; one baseline run = every run length on one "
        f"seed = {cost['baseline_run']:.1f} {unit}){', stopped by the budget' if result.stopped_by_budget else ''}; "
        + (f"and {cost['search_unread_fits']} fits trained ahead that no decision needed, "
           f"{cost['search_unread_train']:.1f} {unit} ({cost['search_trained_in_baseline_runs']:.1f} baseline-run "
           "equivalents trained in all); " if cost.get("search_unread_fits") else "")
        + (f"{cost['search_in_full_runs']:.2f} full-size baseline runs; " if cost.get("search_in_full_runs")
           and "proxy" in result.settings else "")
        + f"confirmation: {cost['confirm_fits']} fits, {cost['confirm_train']:.1f} {unit}. Clock: {cost['clock_means']}.")
    frac = cost["overhead_fraction_of_budget"]
    lines.append(f"The search's own overhead (everything outside the fits): {cost['overhead_cpu_s']:.2f} s CPU, "
                 f"{cost['overhead_s']:.2f} s wall" + (f", {100 * frac:.1f} % of the budget" if frac is not None else "")
                 + "; Lightning's set-up and validation around the timed training: "
                 f"{cost['lightning_outside_training_s']:.1f} s wall.")
    return "\n".join(lines)


def _kwargs_text(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def recipe_code(recipe: Sequence[Candidate], total_steps: int) -> str:
    """Python code that trains ``recipe`` for ``total_steps`` optimizer steps (``max_steps`` and the schedule)."""
    return run_code(recipe, total_steps, f"Found by composer_bridge.search; arguments counted in steps are scaled to a "
                                         f"{total_steps}-step run.")


def recipe_yaml(recipe: Sequence[Candidate], total_steps: int) -> str:
    """A LightningCLI fragment (``trainer.max_steps``, ``trainer.callbacks``) with ``recipe`` for ``total_steps`` steps."""
    return run_yaml(recipe, total_steps, f"Found by composer_bridge.search; arguments counted in steps are scaled to a "
                                         f"{total_steps}-step run.")


def python_code(result: SearchResult, total_steps: int | None = None) -> str:
    """The run the search prescribes as code (its algorithms and length); with ``total_steps``, its algorithms
    scaled to that length instead (the speed-up was measured at the prescribed length, not at that one)."""
    if total_steps is None and result.prescription is not None:
        return result.prescription.python_code()
    return recipe_code(result.recipe, total_steps or max(result.settings["run_lengths"]))


def yaml_fragment(result: SearchResult, total_steps: int | None = None) -> str:
    """The same as a LightningCLI YAML fragment."""
    if total_steps is None and result.prescription is not None:
        return result.prescription.yaml_fragment()
    return recipe_yaml(result.recipe, total_steps or max(result.settings["run_lengths"]))


def fits_table(result: SearchResult) -> str:
    """Every fit as Markdown: phase, algorithms, seed, run length, quality, time."""
    unit = _unit(result)
    lines = [f"| phase | algorithms | seed | steps | {result.settings['monitor']} | training {unit} |",
             "|---|---|---|---|---|---|"]
    for f in result.fits:
        quality = f"failed ({f.error})" if f.error else f"{f.quality:.4f}"
        lines.append(f"| {f.phase} | {_name(f.config)} | {f.seed} | {f.steps} | {quality} | {f.seconds:.2f} |")
    return "\n".join(lines)


def curves_table(result: SearchResult) -> str:
    """Every configuration-seed curve: its status and strict speed-up."""
    lines = ["| phase | algorithms | seed | run lengths trained | result | strict speed-up |", "|---|---|---|---|---|---|"]
    for c in result.curves:
        speed = "—" if c.status == "baseline" else ("fail" if c.speedup is None else f"{c.speedup:.2f}x")
        lines.append(f"| {c.phase} | {_name(c.config)} | {c.seed} | {len(c.points)} | {c.status} | {speed} |")
    return "\n".join(lines)


def plot(result: SearchResult, path: Path) -> None:
    """Quality against training time on the confirmation seeds (mean over seeds per run length), plus the search's points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    higher = result.settings["mode"] == "max"
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    search = [f for f in result.fits if f.phase == "search"]
    ax.scatter([f.seconds for f in search], [f.quality for f in search], s=8, color="#bbbbbb",
               label=f"search fits ({len(search)}, seeds {result.settings['search_seeds']})")
    configs = list(dict.fromkeys(tuple(f.config) for f in result.fits if f.phase == "confirm"))
    colours = ["#444444", "#d62728", "#1f77b4", "#2ca02c", "#9467bd"]
    names = {frozenset(): "baseline"}
    if result.recipe:
        names[frozenset(c.label for c in result.recipe)] = "search's recipe"
    for name, labels in result.settings.get("also_confirm", {}).items():
        names.setdefault(frozenset(labels), name)
    for i, config in enumerate(configs):
        fits = [f for f in result.fits if f.phase == "confirm" and tuple(f.config) == config]
        xs, ys = [], []
        for steps in sorted({f.steps for f in fits}):
            at = [f for f in fits if f.steps == steps]
            xs.append(statistics.mean(f.seconds for f in at))
            ys.append(statistics.mean(f.quality for f in at))
        label = names.get(frozenset(config), _name(config))
        if len(label) + len(_name(config)) < 70 and label != _name(config):
            label = f"{label}: {_name(config)}"
        ax.plot(xs, ys, marker="o", color=colours[i % len(colours)], label=label,
                linewidth=2.0 if not config else 1.3)
    ax.set_xlabel(f"training {'steps' if _unit(result) == 'steps' else 'time, s'} ({result.cost['clock']} clock)")
    ax.set_ylabel(result.settings["monitor"] + ("" if higher else " (lower is better)"))
    title = "recipe search: confirmation seeds (lines, mean per run length) and search fits (dots)"
    if result.estimate is not None:
        title += (f"\nestimate for unseen seeds {result.estimate.mean:.2f}x ({result.estimate.low:.2f}x to "
                  f"{result.estimate.high:.2f}x)")
        if result.confirmed is not None:
            title += f", confirmed {result.confirmed.mean:.2f}x"
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left" if higher else "upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def to_wandb(result: SearchResult, out_dir: Path, project: str = "composer-bridge-search", mode: str = "offline") -> Path:
    """Log the trial table and the verdict to one W&B run (offline by default; ``wandb sync`` uploads it)."""
    import wandb

    run = wandb.init(project=project, mode=mode, dir=str(out_dir), job_type="recipe-search",
                     config={k: v for k, v in result.settings.items() if k != "trainer_kwargs"})
    try:
        table = wandb.Table(columns=["phase", "algorithms", "seed", "steps", "quality", "seconds"])
        for f in result.fits:
            table.add_data(f.phase, _name(f.config), f.seed, f.steps, f.quality, f.seconds)
        run.log({"search/fits": table})
        run.summary["search/recipe"] = _name([c.label for c in result.recipe])
        run.summary["search/beats_baseline"] = result.beats_baseline
        if result.confirmed is not None:
            run.summary["search/confirmed_speedup_mean"] = result.confirmed.mean
            run.summary["search/confirmed_speedup_sd"] = result.confirmed.sd
        run.summary["search/baseline_run_equivalents"] = result.cost["search_in_baseline_runs"]
        if result.estimate is not None:
            for key in ("mean", "low", "high", "raw"):
                run.summary[f"search/estimate_{key}"] = getattr(result.estimate, key)
        return Path(run.dir)
    finally:
        run.finish()


def write_outputs(result: SearchResult, out_dir: Path, wandb: bool | str = "auto") -> dict[str, Path]:
    """``summary.md``, ``recipe.py``, ``recipe.yaml``, ``fits.md``, ``pareto.png`` (and W&B) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: out_dir / name for name in ("summary.md", "recipe.py", "recipe.yaml", "fits.md", "pareto.png")}
    paths["summary.md"].write_text(summary(result) + "\n\n" + "\n".join(f"- {s}" for s in result.steps) + "\n\n"
                                   + curves_table(result) + "\n")
    paths["recipe.py"].write_text(python_code(result) + "\n")
    paths["recipe.yaml"].write_text(yaml_fragment(result) + "\n")
    paths["fits.md"].write_text(fits_table(result) + "\n")
    plot(result, paths["pareto.png"])
    if wandb:
        try:
            import wandb as _  # noqa: F401
        except ImportError:
            if wandb != "auto":
                raise
        else:
            paths["wandb"] = to_wandb(result, out_dir)
    return paths
