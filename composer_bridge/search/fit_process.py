"""A multi-process fit in a child process whose script is the fit itself.

Lightning's DDP launcher starts ranks 1..N-1 by running the current script again. Inside the
user's script that would start a second search (racing the first on its state file); here the
script is ``python -m composer_bridge.search.fit_process TASK RESULT``, so the other ranks run
this one fit and nothing else. Rank 0 writes the outcome; the search reads it back.

A child that dies (killed, out of memory, a crashed rank) is started once more; a second failure
is returned as a failed :class:`~composer_bridge.search.executor.FitOutcome` with the reason.

Examples:
    >>> from composer_bridge.search.executor import FitTask
    >>> check_shippable(FitTask(lambda n: None, print, [], 2, 0, "val/acc", "steps"), "a child process")
    Traceback (most recent call last):
    ...
    composer_bridge.search.errors.SearchInputError: make_module=<lambda> is a lambda or a function defined inside another function: a child process cannot import it. Define it at module level (def make_module(...): ... in your script or package) and pass that.
"""

from __future__ import annotations

import functools
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from composer_bridge.search.errors import SearchInputError
from composer_bridge.search.fit_task import FitOutcome, FitTask

__all__ = ["ATTEMPTS", "check_shippable", "run_in_child"]

#: A fit whose process dies is started this many times in all before it is recorded as failed.
ATTEMPTS = 2


def _pickler() -> Any:
    """cloudpickle where installed (it ships functions of the user's ``__main__`` by value), else pickle."""
    try:
        import cloudpickle
    except ImportError:
        try:
            from ray import cloudpickle  # Ray's own copy, where Ray is installed without the package
        except ImportError:
            return pickle
    return cloudpickle


def check_shippable(task: FitTask, where: str) -> None:
    """Refuse factories ``where`` cannot import (a lambda, a local function), naming the fix."""
    for name in ("make_module", "make_data"):
        target = getattr(task, name)
        inner = target.func if isinstance(target, functools.partial) else target
        qualname = getattr(inner, "__qualname__", "") or ""
        if "<lambda>" in qualname or "<locals>" in qualname:
            raise SearchInputError(
                f"{name}={qualname} is a lambda or a function defined inside another function: {where} cannot "
                f"import it. Define it at module level (def {name}(...): ... in your script or package) and pass that.")
        if _pickler() is pickle and getattr(inner, "__module__", None) == "__main__":
            raise SearchInputError(
                f"{name}={qualname} is defined in the script being run (__main__): {where} cannot import it "
                "without cloudpickle. Move it into an importable module, or pip install cloudpickle.")
    try:
        _pickler().dumps(task)
    except Exception as error:  # what cannot be pickled varies: locks, open files, generators, ...
        raise SearchInputError(f"the fit's make_module/make_data (or a candidate's arguments) cannot be sent to "
                               f"{where}: {error}. Define the factories at module level and keep what they "
                               "capture picklable.") from error


def _child_env(task: FitTask) -> dict[str, str]:
    import torch

    from composer_bridge.search.fit_task import device_count

    env = dict(os.environ)
    # The cores this process was given, shared by the fit's processes (a Ray task's, or the user's setting).
    env["OMP_NUM_THREADS"] = str(max(1, torch.get_num_threads() // device_count(task.trainer_kwargs)))
    # The child imports the factories by their module names: give it this process's import path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK", "RANK", "MASTER_PORT"):
        env.pop(name, None)  # set by an outer launcher: the child's own launcher sets its own
    return env


def _reason(returncode: int, stderr: str) -> str:
    how = f"exit code {returncode}"
    if returncode < 0:
        with_name = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else ""
        how = f"killed by signal {-returncode} {with_name}".rstrip()
    tail = " | ".join(line for line in stderr.strip().splitlines()[-3:])
    return f"{how}: {tail}" if tail else how


def run_in_child(task: FitTask) -> FitOutcome:
    """Run ``task`` in a child process with Lightning's own launcher; retried once if the child dies."""
    reasons = []
    with tempfile.TemporaryDirectory(prefix="composer_bridge_fit_") as tmp:
        task_path, result_path = Path(tmp) / "task.pkl", Path(tmp) / "outcome.json"
        task_path.write_bytes(_pickler().dumps(task))
        for _ in range(ATTEMPTS):
            done = subprocess.run([sys.executable, "-m", "composer_bridge.search.fit_process", str(task_path),
                                   str(result_path)], env=_child_env(task), capture_output=True, text=True, check=False)
            if done.returncode == 0 and result_path.exists():
                return FitOutcome(**json.loads(result_path.read_text()))
            reasons.append(_reason(done.returncode, done.stderr))
    return FitOutcome(math.nan, 0.0, 0.0, 0.0, 0.0,
                      error=f"failed {ATTEMPTS} times: " + "; ".join(reasons))


def main(argv: list[str]) -> None:
    """The child: one fit; rank 0 writes its outcome (atomically) to ``argv[1]``."""
    import time

    from composer_bridge.search.fit_task import curve_fields
    from composer_bridge.search.trial import run_fit

    task: FitTask = pickle.loads(Path(argv[0]).read_bytes())
    algorithms = [c.build(task.steps) for c in task.candidates]
    started = time.perf_counter()
    quality, timer, module = run_fit(task.make_module, task.make_data, algorithms, task.steps, task.seed,
                                     task.monitor, task.clock, task.trainer_kwargs, curve=task.curve)
    outcome = FitOutcome(quality, timer.seconds(task.clock), timer.cpu_s, timer.wall_s, time.perf_counter() - started,
                         processes=module.trainer.world_size, **curve_fields(timer))
    if module.global_rank == 0:
        path = Path(argv[1])
        tmp = path.with_name(path.name + ".part")
        tmp.write_text(json.dumps(asdict(outcome)))
        os.replace(tmp, path)


if __name__ == "__main__":
    main(sys.argv[1:])
