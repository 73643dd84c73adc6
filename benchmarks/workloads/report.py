"""The benchmark's results: the JSON file, the method x workload table and the performance-profile PNG.

:func:`assemble` turns the finished fits into ``results.json``'s shape (described in docs/benchmarks.md,
"The workloads benchmark"). A configuration that cannot apply to a workload (refused by the search's
applicability check, or at set-up) is scored there as the baseline: a user who adds it gets a clear
refusal and trains without it. A configuration that trains but does not reach the target on most
held-out seeds fails that workload (an infinite time in its profile).

Examples:
    >>> cell({"mean": 1.5, "sd": 0.25, "reached": 3, "seeds": 3})
    '1.50 ± 0.25'
"""

from __future__ import annotations

import math
from typing import Any

from workloads import scores
from workloads.plan import WorkloadPlan
from workloads.store import Store

__all__ = ["assemble", "cell", "heldout_mean", "heldout_seed_times", "markdown", "median_times", "plot",
           "prescription_table", "search_table", "workload_table"]


def _seed_times(plan: WorkloadPlan, store: Store, config: str, candidates: tuple, lr: float, target: float,
                cap: float, steps: int | None = None) -> tuple[dict[str, dict[str, Any]], str | None, bool]:
    """Per held-out seed ``{"steps", "seconds"}``, the first error, and whether every fit has finished."""
    seeds: dict[str, dict[str, Any]] = {}
    error, complete = None, True
    for spec in plan.heldout(config, candidates, lr, steps):
        record = store.get(spec.key)
        if record is None:
            complete = False
            continue
        if record.get("error"):
            error = error or record["error"]
            continue
        steps, seconds = scores.time_to_target(record["points"], target, plan.workload.mode, cap)
        seeds[str(spec.seed)] = {"steps": steps, "seconds": seconds, "final": record["points"][-1]["quality"],
                                 "cpu_s": record["cpu_s"]}
    return seeds, error, complete


def assemble(plans: list[WorkloadPlan], store: Store) -> dict[str, Any]:
    """The results file's content from every finished fit (workloads not tuned yet are left out)."""
    out: dict[str, Any] = {"workloads": {}}
    for plan in plans:
        lr, tuning = plan.tuned_lr(store)
        fixed = plan.target(store, lr) if lr is not None else None
        if fixed is None:
            continue
        target, cap = fixed
        configs, left_out = plan.configurations(lr)
        searches = {spec.name: store.get(spec.key) for spec in plan.search_specs(lr, store)} if plan.searched else {}
        named = dict(configs)
        lengths: dict[str, int | None] = {}  # a search's pick trains at its prescription's length
        for name, search in searches.items():
            if search is not None and search.get("recipe") is not None:
                named[name] = tuple((n, k) for n, k in search["recipe"])
                lengths[name] = search.get("steps") if isinstance(search.get("steps"), int) else None
        entry: dict[str, Any] = {
            "description": plan.workload.description, "monitor": plan.workload.monitor, "mode": plan.workload.mode,
            "target": target, "target_seeds": list(plan.settings.target_seeds),
            "heldout_seeds": list(plan.settings.heldout_seeds), "tuning_seeds": list(plan.settings.tuning_seeds),
            "lr": lr, "tuning": tuning, "budget_steps": plan.budget, "run_steps": plan.run_steps,
            "eval_every": plan.eval_every, "cap_seconds": round(cap, 3), "not_applicable": dict(left_out),
            "configs": {},
        }
        base_seeds, _, _ = _seed_times(plan, store, "baseline", (), lr, target, cap)
        for name, candidates in named.items():
            seeds, error, complete = _seed_times(plan, store, name, candidates, lr, target, cap, lengths.get(name))
            if error and not seeds:
                entry["not_applicable"][name] = f"refused when it trained: {error}"
                continue
            row: dict[str, Any] = {"algorithms": [list(p) for p in candidates], "seeds": seeds, "complete": complete,
                                   "steps": lengths.get(name) or plan.run_steps}
            if error:
                row["error"] = error
            row["speedup"] = scores.speedups({s: v["seconds"] for s, v in base_seeds.items()},
                                             {s: v["seconds"] for s, v in seeds.items()})
            row["speedup_steps"] = scores.speedups({s: v["steps"] for s, v in base_seeds.items()},
                                                   {s: v["steps"] for s, v in seeds.items()})
            row["median_seconds"] = scores.median_time([v["seconds"] for v in seeds.values()])
            entry["configs"][name] = row
        for name, search in searches.items():
            if search is not None:
                entry[name.replace(":", "_")] = {k: v for k, v in search.items() if k not in ("key",)}
        out["workloads"][plan.workload.name] = entry
    out.update(_scores(out["workloads"]))
    return out


def median_times(workloads: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{config: {workload: median held-out seconds}}`` for the workloads each configuration is scored on (not
    applicable: the baseline's time; still training: scored on the seeds it has, three at least)."""
    names = sorted({c for w in workloads.values() for c in w["configs"]})
    times: dict[str, dict[str, float]] = {}
    for name in names:
        per: dict[str, float] = {}
        for workload, entry in workloads.items():
            row = entry["configs"].get(name)
            if row is None and name in entry["not_applicable"]:
                row = entry["configs"].get("baseline")
            if row is not None and (row.get("complete", True) or len(row["seeds"]) >= 3):
                per[workload] = row["median_seconds"]
        times[name] = per
    return {n: t for n, t in times.items() if t}


def heldout_seed_times(workloads: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Per configuration and workload it is scored on, the held-out seeds' times in seed order (``inf``: failed):
    what :func:`~workloads.scores.bootstrap_scores` reads."""
    return _seed_lists(workloads, median_times(workloads))


def _scores(workloads: dict[str, Any]) -> dict[str, Any]:
    """Every configuration's profile and score over the workloads (not applicable: the baseline's time)."""
    times = median_times(workloads)
    rat = scores.ratios(times)
    intervals, draws = scores.bootstrap_scores(_seed_lists(workloads, times))
    taus = [1 + 0.05 * i for i in range(61)]
    scored = max((len(r) for r in rat.values()), default=0)
    return {"scores": {n: scores.score(r) for n, r in rat.items()},
            "scored_workloads": {n: len(r) for n, r in rat.items()}, "all_workloads": scored,
            "profiles": {"tau": taus, "rho": {n: scores.profile(r, taus) for n, r in rat.items()}},
            "ratios": {n: {w: (None if math.isinf(v) else round(v, 4)) for w, v in r.items()} for n, r in rat.items()},
            "score_intervals": intervals,
            "search_above": scores.above("search", intervals, draws) if "search" in intervals else {}}


def _seed_lists(workloads: dict[str, Any], times: dict[str, dict[str, float]]) -> dict[str, dict[str, list[float]]]:
    """Per configuration and workload (those scored), the held-out seeds' times in seed order (``inf``: failed)."""
    out: dict[str, dict[str, list[float]]] = {}
    for name, per in times.items():
        for workload in per:
            entry = workloads[workload]
            row = entry["configs"].get(name) or entry["configs"]["baseline"]
            seeds = sorted(row["seeds"], key=int)
            out.setdefault(name, {})[workload] = [row["seeds"][s]["seconds"] or math.inf for s in seeds]
    return out


def cell(speedup: dict[str, Any]) -> str:
    """A table cell: mean ± sd over the seeds that reached the target, and how many did when not all."""
    if speedup["mean"] is None:
        return f"fails ({speedup['reached']}/{speedup['seeds']})"
    text = f"{speedup['mean']:.2f}" + (f" ± {speedup['sd']:.2f}" if speedup["sd"] is not None else "")
    return text if speedup["reached"] == speedup["seeds"] else f"{text} ({speedup['reached']}/{speedup['seeds']})"


def markdown(results: dict[str, Any]) -> str:
    """The method x workload table of speed-ups in CPU time (mean ± sd over held-out seeds), with the scores."""
    workloads = list(results["workloads"])
    complete = results.get("all_workloads", 0)
    counts = results.get("scored_workloads", {})
    names = sorted(results["scores"], key=lambda n: (counts.get(n, complete) < complete, -results["scores"][n], n))
    lines = ["| configuration | score | " + " | ".join(workloads) + " |", "|---|---|" + "---|" * len(workloads)]
    for name in names:
        cells = []
        for w in workloads:
            row = results["workloads"][w]["configs"].get(name)
            if row is None:
                cells.append("n/a" if name in results["workloads"][w]["not_applicable"] else "—")
            elif not row.get("complete", True):
                cells.append(f"pending ({len(row['seeds'])}/{len(results['workloads'][w]['heldout_seeds'])})")
            elif row["speedup"]["mean"] is None and row["speedup"]["reached"]:  # it reached the target, the baseline did not
                base = results["workloads"][w]["configs"]["baseline"]["speedup"]
                cells.append(f"reached {row['speedup']['reached']}/{row['speedup']['seeds']}, baseline "
                             f"{base['reached']}/{base['seeds']}")
            else:
                cells.append(cell(row["speedup"]))
        partial = counts.get(name, complete) < complete
        interval = results.get("score_intervals", {}).get(name)
        score = f"{results['scores'][name]:.3f}" + (f" [{interval['low']:.2f}, {interval['high']:.2f}]" if interval
                                                      else "") + (f" (on {counts[name]} of {complete})" if partial else "")
        lines.append(f"| {name} | {score} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def heldout_mean(row: dict[str, Any] | None) -> float | None:
    """A configuration's mean speed-up over the held-out seeds with a seed that misses the target as 0x (as the
    search counts it), ``None`` when it has not trained on every held-out seed.

    Examples:
        >>> heldout_mean({"speedup": {"per_seed": {"1000": 1.5, "1001": None, "1002": 1.2}}})
        0.9
    """
    if row is None or not row.get("complete", True):
        return None
    values = list(row["speedup"]["per_seed"].values())
    return round(sum(v or 0.0 for v in values) / len(values), 6) if values else None


def search_table(results: dict[str, Any]) -> str:
    """Per workload: the search's pick, its estimate for unseen seeds with the interval, its confirmation on three
    unseen seeds by the search's own measure (is it inside the interval?), the pick's AlgoPerf speed-up on the
    held-out seeds, the cost, and the proxy search's pick, cost in full-size runs and held-out speed-up."""
    lines = ["| workload | search's pick | estimate [90 % interval] | confirmed (3 unseen seeds) | inside | held-out "
             "(AlgoPerf) | cost (baseline runs) | proxy's pick | same pick | proxy cost (full-size runs) | proxy "
             "pick held-out |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, entry in results["workloads"].items():
        full, proxy = entry.get("search"), entry.get("search_proxy")
        if full is None:
            continue
        if full.get("error"):
            lines.append(f"| {name} | error: {full['error'][:80]} |" + " — |" * 9)
            continue
        pick = " + ".join(full.get("labels") or []) or "baseline"
        est, confirmed = full.get("estimate"), full.get("confirmed_mean")
        held = heldout_mean(entry["configs"].get("search")) if full.get("labels") else None
        est_text = f"{est['mean']:.2f}x [{est['low']:.2f}, {est['high']:.2f}]" if est else "— (baseline)"
        inside = "—" if est is None or confirmed is None else (
            "yes" if est["low"] <= confirmed <= est["high"] else "no")
        cost = full["cost"].get("search_in_baseline_runs")  # what its decisions read: the fits it asked for
        row = [name, pick, est_text, "—" if confirmed is None else f"{confirmed:.2f}x", inside,
               "—" if held is None else f"{held:.2f}x", f"{cost:.1f}"]
        if proxy is not None and not proxy.get("error"):
            ppick = " + ".join(proxy.get("labels") or []) or "baseline"
            pheld = heldout_mean(entry["configs"].get("search:proxy")) if proxy.get("labels") else None
            pcost = proxy["cost"].get("search_in_full_runs")
            row += [ppick, "yes" if ppick == pick else "no", "—" if pcost is None else f"{pcost:.2f}",
                    "—" if pheld is None else f"{pheld:.2f}x"]
        else:
            row += ["—" if proxy is None else f"error: {proxy['error'][:60]}", "—", "—", "—"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def workload_table(results: dict[str, Any]) -> str:
    """One row per workload: what it trains, its metric, budget, learning rates tried and frozen, and the target."""
    lines = ["| workload | model and data | metric | B (steps) | learning rates tried → frozen | target |",
             "|---|---|---|---|---|---|"]
    for name, entry in results["workloads"].items():
        tried = ", ".join(f"{lr}" for lr in entry["tuning"])
        arrow = "≥" if entry["mode"] == "max" else "≤"
        lines.append(f"| {name} | {entry['description']} | {entry['monitor']} | {entry['budget_steps']} | "
                     f"{tried} → {entry['lr']:g} | {arrow} {entry['target']:.4g} |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Any, top: int = 10) -> None:
    """The performance profiles of the ``top`` best-scoring configurations and the baseline, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    taus = results["profiles"]["tau"]
    complete = results.get("all_workloads", 0)
    ranked = sorted((n for n in results["scores"] if results.get("scored_workloads", {}).get(n, complete) == complete),
                    key=lambda n: -results["scores"][n])
    shown = ranked[:top] + [n for n in ("baseline", "search") if n in ranked and n not in ranked[:top]]
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in shown:
        style = "-" if name not in ("baseline", "search") else ("--" if name == "baseline" else ":")
        ax.step(taus, results["profiles"]["rho"][name], where="post", linestyle=style,
                label=f"{name} ({results['scores'][name]:.2f})")
    ax.set_xlabel("tau: time to target within tau x the fastest configuration's")
    ax.set_ylabel("fraction of workloads")
    ax.set_title(f"Performance profiles over {len(results['workloads'])} workloads (score in brackets)")
    ax.set_xlim(1, taus[-1])
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _median_ratio(base: dict[str, Any] | None, row: dict[str, Any] | None) -> float | None:
    """AlgoPerf's per-workload comparison: the baseline's median held-out time over the configuration's (a seed
    that misses the target counts as infinitely slow; ``0.0`` when the configuration's median is a failure)."""
    if base is None or row is None or not row.get("complete", True):
        return None
    b, c = base["median_seconds"], row["median_seconds"]
    if math.isinf(b) and math.isinf(c):
        return None  # both miss the target on most seeds: no ratio
    if math.isinf(c):
        return 0.0
    return math.inf if math.isinf(b) else round(b / c, 4)


def prescription_table(results: dict[str, Any]) -> str:
    """Per workload: the prescription search's run (algorithms and length), its estimate with the interval, the run
    as handed over on the held-out seeds (the baseline's median time to target over its median), whether that lies
    in the interval, how many held-out seeds it reached the target on, and the cost in its own baseline runs and
    in runs of B."""
    lines = ["| workload | prescription | estimate [90 % interval] | held-out, as handed over | inside | reached | "
             "cost (its baseline runs) | cost (runs of B) |", "|---|---|---|---|---|---|---|---|"]
    for name, entry in results["workloads"].items():
        full = entry.get("search")
        if full is None or "prescription" not in full:
            continue
        if full.get("error") or full.get("prescription") is None:
            lines.append(f"| {name} | error: {(full.get('error') or '')[:80]} |" + " — |" * 6)
            continue
        p = full["prescription"]
        pick = " + ".join(a[2] for a in p["algorithms"]) or "baseline"
        est = "—" if p["low"] is None else f"{p['speedup']:.2f}x [{p['low']:.2f}, {p['high']:.2f}]"
        row = entry["configs"].get("search")
        held = _median_ratio(entry["configs"].get("baseline"), row)
        inside = "—" if held is None or p["low"] is None or math.isinf(held) else (
            "yes" if p["low"] <= held <= p["high"] else "no")
        reached = "—" if row is None else f"{row['speedup']['reached']}/{row['speedup']['seeds']}"
        if held is None and row is not None and entry["configs"].get("baseline") is not None:
            held_text = "both miss the target on most seeds"
        else:
            held_text = "—" if held is None else ("reached, baseline not" if math.isinf(held) else f"{held:.2f}x")
        own = full["cost"].get("search_in_baseline_runs") or 0.0
        lines.append(f"| {name} | {pick} @ {full['steps']} steps | {est} | {held_text} | "
                     f"{inside} | {reached} | {own:.2f} | {own * entry['run_steps'] / entry['budget_steps']:.2f} |")
    return "\n".join(lines)
