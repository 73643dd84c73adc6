"""Muon (Jordan et al. 2024): orthogonalised momentum for the hidden weight matrices, the user's optimizer for the rest.

``torch.optim.Muon`` (torch >= 2.9) does the maths; this module chooses its parameters and joins
it to the optimizer the user built, so that one optimizer steps, schedules and checkpoints both.

Examples:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
    ...                             torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> [name for name, _ in muon_parameters(model)]  # the output layer (4) stays with the user's optimizer
    ['0.weight', '2.weight']
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import torch

from composer_bridge.algorithms._sharding import is_dtensor
from composer_bridge.core import torch_versions
from composer_bridge.core.algorithm import Algorithm, check_owners, declaring
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State

__all__ = ["Muon", "MuonSplit", "apply_muon", "muon_parameters"]

_FIX = "upgrade torch (pip install 'torch>=2.9'), or remove Muon"


def muon_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The weights Muon trains: the 2-D weight of every ``nn.Linear`` but the output layer and any embedding.

    The output layer is the *last* ``nn.Linear`` the model registers (``lm_head``, ``head``, ``fc``,
    ``classifier``: where language models and classifiers put it); a Linear whose weight is an
    ``nn.Embedding``'s (a tied head, or a tied input projection) is left out too. Frozen weights
    (``requires_grad=False``) are left where they are.
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    chosen: list[tuple[str, torch.nn.Parameter]] = []
    seen: set[int] = set()
    for name, module in linears[:-1]:
        weight = module.weight
        if weight.ndim != 2 or not weight.requires_grad or id(weight) in embeddings or id(weight) in seen:
            continue
        seen.add(id(weight))
        chosen.append((f"{name}.weight" if name else "weight", weight))
    return chosen


class _JoinedState(MutableMapping):
    """Both optimizers' per-parameter states as one mapping; each entry read and written in its own optimizer's.

    (A ``ChainMap`` would not do: reading a Muon parameter through the user's ``defaultdict`` state
    would create an empty entry for it there.)
    """

    def __init__(self, first: MutableMapping, second: MutableMapping) -> None:
        self.maps = (first, second)

    def _owner(self, key: Any) -> MutableMapping:
        return self.maps[1] if key in self.maps[1] else self.maps[0]

    def __getitem__(self, key: Any) -> Any:
        for mapping in self.maps:
            if key in mapping:
                return mapping[key]
        raise KeyError(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._owner(key)[key] = value

    def __delitem__(self, key: Any) -> None:
        del self._owner(key)[key]

    def __iter__(self) -> Iterator[Any]:
        for mapping in self.maps:
            yield from mapping

    def __len__(self) -> int:
        return sum(len(mapping) for mapping in self.maps)


class MuonSplit(torch.optim.Optimizer):
    """The user's optimizer and a ``torch.optim.Muon``, stepped, zeroed and checkpointed as one optimizer.

    ``param_groups`` are the user's groups followed by Muon's (so gradient clipping and the like see
    every parameter). Muon's learning rate follows the user's schedule: before each step it is Muon's
    own ``lr`` times the factor the user's scheduler applies to their first group (its ``lr`` over its
    ``initial_lr``, or over the ``lr`` it was built with when no scheduler set one). ``state_dict``
    holds both optimizers' states under ``"optimizer"`` and ``"muon"``.

    Args:
        optimizer: the user's optimizer, already without the Muon parameters.
        muon: the ``torch.optim.Muon`` on the hidden matrices.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, muon: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.muon = muon
        self._user_peak = float(optimizer.param_groups[0]["lr"])
        self._muon_peaks = [float(group["lr"]) for group in muon.param_groups]
        self._joined = False
        super().__init__([*optimizer.param_groups, *muon.param_groups], {})
        self._joined = True
        self._share()

    def _share(self) -> None:
        self.param_groups = [*self.optimizer.param_groups, *self.muon.param_groups]
        self.state = _JoinedState(self.optimizer.state, self.muon.state)  # type: ignore[assignment]
        self.defaults = self.optimizer.defaults

    def schedule_factor(self) -> float:
        """The factor the user's schedule applies now (their first group's ``lr`` over its peak)."""
        group = self.optimizer.param_groups[0]
        peak = float(group.get("initial_lr", self._user_peak))
        return float(group["lr"]) / peak if peak else 1.0

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        factor = self.schedule_factor()
        for group, peak in zip(self.muon.param_groups, self._muon_peaks, strict=True):
            group["lr"] = peak * factor
        self.optimizer.step()
        self.muon.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self.muon.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if not getattr(self, "_joined", False):
            super().add_param_group(param_group)  # during torch.optim.Optimizer.__init__
            return
        self.optimizer.add_param_group(param_group)  # e.g. BaseFinetuning unfreezing layers: the user's optimizer
        self._share()

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"optimizer": self.optimizer.state_dict(), "muon": self.muon.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        if set(state_dict) != {"optimizer", "muon"}:
            raise ValueError(
                "This optimizer state was not written by a run with Muon (it has no 'muon' part): resume a run "
                "with Muon from a checkpoint written with Muon, or start this one from the weights alone."
            )
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.muon.load_state_dict(state_dict["muon"])
        self._share()

    def __repr__(self) -> str:
        return f"MuonSplit({self.optimizer!r}, {self.muon!r})"


def apply_muon(model: torch.nn.Module, optimizer: torch.optim.Optimizer, **muon_kwargs: Any) -> MuonSplit:
    """Move :func:`muon_parameters` of ``model`` from ``optimizer`` to a new ``torch.optim.Muon``; both as one optimizer.

    ``optimizer`` keeps everything else with its own hyper-parameters (it is changed in place, so a
    scheduler built on it keeps scheduling it); ``muon_kwargs`` are ``torch.optim.Muon``'s. Call it
    before the optimizer has state (before the first step).
    """
    torch_versions.require(torch_versions.MUON, "Muon (torch.optim.Muon)", _FIX)
    chosen = [p for _, p in muon_parameters(model)]
    moving = {id(p) for p in chosen}
    owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [name for name, p in muon_parameters(model) if id(p) not in owned]
    if missing:
        raise ValueError(
            f"Muon would train {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}, but the optimizer does not "
            "hold them; Muon takes over weights your optimizer trains (frozen weights stay frozen)."
        )
    if not chosen:
        raise ValueError(
            f"Muon found no hidden weight matrix in {type(model).__name__}: it trains the 2-D weights of the nn.Linear "
            "layers other than the output layer and embeddings, and this model has none."
        )
    if optimizer.state:
        raise ValueError("apply_muon needs an optimizer that has not stepped yet (its state would be split).")
    for group in optimizer.param_groups:
        group["params"] = [p for p in group["params"] if id(p) not in moving]
    muon = torch.optim.Muon(chosen, **muon_kwargs)  # type: ignore[attr-defined]
    return MuonSplit(optimizer, muon)


class Muon(Algorithm):
    """Train the hidden weight matrices with ``torch.optim.Muon``, the rest with the user's own optimizer.

    At ``FIT_START`` the optimizer the user's (unchanged) ``configure_optimizers`` built is split:
    :func:`muon_parameters` (every ``nn.Linear``'s 2-D weight but the output layer and embeddings)
    go to a ``torch.optim.Muon`` with these arguments; everything else (embeddings, the head, norms,
    biases, convolutions) stays with the user's optimizer and its hyper-parameters. The two run as
    one :class:`MuonSplit`, which Lightning steps and checkpoints (both states; resumption is exact).
    The user's LR scheduler keeps scheduling: Muon's ``lr`` follows the same factor. Under DDP every
    rank holds whole matrices and the same averaged gradients, so ranks stay equal; FSDP2 (sharded
    matrices) is refused: the orthogonalisation needs whole matrices. Needs torch >= 2.9.

    Args: ``torch.optim.Muon``'s, with its names and defaults (torch 2.9-2.13): ``lr=1e-3``,
    ``weight_decay=0.1``, ``momentum=0.95``, ``nesterov=True``, ``ns_coefficients=(3.4445, -4.775, 2.0315)``,
    ``eps=1e-7``, ``ns_steps=5``, ``adjust_lr_fn=None`` (``"original"`` or ``"match_rms_adamw"``).

    Examples:
        >>> Muon(lr=0.02)
        Muon(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-07, ns_steps=5, adjust_lr_fn=None)
    """

    unique = True
    owns_optimizer = True

    def __init__(
        self,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315),
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
    ) -> None:
        self.lr = lr
        self.weight_decay = weight_decay
        self.momentum = momentum
        self.nesterov = nesterov
        self.ns_coefficients = ns_coefficients
        self.eps = eps
        self.ns_steps = ns_steps
        self.adjust_lr_fn = adjust_lr_fn
        for name, value, low, high in (("lr", lr, 0.0, None), ("weight_decay", weight_decay, 0.0, None),
                                       ("momentum", momentum, 0.0, 1.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or (high and value >= high):
                allowed = f"in [{low}, {high})" if high else f">= {low}"
                raise ValueError(f"Muon({name}={value!r}): must be a number {allowed}, as torch.optim.Muon's.")
        if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or ns_steps < 1:
            raise ValueError(f"Muon(ns_steps={ns_steps!r}): must be an int >= 1 (Newton-Schulz iterations), e.g. 5.")
        if hasattr(torch.optim, "Muon"):  # let torch check the rest of its own arguments now, not at setup
            try:
                torch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))], **self.hparams())
            except (ValueError, TypeError) as error:
                raise ValueError(f"{self!r}: {error}") from None

    def finds_nothing_in(self, model: torch.nn.Module) -> str | None:
        if muon_parameters(model):
            return None
        return (f"Muon finds no hidden weight matrix in {type(model).__name__} (only the 2-D weights of nn.Linear "
                "layers other than the output layer and embeddings go to Muon)")

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.INIT, Event.FIT_START)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.INIT:
            torch_versions.require(torch_versions.MUON, "Muon (torch.optim.Muon)", _FIX)
            check_owners(state.algorithms)
            closures = declaring(state.algorithms, "needs_optimizer_closure")
            if closures:
                raise ValueError(
                    f"Muon and {type(closures[0]).__name__} cannot run together: {type(closures[0]).__name__} wraps the "
                    "optimizer to evaluate its closure twice, and Muon replaces that optimizer by two; which one wraps "
                    "the other would depend on their order. Use one of them."
                )
            return
        if any(is_dtensor(p) for p in state.model.parameters()):
            raise ValueError(
                "Muon cannot train a model sharded by FSDP2 (ModelParallelStrategy / fully_shard): it orthogonalises "
                "each weight matrix whole, and each rank holds only a shard. Use DDP (strategy='ddp'), or remove Muon."
            )
        if len(state.optimizers) != 1:
            raise ValueError(
                f"Muon takes over one optimizer; configure_optimizers returned {len(state.optimizers)}. Return one "
                "optimizer (Muon splits it), or remove Muon."
            )
        state.optimizers = [apply_muon(state.model, state.optimizers[0], **self.hparams())]
