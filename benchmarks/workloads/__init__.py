"""The workloads of ``benchmarks/run_workloads.py``: tasks nobody tuned the recipes for, scored as AlgoPerf scores.

Each module here defines one :class:`~workloads.base.Workload` as ``WORKLOAD``; :func:`load` imports it
by name. The modules written for the benchmark (fits, configurations, scores, the results file) sit
beside them: ``curve_fit``, ``configs``, ``scores``, ``store``, ``report``.

Examples:
    >>> "vit" in NAMES
    True
"""

from __future__ import annotations

import importlib
import importlib.util

from workloads.base import Workload

__all__ = ["NAMES", "Workload", "available", "load"]

#: Every workload, in the order of the tables.
NAMES = ("cluttered_resnet", "vit", "signal_cnn", "graph_mpnn", "ctr", "char_gpt", "hf_llama", "hf_gpt2", "seq2seq")


def load(name: str) -> Workload:
    """The workload ``name`` (one of :data:`NAMES`)."""
    if name not in NAMES:
        raise ValueError(f"workload {name!r}: expected one of {', '.join(NAMES)}.")
    return importlib.import_module(f"workloads.{name}").WORKLOAD


def available(name: str) -> str | None:
    """Why workload ``name`` cannot run here (a module it needs is missing), or ``None``."""
    for module in load(name).requires:
        if importlib.util.find_spec(module) is None:
            return f"needs {module} (pip install {module})"
    return None
