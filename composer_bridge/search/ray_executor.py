"""The search's fits side by side: every fit a Ray task with its own CPUs or GPUs.

Ray core tasks, not Ray Tune: the search decides itself which fits to run (its greedy steps, its
successive halving and its early stops are its method, docs/search.md), so it needs an engine
that runs a given function with given resources and retries a dead worker, not a second search
algorithm and scheduler. One ``@ray.remote`` function with ``num_cpus``/``num_gpus`` and
``max_retries`` is all of that.

Install with ``pip install 'composer-bridge[ray]'``.

Examples:
    >>> RayExecutor().resources({"accelerator": "cpu", "devices": 2})  # cores, GPUs: one core per DDP process
    (2.0, 0.0)
    >>> from composer_bridge.search import search_recipe  # doctest: +SKIP
    >>> search_recipe(make_module, make_data, max_fits=60,
    ...               executor=RayExecutor(workers=2, cpus_per_fit=1))  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import socket
import sys
from typing import Any

from composer_bridge.search.errors import SearchInputError
from composer_bridge.search.executor import FitOutcome, FitTask, device_count, execute
from composer_bridge.search.fit_process import ATTEMPTS, check_shippable

__all__ = ["RayExecutor"]


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise SearchInputError("executor='ray' needs Ray, which is not installed: pip install 'composer-bridge[ray]' "
                               "(or pip install ray), or leave executor out to run the fits one at a time here.") from error
    return ray


def _check_reachable(address: str) -> None:
    """A quick TCP look at ``host:port`` so an unreachable cluster is an error in seconds, not a long hang."""
    if address in ("auto", "local"):
        return
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise SearchInputError(f"address={address!r}: expected 'host:port' (a cluster's GCS, e.g. '10.0.0.1:6379'), "
                               "'ray://host:10001' (Ray Client), or 'auto' (the cluster started on this machine).")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as error:
        raise SearchInputError(f"address={address!r}: no Ray cluster answers there ({error}). Start one "
                               "(ray start --head) or fix the address; leave address out to start Ray on this "
                               "machine.") from error


def _run(blob: bytes, threads: int, import_path: list[str]) -> FitOutcome:
    """The Ray task: one fit, with as many torch threads as the cores the task holds.

    The task comes pickled, and is unpickled only after the driver's import path (where it exists
    on this machine) is added, so the factories' modules import as they do in the driver.
    """
    import torch
    from ray import cloudpickle

    sys.path.extend(p for p in import_path if p not in sys.path and os.path.isdir(p))
    torch.set_num_threads(max(1, threads))
    return execute(cloudpickle.loads(blob))


class RayExecutor:
    """Run the search's fits as Ray tasks, each with its own resources.

    Args:
        address: a running cluster (``"host:6379"``, ``"ray://host:10001"``, ``"auto"``); ``None``
            starts Ray on this machine for the search and stops it afterwards.
        workers: on a Ray started here, how many fits run at once (Ray gets ``workers x cpus_per_fit``
            cores and ``workers x gpus_per_fit`` GPUs); ``None``: as many as the machine holds.
        cpus_per_fit: cores reserved for each fit (and its torch threads); default 1, or one per
            process for a CPU fit on several devices (``strategy="ddp", devices=2``: 2).
        gpus_per_fit: GPUs reserved for each fit; default the Trainer's ``devices`` when its
            ``accelerator`` is ``"gpu"``/``"cuda"`` (or ``"auto"`` with a GPU here), else 0.
        runtime_env: Ray's ``runtime_env`` for the workers of a cluster (e.g. ``{"working_dir": "."}``
            so they can import your project).
        speculate: ``True``: a worker that would otherwise wait trains the next run length of a curve
            whose shorter run is still training, before that run says whether it is needed, or else one
            of the confirmation's baseline fits. The search's
            decisions are unchanged; it finishes sooner, and the fits no decision needed are reported
            apart in its cost (``cost["search_unread_fits"]``). Off by default: they cost compute.

    A fit whose worker dies (killed, out of memory) is run once more by Ray; a second death is
    recorded as a failed fit with the reason and the search goes on. An error raised by your own
    code (a bug, not a fault) stops the search as it would without Ray.
    """

    concurrent = True

    def __init__(self, address: str | None = None, workers: int | None = None, cpus_per_fit: float | None = None,
                 gpus_per_fit: float | None = None, runtime_env: dict[str, Any] | None = None,
                 speculate: bool = False) -> None:
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise SearchInputError(f"workers={workers!r}: expected a positive int (fits at once), or None.")
        for name, value in (("cpus_per_fit", cpus_per_fit), ("gpus_per_fit", gpus_per_fit)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise SearchInputError(f"{name}={value!r}: expected a number >= 0, or None for the default.")
        self.address, self.workers, self.runtime_env = address, workers, runtime_env
        self.cpus_per_fit, self.gpus_per_fit = cpus_per_fit, gpus_per_fit
        if not isinstance(speculate, bool):
            raise SearchInputError(f"speculate={speculate!r}: expected True or False.")
        self.speculate = speculate
        self._slots = 1
        self._ray: Any = None
        self._remote: Any = None
        self._started_here = False
        self._pending: dict[Any, int] = {}
        self._tickets = 0

    def resources(self, trainer_kwargs: dict[str, Any]) -> tuple[float, float]:
        """``(cores, GPUs)`` each fit reserves with these Trainer settings."""
        devices = device_count(trainer_kwargs)
        accelerator = str(trainer_kwargs.get("accelerator", "auto"))
        on_gpu = accelerator in ("gpu", "cuda")
        if accelerator == "auto":
            import torch

            on_gpu = torch.cuda.is_available()
        gpus = self.gpus_per_fit if self.gpus_per_fit is not None else (devices if on_gpu else 0)
        cpus = self.cpus_per_fit if self.cpus_per_fit is not None else (1 if on_gpu else devices)
        return float(cpus), float(gpus)

    def start(self, sample: FitTask) -> None:
        ray = self._ray = _import_ray()
        check_shippable(sample, "a Ray worker")
        cpus, gpus = self.resources(sample.trainer_kwargs)
        if self.address is not None:
            _check_reachable(self.address)
        if not ray.is_initialized():
            if self.address is not None:
                try:
                    ray.init(address=self.address, runtime_env=self.runtime_env, log_to_driver=False)
                except ConnectionError as error:
                    raise SearchInputError(f"address={self.address!r}: could not join the Ray cluster ({error}). "
                                           "Check the address, or leave it out to start Ray here.") from error
            else:
                self._init_here(ray, cpus, gpus)
            self._started_here = True
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        if not any(r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus for r in nodes):
            biggest = max(((r.get("CPU", 0), r.get("GPU", 0)) for r in nodes), default=(0, 0))
            raise SearchInputError(
                f"each fit needs {cpus:g} cores and {gpus:g} GPUs on one machine (trainer_kwargs devices="
                f"{sample.trainer_kwargs.get('devices', 'auto')!r}, cpus_per_fit={self.cpus_per_fit!r}, "
                f"gpus_per_fit={self.gpus_per_fit!r}), but the largest machine of the Ray cluster has "
                f"{biggest[0]:g} cores and {biggest[1]:g} GPUs. Use fewer devices per fit, or a larger machine.")
        self._slots = max(1, sum(min(math.floor(r.get("CPU", 0) / cpus) if cpus else 1 << 30,
                                     math.floor(r.get("GPU", 0) / gpus) if gpus else 1 << 30) for r in nodes))
        threads = max(1, math.floor(cpus))
        self._remote = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=ATTEMPTS - 1)(_run)
        self._threads = threads

    def _init_here(self, ray: Any, cpus: float, gpus: float) -> None:
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if self.workers is not None:
            kwargs["num_cpus"] = max(1, math.ceil(self.workers * cpus))
            if gpus:
                kwargs["num_gpus"] = math.ceil(self.workers * gpus)
        ray.init(runtime_env=self.runtime_env, **kwargs)

    def submit(self, task: FitTask) -> int:
        self._tickets += 1
        from ray import cloudpickle

        blob = cloudpickle.dumps(task)
        self._pending[self._remote.remote(blob, self._threads, [p for p in sys.path if p])] = self._tickets
        return self._tickets

    def next_done(self) -> tuple[int, FitOutcome]:
        ray = self._ray
        (ref,), _ = ray.wait(list(self._pending), num_returns=1)
        ticket = self._pending.pop(ref)
        try:
            return ticket, ray.get(ref)
        except ray.exceptions.RayTaskError as error:  # the user's code raised: not a fault, stop as without Ray
            raise error.as_instanceof_cause() from None
        except ray.exceptions.UnserializableException as error:  # the same, with an error Ray could not send back
            raise RuntimeError(f"A fit raised an error that could not be sent back from its Ray worker (it cannot be "
                               f"pickled), so the search stops as it would without Ray. {error}") from None
        except ray.exceptions.RayError as error:  # the worker died (killed, out of memory), twice
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            reason = f"the Ray worker died {ATTEMPTS} times: {type(error).__name__}: {first}"
            return ticket, FitOutcome(math.nan, 0.0, 0.0, 0.0, 0.0, error=reason)

    def pending(self) -> int:
        return len(self._pending)

    def slots(self) -> int:
        """How many fits the cluster holds at once (its machines' cores and GPUs over each fit's), at start."""
        return self._slots

    def close(self) -> None:
        if self._ray is None:
            return
        for ref in list(self._pending):
            self._ray.cancel(ref, force=True)
        self._pending.clear()
        if self._started_here:
            self._ray.shutdown()
            self._started_here = False
