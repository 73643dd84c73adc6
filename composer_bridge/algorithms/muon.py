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

from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

import torch

from composer_bridge.algorithms._muon_variants import MuonVariants, resolve_coefficients
from composer_bridge.algorithms._sharding import is_dtensor
from composer_bridge.core import torch_versions
from composer_bridge.core.algorithm import Algorithm, check_owners, declaring
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State

__all__ = ["LAYOUTS", "Muon", "MuonSplit", "apply_muon", "as_matrix", "muon_matrices", "muon_parameters"]

_FIX = "upgrade torch (pip install 'torch>=2.9'), or remove Muon"


#: How Muon sees a weight as a matrix: as it is (``nn.Linear``: out x in), transposed (transformers'
#: ``Conv1D``, stored in x out) or flattened (a convolution's filters, out x in*k...).
LAYOUTS = ("linear", "transposed", "flattened")


def _is_hf_conv1d(module: torch.nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2's layers), recognised without importing transformers: a 2-D weight ``(in, nf)``."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and isinstance(getattr(module, "nf", None), int)
            and isinstance(weight, torch.Tensor) and weight.ndim == 2 and weight.shape[1] == module.nf)


def muon_matrices(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter, str]]:
    """``(name, weight, layout)`` of every weight Muon trains, with how it is seen as a matrix (:data:`LAYOUTS`).

    The hidden layers: every ``nn.Linear`` but the output layer, transformers' ``Conv1D`` (GPT-2; seen
    transposed, so that it is the ``out x in`` matrix an ``nn.Linear`` of the same layer would hold), and
    every convolution but the input layer (``nn.Conv1d``/``2d``/``3d``, filters flattened to
    ``out x (in/groups * kernel)``, as the CIFAR-10 speedrun does). Left with the user's optimizer: the
    output layer (the *last* ``nn.Linear`` the model registers: ``lm_head``, ``head``, ``fc``), the input
    layer of a conv net (the *first* convolution it registers: the stem, as embeddings are the input
    layer of a language model), embeddings and any weight tied to one, and frozen weights.

    Examples:
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Conv2d(4, 8, 3), torch.nn.Flatten(),
        ...                           torch.nn.Linear(8, 2))
        >>> [(name, layout) for name, _, layout in muon_matrices(net)]  # the stem (0) and the head (3) stay
        [('1.weight', 'flattened')]
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    modules = list(model.named_modules())
    linears = [name for name, m in modules if isinstance(m, torch.nn.Linear)]
    convs = [name for name, m in modules if isinstance(m, torch.nn.modules.conv._ConvNd)]
    output = linears[-1] if linears else None
    stem = convs[0] if convs else None
    chosen: list[tuple[str, torch.nn.Parameter, str]] = []
    seen: set[int] = set()
    for name, module in modules:
        if isinstance(module, torch.nn.Linear) and name != output:
            layout = "linear"
        elif _is_hf_conv1d(module):
            layout = "transposed"
        elif isinstance(module, torch.nn.modules.conv._ConvNd) and name != stem:
            layout = "flattened"
        else:
            continue
        weight = module.weight
        expected = 2 if layout != "flattened" else weight.ndim
        if (weight.ndim != expected or weight.ndim < 2 or not weight.requires_grad or id(weight) in embeddings
                or id(weight) in seen):
            continue
        seen.add(id(weight))
        chosen.append((f"{name}.weight" if name else "weight", weight, layout))
    return chosen


def muon_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The weights Muon trains (:func:`muon_matrices`): the hidden layers' weights, not the input or output layer.

    The output layer is the *last* ``nn.Linear`` the model registers (``lm_head``, ``head``, ``fc``,
    ``classifier``: where language models and classifiers put it); a Linear whose weight is an
    ``nn.Embedding``'s (a tied head, or a tied input projection) is left out too. Frozen weights
    (``requires_grad=False``) are left where they are.
    """
    return [(name, weight) for name, weight, _ in muon_matrices(model)]


def as_matrix(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """``tensor`` (a weight or its gradient) seen as Muon's matrix: a view, so writing to it writes the weight.

    Examples:
        >>> as_matrix(torch.zeros(8, 4, 3, 3), "flattened").shape, as_matrix(torch.zeros(5, 7), "transposed").shape
        (torch.Size([8, 36]), torch.Size([7, 5]))
    """
    if layout == "transposed":
        return tensor.t()
    if layout == "flattened":
        return tensor.view(tensor.shape[0], -1)
    return tensor


class _MatrixView:
    """A weight Muon cannot take as it is, and the 2-D parameter it steps in its place (sharing the weight's memory).

    The stand-in's gradient is a view of the weight's, set after each backward (so clipping sees it) and
    again before each step; zeroing the optimizer clears the weight's gradient too.
    """

    def __init__(self, weight: torch.nn.Parameter, layout: str) -> None:
        self.weight, self.layout = weight, layout
        self.matrix = torch.nn.Parameter(as_matrix(weight.detach(), layout))
        self.hook = weight.register_post_accumulate_grad_hook(lambda _: self.sync())

    def sync(self) -> None:
        grad = self.weight.grad
        self.matrix.grad = None if grad is None else as_matrix(grad, self.layout)

    def zero(self, set_to_none: bool) -> None:
        if self.weight.grad is None:
            return
        if set_to_none:
            self.weight.grad = None
        else:
            self.weight.grad.zero_()
        self.sync()


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

    def __init__(self, optimizer: torch.optim.Optimizer, muon: torch.optim.Optimizer,
                 views: list[_MatrixView] | None = None) -> None:
        self.optimizer = optimizer
        self.muon = muon
        self._views = list(views or [])
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
        for view in self._views:
            view.sync()
        self.optimizer.step()
        self.muon.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self.muon.zero_grad(set_to_none=set_to_none)
        for view in self._views:
            view.zero(set_to_none)

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
    matrices = muon_matrices(model)
    chosen = [p for _, p, _ in matrices]
    moving = {id(p) for p in chosen}
    owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [name for name, p, _ in matrices if id(p) not in owned]
    if missing:
        raise ValueError(
            f"Muon would train {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}, but the optimizer does not "
            "hold them; Muon takes over weights your optimizer trains (frozen weights stay frozen)."
        )
    if not chosen:
        raise ValueError(
            f"Muon found no hidden weight matrix in {type(model).__name__}: it trains the weights of the hidden "
            "nn.Linear, transformers Conv1D and convolution layers (not the output layer, the first convolution or "
            "embeddings), and this model has none."
        )
    if optimizer.state:
        raise ValueError("apply_muon needs an optimizer that has not stepped yet (its state would be split).")
    for group in optimizer.param_groups:
        group["params"] = [p for p in group["params"] if id(p) not in moving]
    views = [_MatrixView(p, layout) for _, p, layout in matrices if layout != "linear"]
    stand_in = {id(v.weight): v.matrix for v in views}
    muon = muon_optimizer([stand_in.get(id(p), p) for p in chosen], **muon_kwargs)
    return MuonSplit(optimizer, muon, views)


#: The options of Muon's variants (:mod:`composer_bridge.algorithms._muon_variants`), off by default.
VARIANT_DEFAULTS = {"normuon": False, "normuon_beta2": 0.95, "cautious_weight_decay": False}


def muon_optimizer(params: list[torch.Tensor], **kwargs: Any) -> torch.optim.Optimizer:
    """``torch.optim.Muon`` itself, or :class:`MuonVariants` where a variant is asked for (Polar Express
    coefficients or another sequence of them, NorMuon, cautious weight decay)."""
    variants = {k: kwargs.pop(k) for k in list(kwargs) if k in VARIANT_DEFAULTS}
    coefficients = kwargs.get("ns_coefficients", (3.4445, -4.775, 2.0315))
    plain = (not isinstance(coefficients, str) and len(coefficients) == 3
             and all(isinstance(c, (int, float)) for c in coefficients))
    if plain and not any(variants.get(k, v) != v for k, v in VARIANT_DEFAULTS.items()):
        return torch.optim.Muon(params, **kwargs)  # type: ignore[attr-defined]
    return MuonVariants(params, **kwargs, **variants)


class Muon(Algorithm):
    """Train the hidden weight matrices with ``torch.optim.Muon``, the rest with the user's own optimizer.

    At ``FIT_START`` the optimizer the user's (unchanged) ``configure_optimizers`` built is split:
    :func:`muon_matrices` (the weights of the hidden ``nn.Linear``, transformers ``Conv1D`` and
    convolution layers, the last two seen as ``out x in`` matrices) go to a ``torch.optim.Muon`` with
    these arguments; everything else (embeddings, the output layer, the first convolution, norms,
    biases) stays with the user's optimizer and its hyper-parameters. The two run as
    one :class:`MuonSplit`, which Lightning steps and checkpoints (both states; resumption is exact).
    The user's LR scheduler keeps scheduling: Muon's ``lr`` follows the same factor. Under DDP every
    rank holds whole matrices and the same averaged gradients, so ranks stay equal; FSDP2 (sharded
    matrices) is refused: the orthogonalisation needs whole matrices. Needs torch >= 2.9.

    Args: ``torch.optim.Muon``'s, with its names and defaults (torch 2.9-2.13): ``lr=1e-3``,
    ``weight_decay=0.1``, ``momentum=0.95``, ``nesterov=True``, ``ns_coefficients=(3.4445, -4.775, 2.0315)``,
    ``eps=1e-7``, ``ns_steps=5``, ``adjust_lr_fn=None`` (``"original"`` or ``"match_rms_adamw"``); then
    the speedrun's variants, each off by default (:mod:`composer_bridge.algorithms._muon_variants`):
    ``ns_coefficients="polar_express"`` (or one triple per iteration), ``normuon=True`` (with
    ``normuon_beta2=0.95``), ``cautious_weight_decay=True``. With none of them the optimizer is
    ``torch.optim.Muon`` itself.

    Examples:
        >>> Muon(lr=0.02)
        Muon(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-07, ns_steps=5, adjust_lr_fn=None, normuon=False, normuon_beta2=0.95, cautious_weight_decay=False)
    """

    unique = True
    owns_optimizer = True

    def __init__(
        self,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] | Sequence[tuple[float, float, float]] | str = (3.4445, -4.775, 2.0315),
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        normuon: bool = False,
        normuon_beta2: float = 0.95,
        cautious_weight_decay: bool = False,
    ) -> None:
        self.lr = lr
        self.weight_decay = weight_decay
        self.momentum = momentum
        self.nesterov = nesterov
        self.ns_coefficients = ns_coefficients
        self.eps = eps
        self.ns_steps = ns_steps
        self.adjust_lr_fn = adjust_lr_fn
        self.normuon = normuon
        self.normuon_beta2 = normuon_beta2
        self.cautious_weight_decay = cautious_weight_decay
        for name, flag in (("normuon", normuon), ("cautious_weight_decay", cautious_weight_decay)):
            if not isinstance(flag, bool):
                raise ValueError(f"Muon({name}={flag!r}): must be True or False.")
        resolve_coefficients(ns_coefficients, ns_steps if isinstance(ns_steps, int) else 5)  # whatever torch this is
        if isinstance(normuon_beta2, bool) or not isinstance(normuon_beta2, (int, float)) or not 0 <= normuon_beta2 < 1:
            raise ValueError(f"Muon(normuon_beta2={normuon_beta2!r}): must be in [0, 1), e.g. 0.95.")
        for name, value, low, high in (("lr", lr, 0.0, None), ("weight_decay", weight_decay, 0.0, None),
                                       ("momentum", momentum, 0.0, 1.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or (high and value >= high):
                allowed = f"in [{low}, {high})" if high else f">= {low}"
                raise ValueError(f"Muon({name}={value!r}): must be a number {allowed}, as torch.optim.Muon's.")
        if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or ns_steps < 1:
            raise ValueError(f"Muon(ns_steps={ns_steps!r}): must be an int >= 1 (Newton-Schulz iterations), e.g. 5.")
        if hasattr(torch.optim, "Muon"):  # let torch check the rest of its own arguments now, not at setup
            try:
                muon_optimizer([torch.nn.Parameter(torch.zeros(2, 2))], **self.hparams())
            except (ValueError, TypeError) as error:
                raise ValueError(f"{self!r}: {error}") from None

    def finds_nothing_in(self, model: torch.nn.Module) -> str | None:
        if muon_parameters(model):
            return None
        return (f"Muon finds no hidden weight matrix in {type(model).__name__} (the weights of hidden nn.Linear, "
                "transformers Conv1D and convolution layers go to Muon; the output layer, the first convolution and "
                "embeddings do not)")

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
