"""Which run an algorithm instance belongs to, so that state never leaks from one model into the next.

An algorithm keeps state while it runs (EMA's average, LayerFreezing's frozen set, SAM's step
counts). Reusing the same instance with a *new* model — a second ``AlgorithmEngineCallback`` or
``Trainer`` built with it, or the same callback given another model — must not carry that state
over. The bridge therefore binds each algorithm to the run it serves at ``INIT``: the first time,
it keeps a pristine copy of the algorithm's attributes; when a different run takes the instance
over, the attributes are reset to that copy and the algorithm starts fresh, exactly as a new
instance would. The same model continuing in the same callback (``fit`` again, ``validate``,
``test``, a resumed checkpoint) keeps its state.

Examples:
    >>> from composer_bridge.algorithms import EMA
    >>> ema = EMA()
    >>> bind(ema, run=1)
    False
    >>> ema.num_updates = 5            # what a run leaves behind
    >>> bind(ema, run=1), ema.num_updates  # same run: continues
    (False, 5)
    >>> bind(ema, run=2), ema.num_updates  # another run: starts fresh
    (True, 0)
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

__all__ = ["bind", "new_run_id"]

_RUN_ATTR = "_composer_bridge_run"
_PRISTINE_ATTR = "_composer_bridge_pristine"
_run_ids = itertools.count(1)


def new_run_id() -> int:
    """A number naming one (callback, model) run, unique in this process."""
    return next(_run_ids)


def bind(algorithm: Any, run: int) -> bool:
    """Bind ``algorithm`` to ``run``; return whether it had to be reset (it served another run before)."""
    attributes = vars(algorithm)
    owner = attributes.get(_RUN_ATTR)
    if owner == run:
        return False
    if _PRISTINE_ATTR not in attributes:
        # First run ever: remember the attributes as constructed (plain hyper-parameters, no tensors yet).
        pristine = {k: v for k, v in attributes.items() if k not in (_RUN_ATTR, _PRISTINE_ATTR)}
        attributes[_PRISTINE_ATTR] = copy.deepcopy(pristine)
        attributes[_RUN_ATTR] = run
        return False
    pristine = attributes[_PRISTINE_ATTR]
    for name in [k for k in attributes if k not in (_RUN_ATTR, _PRISTINE_ATTR)]:
        del attributes[name]
    attributes.update(copy.deepcopy(pristine))
    attributes[_RUN_ATTR] = run
    return True
