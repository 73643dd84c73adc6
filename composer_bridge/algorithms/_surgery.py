"""Model surgery: swap modules by class or predicate, keep devices and dtypes, fix optimizers.

Every surgery algorithm (BlurPool, SqueezeExcite, Factorize, ...) is a *policy*: a mapping from
a module class (or a predicate ``module -> bool``) to a replacement function
``(module, index) -> new_module | None``. :func:`replace_modules` walks the model, calls the
first policy that matches each module, and puts the returned module in its place:

- ``None`` leaves the module alone (the walk continues into its children);
- a *different* module replaces it everywhere the old one was attached (shared modules stay
  shared); the replacement is moved to the old module's device and floating dtype, and the walk
  does not go inside it (so surgery never recurses into its own output);
- the *same* module means "changed in place" (e.g. a buffer added); the walk goes on into its
  children, which is how a policy on a whole model and one on its layers compose.

``index`` counts the modules each policy key has matched so far, in walk order (pre-order,
registration order), so a policy can vary with depth (StochasticDepth's linear drop rates).

Surgery normally runs before optimizers exist (the bridge runs it at ``Event.INIT``). When you
call it after creating one, pass ``optimizers=``: parameters that left the model are removed from
their param group (and their optimizer state dropped), and new trainable parameters join the
group that held the replaced module's parameters.

Examples:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> done = replace_modules(model, {nn.ReLU: lambda m, i: nn.GELU()})
    >>> [r.name for r in done], type(model[1]).__name__
    (['1'], 'GELU')
    >>> wide = lambda m: isinstance(m, nn.Linear) and m.out_features == 4
    >>> done = replace_modules(model, {wide: lambda m, i: nn.Linear(4, 4, bias=False)}, optimizers=opt)
    >>> len(done), sum(p.numel() for p in opt.param_groups[0]["params"])
    (1, 26)
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from composer_bridge.algorithms._sharding import sharding_kind
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = [
    "NoEffectWarning",
    "PolicyKey",
    "Replacement",
    "ReplacementFunction",
    "SurgeryAlgorithm",
    "as_optimizer_list",
    "disable_fused_transformer_paths",
    "replace_modules",
    "warn_no_effect",
]

ReplacementFunction = Callable[[nn.Module, int], nn.Module | None]
PolicyKey = type | Callable[[nn.Module], bool]
Optimizers = torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None


class NoEffectWarning(UserWarning):
    """A surgery found nothing to change in the model."""


@dataclass
class Replacement:
    """One module swapped (or, when ``new is old``, changed in place) by :func:`replace_modules`."""

    name: str
    old: nn.Module
    new: nn.Module
    old_parameters: list[nn.Parameter] = field(default_factory=list, repr=False)

    @property
    def in_place(self) -> bool:
        return self.new is self.old


def as_optimizer_list(optimizers: Optimizers) -> list[torch.optim.Optimizer]:
    """``optimizers`` as a list (``None`` → ``[]``), with a clear error for anything else."""
    if optimizers is None:
        return []
    items = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
    for item in items:
        if not isinstance(item, torch.optim.Optimizer):
            raise TypeError(
                f"optimizers must be a torch.optim.Optimizer or a list of them, got {type(item).__name__}: {item!r}."
            )
    return items


def _matches(key: PolicyKey, module: nn.Module) -> bool:
    if isinstance(key, type):
        return isinstance(module, key)
    return bool(key(module))


def _placement(module: nn.Module) -> tuple[torch.device | None, torch.dtype | None]:
    """The device and floating dtype of ``module``'s tensors (``None`` where it has none)."""
    device = dtype = None
    for tensor in (*module.parameters(), *module.buffers()):
        device = device or tensor.device
        if tensor.is_floating_point():
            return tensor.device, tensor.dtype
    return device, dtype


def _check_policies(policies: Mapping[PolicyKey, ReplacementFunction]) -> None:
    if not isinstance(policies, Mapping):
        raise TypeError(
            f"policies must be a mapping {{module class or predicate: replacement function}}, got "
            f"{type(policies).__name__}."
        )
    for key, fn in policies.items():
        if not (isinstance(key, type) and issubclass(key, nn.Module)) and (isinstance(key, type) or not callable(key)):
            raise TypeError(
                f"policy key {key!r} must be an nn.Module subclass or a predicate function module -> bool."
            )
        if not callable(fn):
            raise TypeError(
                f"the replacement for {getattr(key, '__name__', key)!r} must be a function (module, index) -> "
                f"module or None, got {fn!r}."
            )


def replace_modules(
    model: nn.Module,
    policies: Mapping[PolicyKey, ReplacementFunction],
    *,
    optimizers: Optimizers = None,
    skip: tuple[type, ...] = (),
) -> list[Replacement]:
    """Apply ``policies`` to every module of ``model`` (see the module docstring); return what changed.

    Args:
        model: the model to change in place. Its root may only be changed in place.
        policies: ``{class or predicate: fn(module, index) -> replacement or None}``; the first
            matching key whose function returns a module wins.
        optimizers: optimizers already built over ``model``'s parameters, to keep in step.
        skip: module classes left alone together with everything inside them (typically the
            classes the surgery produces, which makes applying it twice the same as once).

    Returns:
        One :class:`Replacement` per module swapped or changed in place; ``len()`` is the count.
    """
    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise TypeError(
            "Surgery cannot change a model already wrapped in DistributedDataParallel: DDP has registered its "
            "parameters. Apply it to model.module before wrapping (the bridge does this at Event.INIT)."
        )
    check_not_sharded(model, "replace_modules")
    _check_policies(policies)
    opts = as_optimizer_list(optimizers)
    counters: dict[Any, int] = {}
    seen: dict[int, nn.Module] = {}  # id(original child) -> what now stands in its place
    done: list[Replacement] = []
    default_device, default_dtype = _placement(model)

    def policy_for(module: nn.Module, name: str) -> nn.Module | None:
        for key, fn in policies.items():
            if not _matches(key, module):
                continue
            index = counters.get(key, 0)
            counters[key] = index + 1
            before = list(module.parameters())
            new = fn(module, index)
            if new is None:
                continue
            if not isinstance(new, nn.Module):
                raise TypeError(
                    f"The replacement function for {getattr(key, '__name__', key)!r} returned {type(new).__name__} "
                    f"for module {name or '<root>'}; it must return an nn.Module or None."
                )
            if new is not module:
                device, dtype = _placement(module)
                device, dtype = device or default_device, dtype or default_dtype
                if device is not None:
                    new.to(device=device)
                if dtype is not None:
                    new.to(dtype=dtype)
                new.train(module.training)
            done.append(Replacement(name, module, new, before))
            return new
        return None

    def walk(module: nn.Module, prefix: str) -> None:
        # Not named_children(): it lists a module attached twice to one parent (nn.Sequential(a, b, a))
        # only once, which would leave the second attachment pointing at the replaced module.
        for name, child in list(module._modules.items()):
            if child is None:
                continue
            if id(child) in seen:  # a module attached in several places: keep them the same object
                if seen[id(child)] is not child:
                    setattr(module, name, seen[id(child)])
                continue
            qualified = f"{prefix}{name}"
            seen[id(child)] = child
            if isinstance(child, skip):
                continue
            new = policy_for(child, qualified)
            if new is not None and new is not child:
                seen[id(child)] = new
                setattr(module, name, new)
                continue
            walk(child, qualified + ".")

    if not isinstance(model, skip):
        root = policy_for(model, "")
        if root is not None and root is not model:
            raise ValueError(
                f"A surgery policy returned a new module for the model itself ({type(model).__name__}); surgery "
                "changes models in place, so a policy on the root class must modify it and return it unchanged."
            )
        walk(model, "")
    if opts and done:
        _update_optimizers(model, opts, done)
    return done


def check_not_sharded(model: nn.Module, who: str) -> None:
    """Refuse surgery on a model FSDP2 already sharded (``fully_shard``: ``FSDPModule``s, ``DTensor`` parameters).

    A replaced module would hold ordinary parameters that FSDP never gathers or reduces, and the
    modules it replaces would keep their shards: training would silently diverge between ranks.
    """
    kind = sharding_kind(model)
    if kind is not None:
        raise RuntimeError(
            f"{who} cannot change the model: it is already sharded ({kind}). Surgery must run before sharding: "
            "with Lightning's ModelParallelStrategy, apply fully_shard in LightningModule.configure_model (the "
            "bridge runs surgery at Event.INIT, in Callback.setup, before configure_model), not in __init__ or "
            "before fit; or apply the surgery yourself before fully_shard."
        )


def _position(param: torch.Tensor, opts: list[torch.optim.Optimizer]) -> tuple[int, int] | None:
    for i, opt in enumerate(opts):
        for j, group in enumerate(opt.param_groups):
            if any(p is param for p in group["params"]):
                return i, j
    return None


def _update_optimizers(model: nn.Module, opts: list[torch.optim.Optimizer], done: list[Replacement]) -> None:
    """Remove parameters that left ``model`` from ``opts`` and add the new trainable ones."""
    alive = {id(p) for p in model.parameters()}
    for replacement in done:
        home = next((pos for p in replacement.old_parameters if (pos := _position(p, opts)) is not None), None)
        gone = [p for p in replacement.old_parameters if id(p) not in alive]
        for opt in opts:
            for group in opt.param_groups:
                group["params"] = [p for p in group["params"] if not any(p is q for q in gone)]
            for p in gone:
                opt.state.pop(p, None)
        added = [
            p for p in replacement.new.parameters()
            if p.requires_grad and _position(p, opts) is None and id(p) in alive
        ]
        if not added:
            continue
        if home is None:
            if len(opts) == 1 and len(opts[0].param_groups) == 1:
                home = (0, 0)
            else:
                raise ValueError(
                    f"Surgery added parameters to {replacement.name or 'the model'} ({type(replacement.new).__name__}) "
                    "but the module it replaced had no parameter in any optimizer, and there are several optimizers "
                    "or param groups to choose from. Create the optimizers after the surgery, or add "
                    "the new parameters to the right group yourself."
                )
        opts[home[0]].param_groups[home[1]]["params"].extend(_unique(added))


def _unique(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for p in params:
        if not any(p is q for q in out):
            out.append(p)
    return out


def disable_fused_transformer_paths(model: nn.Module) -> None:
    """Turn off PyTorch's fused inference kernels for ``nn.TransformerEncoder(Layer)`` modules of ``model``.

    In evaluation without gradients those kernels read ``self_attn.in_proj_weight``,
    ``linear1.weight`` etc. directly instead of calling the sub-modules, so they would bypass (or
    crash on) a replaced attention or feed-forward layer. The layer checks
    ``activation_relu_or_gelu`` and the encoder ``use_nested_tensor`` before taking the fused path;
    clearing them keeps the ordinary, module-by-module path (same results, unfused speed).
    """
    for module in model.modules():
        if isinstance(module, nn.TransformerEncoderLayer):
            module.activation_relu_or_gelu = 0
        elif isinstance(module, nn.TransformerEncoder):
            module.use_nested_tensor = False


def warn_no_effect(algorithm: str, looked_for: str, stacklevel: int = 3, fix: str = "") -> None:
    """Warn that ``algorithm`` changed nothing, naming what it looked for (and ``fix``, what to do, if given).

    The warning points at the caller of the function that calls this one (raise ``stacklevel`` by one
    for each further level of library code in between).
    """
    advice = fix or f"Check the model (or {algorithm}'s thresholds) if you expected it to change."
    warnings.warn(
        NoEffectWarning(
            f"{algorithm} replaced no module: the model has no {looked_for}, or {algorithm} was already applied. "
            f"{advice}"
        ),
        stacklevel=stacklevel,
    )


class SurgeryAlgorithm(Algorithm):
    """Base for algorithms that change the model once, at ``Event.INIT``.

    Subclasses implement :meth:`surgery` (which calls their functional form and returns how many
    modules it replaced); this class runs it at ``INIT``, passes the run's optimizers (empty in
    the bridge: INIT comes before ``configure_optimizers``) and logs
    ``"<ClassName>/num_replaced"`` through the engine logger, plus the surgery counts Composer
    logs as hyper-parameters under Composer's keys (:meth:`surgery_hparams`; the bridge sends
    them to every Lightning logger's ``log_hyperparams``). A checkpoint written with a surgery
    algorithm needs it again when loaded (``required_on_load``).
    """

    unique = True
    #: Composer's ``log_hyperparameters`` key for the number of modules replaced, if it logs one.
    replaced_hparam_key: str | None = None

    @classmethod
    def required_on_load(cls) -> bool:
        return True

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    @abstractmethod
    def surgery(self, state: State) -> int:
        """Change ``state.model`` in place; return the number of modules replaced."""

    def surgery_hparams(self, state: State, replaced: int) -> dict[str, int]:
        """The counts to log with ``log_hyperparameters`` after the surgery, under Composer's keys.

        By default ``{replaced_hparam_key: replaced}`` when the class sets that key; override
        it where Composer logs other counts (e.g. per replaced module type).
        """
        return {self.replaced_hparam_key: replaced} if self.replaced_hparam_key else {}

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        check_not_sharded(state.model, type(self).__name__)
        replaced = self.surgery(state)
        logger.log_metrics({f"{type(self).__name__}/num_replaced": replaced})
        hparams = self.surgery_hparams(state, replaced)
        if hparams:
            logger.log_hyperparameters(hparams)
