"""What differs between the torch releases the bridge supports, in one module.

``pyproject.toml`` declares ``torch>=2.6``; CI tests the oldest declared release and the newest one
(docs/versions.md). Every place the bridge (or its tests) behaves differently on an older torch reads
a fact from here, and ``tests/core/test_torch_versions.py`` checks each fact against the installed
torch, so a release that changes one fails there, by name, instead of somewhere in a training run.

Examples:
    >>> OLDEST_SUPPORTED
    (2, 6)
    >>> isinstance(fsdp2_runs_on_cpu(), bool)
    True
"""

from __future__ import annotations

import torch

__all__ = [
    "DISTRIBUTE_TENSOR_SLICES_LOCALLY",
    "FSDP2_ON_CPU",
    "MUON",
    "OLDEST_SUPPORTED",
    "at_least",
    "fsdp2_runs_on_cpu",
    "require",
]

#: The oldest torch ``pyproject.toml`` declares (a test checks the two agree).
OLDEST_SUPPORTED = (2, 6)

#: torch 2.7 added ``distribute_tensor(..., src_data_rank=None)``: each rank takes its own slice of a
#: whole tensor that every rank holds, with no broadcast. Before it, ``distribute_tensor`` always
#: scatters from rank 0 (a collective); the bridge then slices the local part itself.
DISTRIBUTE_TENSOR_SLICES_LOCALLY = (2, 7)

#: torch 2.7 is the first whose FSDP2 (``fully_shard``) trains on CPU processes (gloo): torch 2.6's
#: calls ``record_event`` on a CPU ``Stream``, which has none (``AttributeError``). On a GPU, 2.6 works.
FSDP2_ON_CPU = (2, 7)


#: torch 2.9 is the first release with ``torch.optim.Muon`` (the Muon algorithm refuses older ones at setup).
MUON = (2, 9)


def at_least(version: tuple[int, int]) -> bool:
    """Whether the installed torch is ``version`` (``(major, minor)``) or newer; pre-releases count as their release.

    Examples:
        >>> at_least((2, 0))
        True
    """
    installed = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return installed >= version


def fsdp2_runs_on_cpu() -> bool:
    """Whether FSDP2 (``fully_shard``, Lightning's ``ModelParallelStrategy``) can train on CPU processes."""
    return at_least(FSDP2_ON_CPU)


def require(version: tuple[int, int], feature: str, fix: str) -> None:
    """Raise a ``RuntimeError`` naming ``feature``, the torch it needs and the installed one, unless at ``version``.

    Examples:
        >>> require((2, 0), "anything", "upgrade torch")
        >>> require((99, 0), "a future feature", "upgrade torch")
        Traceback (most recent call last):
        ...
        RuntimeError: a future feature needs torch>=99.0; this is torch ...
    """
    if not at_least(version):
        raise RuntimeError(f"{feature} needs torch>={version[0]}.{version[1]}; this is torch {torch.__version__}. "
                           f"Fix: {fix}")
