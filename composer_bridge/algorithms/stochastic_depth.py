"""Stochastic Depth (Huang et al., 2016): randomly skip residual branches while training.

Each target residual block is wrapped in a :class:`StochasticBlock`. In ``"block"`` mode the
whole residual branch is skipped with probability ``drop_rate`` (one draw per block per
micro-batch: a shallower network for that step); in ``"sample"`` mode each sample's branch
output is zeroed with that probability. In evaluation the branch is scaled by ``1 - drop_rate``
(the expected value, as in the paper and Composer). With ``drop_distribution="linear"`` the rate
grows with depth, from ``drop_rate / n`` for the first block to ``drop_rate`` for the last.

Which blocks (the *policy*): :class:`composer_bridge.models.resnet.BasicBlock` is registered
(its ``residual(x)`` is the droppable branch, ``shortcut`` the identity path, ``relu`` the final
activation). torchvision's ResNet ``BasicBlock`` and ``Bottleneck`` (``target_layer_name``
``"BasicBlock"``, ``"Bottleneck"``, or Composer's ``"ResNetBottleneck"``) are recognised by class
name and layout (``conv1``/``bn1``/..., ``relu``, ``downsample``) without importing torchvision. Register your own with ``policy={MyBlock: fn}`` where
``fn(module, drop_rate, stochastic_method)`` returns the replacement, usually
``StochasticBlock(module, drop_rate, stochastic_method, residual=..., shortcut=..., activation=...)``,
and select it with ``target_layer_name="MyBlock"``.

Randomness comes from the run's generator (``state.generator("StochasticDepth")``), set on the
blocks before every training micro-batch, so resumed runs drop exactly the same blocks.

Examples:
    >>> import torch
    >>> from composer_bridge.models import ResNetCNN
    >>> net = ResNetCNN(widths=(8, 16), blocks_per_stage=2)
    >>> apply_stochastic_depth(net, drop_rate=0.2)
    4
    >>> [round(b.drop_rate, 2) for b in net.layers]
    [0.05, 0.1, 0.15, 0.2]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from composer_bridge.algorithms._policy_registry import check_policy
from composer_bridge.algorithms._schedule import schedule_point
from composer_bridge.algorithms._sharding import is_sharded
from composer_bridge.algorithms._surgery import SurgeryAlgorithm, replace_modules, warn_no_effect
from composer_bridge.core.event import Event
from composer_bridge.core.time import Time, TimeUnit
from composer_bridge.models.resnet import BasicBlock

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["StochasticBlock", "StochasticDepth", "StochasticDepthPolicy", "TorchvisionStyleStochasticBlock",
           "apply_stochastic_depth", "default_stochastic_depth_policy"]

#: ``fn(module, drop_rate, stochastic_method) -> replacement | None``.
StochasticDepthPolicy = Mapping[type, Callable[[nn.Module, float, str], "nn.Module | None"]]

_METHODS = ("block", "sample")
_DISTRIBUTIONS = ("uniform", "linear")


class StochasticBlock(nn.Module):
    """A residual block whose residual branch is dropped at random in training.

    ``forward(x) = activation(drop(block.<residual>(x)) + block.<shortcut>(x))``.

    Args:
        block: the residual block (kept as ``self.block``: its parameters are unchanged).
        drop_rate: probability of dropping the branch (``"block"``) or a sample's branch (``"sample"``).
        stochastic_method: ``"block"`` or ``"sample"``.
        residual: name of the block's method or sub-module computing the residual branch.
        shortcut: name of its identity/projection path, or ``None`` for the identity.
        activation: name of the activation applied after the sum, or ``None`` for none.
    """

    def __init__(
        self,
        block: nn.Module,
        drop_rate: float,
        stochastic_method: str = "block",
        residual: str = "residual",
        shortcut: str | None = "shortcut",
        activation: str | None = "relu",
    ) -> None:
        super().__init__()
        self._check_paths(block, residual, shortcut, activation)
        self.block = block
        self.drop_rate = float(drop_rate)
        self.base_drop_rate = float(drop_rate)
        self.stochastic_method = stochastic_method
        self.residual_name = residual
        self.shortcut_name = shortcut
        self.activation_name = activation
        self.generator: torch.Generator | None = None

    @staticmethod
    def _check_paths(block: nn.Module, residual: str, shortcut: str | None, activation: str | None) -> None:
        for role, name in (("residual", residual), ("shortcut", shortcut), ("activation", activation)):
            if name is not None and not callable(getattr(block, name, None)):
                raise ValueError(
                    f"StochasticBlock: {type(block).__name__} has no callable {name!r} for the {role} path; pass "
                    f"{role}=<the name of its attribute or method>" + ("" if role == "residual" else " or None") + "."
                )

    def extra_repr(self) -> str:
        return f"drop_rate={self.drop_rate:.4g}, stochastic_method={self.stochastic_method!r}"

    def _branch(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.block, self.residual_name)(x)

    def _identity(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.shortcut_name is None else getattr(self.block, self.shortcut_name)(x)

    def _activate(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.activation_name is None else getattr(self.block, self.activation_name)(x)

    def _dropped(self, identity: torch.Tensor) -> torch.Tensor:
        """The output when the whole branch is skipped."""
        return self._activate(identity)

    def _uniform(self, size: tuple[int, ...], device: torch.device) -> torch.Tensor:
        if self.generator is None:
            return torch.rand(size, device=device)
        return torch.rand(size, generator=self.generator, device=self.generator.device).to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self._identity(x)
        activation, branch = self._activate, self._branch
        if not self.training:
            return activation(branch(x) * (1.0 - self.drop_rate) + identity)
        if self.stochastic_method == "block":
            if self.drop_rate > 0 and bool(self._uniform((), torch.device("cpu")) < self.drop_rate):
                return self._dropped(identity)
            return activation(branch(x) + identity)
        out = branch(x)
        if self.drop_rate > 0:
            keep = self._uniform((out.shape[0],), out.device) >= self.drop_rate
            out = out * keep.to(out.dtype).view(-1, *([1] * (out.dim() - 1)))
        return activation(out + identity)


class TorchvisionStyleStochasticBlock(StochasticBlock):
    """:class:`StochasticBlock` for torchvision's ResNet ``BasicBlock`` and ``Bottleneck`` (and replicas).

    Such a block computes ``relu(bn_k(conv_k(... relu(bn1(conv1(x))))) + shortcut(x))`` with
    ``shortcut = downsample`` (or the identity when ``downsample`` is ``None``); ``k`` is 2 for a
    ``BasicBlock``, 3 for a ``Bottleneck``. The blocks are recognised by class name and by those
    attributes, so torchvision is never imported.
    """

    def __init__(self, block: nn.Module, drop_rate: float, stochastic_method: str = "block", depth: int = 2) -> None:
        self.depth = depth
        super().__init__(block, drop_rate, stochastic_method, residual="conv1", shortcut=None, activation="relu")

    def _branch(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for i in range(1, self.depth + 1):
            out = getattr(self.block, f"bn{i}")(getattr(self.block, f"conv{i}")(out))
            if i < self.depth:
                out = self.block.relu(out)
        return out

    def _identity(self, x: torch.Tensor) -> torch.Tensor:
        downsample = self.block.downsample
        return x if downsample is None else downsample(x)

    def _dropped(self, identity: torch.Tensor) -> torch.Tensor:
        # Composer's stochastic Bottleneck: the input itself, or relu(downsample(x)) with a projection.
        return identity if self.block.downsample is None else self.block.relu(identity)


def _torchvision_style(depth: int) -> Callable[[nn.Module], bool]:
    """A predicate: a module laid out like torchvision's ResNet block with ``depth`` convolutions."""
    layers = [f"{kind}{i}" for i in range(1, depth + 1) for kind in ("conv", "bn")] + ["relu"]

    def matches(module: nn.Module) -> bool:
        downsample = getattr(module, "downsample", False)
        return (
            not isinstance(module, (BasicBlock, StochasticBlock))
            and all(isinstance(getattr(module, name, None), nn.Module) for name in layers)
            and (downsample is None or isinstance(downsample, nn.Module))
            and not isinstance(getattr(module, f"conv{depth + 1}", None), nn.Module)
        )

    return matches


def _torchvision_style_fn(depth: int) -> Callable[[nn.Module, float, str], nn.Module]:
    return lambda block, rate, method: TorchvisionStyleStochasticBlock(block, rate, method, depth)


# Blocks recognised by class name and layout: {target_layer_name: (names of the block class, depth)}.
# Composer's own name for torchvision's Bottleneck is "ResNetBottleneck".
_TORCHVISION_STYLE = {"BasicBlock": (("BasicBlock",), 2), "Bottleneck": (("Bottleneck",), 3),
                      "ResNetBottleneck": (("Bottleneck",), 3)}


def default_stochastic_depth_policy() -> dict[type, Callable[[nn.Module, float, str], nn.Module | None]]:
    """A fresh copy of the block classes StochasticDepth knows: the ResNet :class:`BasicBlock`.

    torchvision's ``BasicBlock`` and ``Bottleneck`` (``target_layer_name="BasicBlock"``,
    ``"Bottleneck"`` or Composer's ``"ResNetBottleneck"``) are recognised by their name and layout
    as well, without importing torchvision (see :class:`TorchvisionStyleStochasticBlock`).
    """
    return {BasicBlock: lambda block, rate, method: StochasticBlock(block, rate, method)}


def _policy(target_layer_name: str, policy: StochasticDepthPolicy | None) -> dict[type, Callable[..., Any]]:
    check_policy(policy, "StochasticDepth", "block class: fn", "fn(module, drop_rate, stochastic_method)")
    known = {**default_stochastic_depth_policy(), **dict(policy or {})}
    chosen: dict[Any, Callable[..., Any]] = {cls: fn for cls, fn in known.items() if cls.__name__ == target_layer_name}
    if target_layer_name in _TORCHVISION_STYLE:
        names, depth = _TORCHVISION_STYLE[target_layer_name]
        layout = _torchvision_style(depth)
        registered = tuple(chosen)

        def torchvision_block(module: nn.Module) -> bool:
            return type(module).__name__ in names and not isinstance(module, registered) and layout(module)

        chosen[torchvision_block] = _torchvision_style_fn(depth)
    if not chosen:
        raise ValueError(
            f"StochasticDepth(target_layer_name={target_layer_name!r}): no registered block class has that name "
            f"(registered: {sorted({c.__name__ for c in known} | set(_TORCHVISION_STYLE))}). Register yours with "
            "policy={YourBlock: fn} and pass target_layer_name='YourBlock'."
        )
    return chosen


def _matches(key: Any, module: nn.Module) -> bool:
    return isinstance(module, key) if isinstance(key, type) else bool(key(module))


def _check(stochastic_method: str, drop_rate: float, drop_distribution: str) -> None:
    if stochastic_method not in _METHODS:
        raise ValueError(f"StochasticDepth(stochastic_method={stochastic_method!r}): must be one of {_METHODS}.")
    if isinstance(drop_rate, bool) or not isinstance(drop_rate, (int, float)) or not 0 <= drop_rate <= 1:
        raise ValueError(f"StochasticDepth(drop_rate={drop_rate!r}): must be a probability in [0, 1] (default 0.2).")
    if drop_distribution not in _DISTRIBUTIONS:
        raise ValueError(f"StochasticDepth(drop_distribution={drop_distribution!r}): must be one of {_DISTRIBUTIONS}.")


def apply_stochastic_depth(
    model: nn.Module,
    target_layer_name: str = "BasicBlock",
    stochastic_method: str = "block",
    drop_rate: float = 0.2,
    drop_distribution: str = "linear",
    policy: StochasticDepthPolicy | None = None,
    generator: torch.Generator | None = None,
) -> int:
    """Wrap ``model``'s residual blocks of class ``target_layer_name`` in stochastic versions, in place.

    Args:
        model: the model to change.
        target_layer_name: the class name of the blocks to convert (registered in the policy).
        stochastic_method: ``"block"`` (skip whole branches) or ``"sample"`` (per sample).
        drop_rate: the drop probability (of the deepest block with ``"linear"``).
        drop_distribution: ``"linear"`` (grows with depth) or ``"uniform"``.
        policy: extra ``{block class: fn(module, drop_rate, stochastic_method)}`` entries.
        generator: where the drops are drawn from (default: the global generator).

    Returns:
        The number of blocks converted (a warning is raised when it is zero).

    The block parameters are kept, so optimizers stay valid. In ``"block"`` mode some parameters
    get no gradient in a step: DDP needs ``find_unused_parameters=True`` (the algorithm class
    says so to the bridge).
    """
    _check(stochastic_method, drop_rate, drop_distribution)
    chosen = _policy(target_layer_name, policy)
    wrapped = {id(m.block) for m in model.modules() if isinstance(m, StochasticBlock)}

    def target(module: nn.Module) -> bool:
        return any(_matches(key, module) for key in chosen)

    count = sum(1 for m in model.modules() if id(m) not in wrapped and not isinstance(m, StochasticBlock) and target(m))

    def rate(index: int) -> float:
        return drop_rate * (index + 1) / count if drop_distribution == "linear" else drop_rate

    def convert(module: nn.Module, index: int) -> nn.Module | None:
        # one predicate for all target classes, so that depth is counted across them
        fn = next(fn for key, fn in chosen.items() if _matches(key, module))
        return fn(module, rate(index), stochastic_method)

    done = replace_modules(model, {target: convert}, skip=(StochasticBlock,))
    for replacement in done:
        if isinstance(replacement.new, StochasticBlock):
            replacement.new.generator = generator
    if not done:
        warn_no_effect("StochasticDepth", f"{target_layer_name} block")
    return len(done)


class StochasticDepth(SurgeryAlgorithm):
    """Stochastic depth for residual blocks: surgery at ``INIT``, drops while training.

    Args:
        target_layer_name: class name of the blocks to convert (Composer requires this argument;
            here it defaults to the registered ``"BasicBlock"``).
        stochastic_method: ``"block"`` or ``"sample"`` (see :func:`apply_stochastic_depth`).
        drop_rate: the drop probability (of the deepest block with ``"linear"``).
        drop_distribution: ``"linear"`` or ``"uniform"``.
        drop_warmup: ramp the drop rate linearly from 0 over this long (a fraction of the run,
            or ``"0.1dur"``, ``"2ep"``, ``"100ba"``); only with ``"block"`` (as in Composer).
        policy: your own ``{block class: fn}`` entries (see the module docs).
        same_on_every_rank: drop the same blocks on every rank. ``None`` (default): only when the
            model is sharded (FSDP2, ``fully_shard``), where each block's parameters are gathered by
            a collective that every rank must join, so all ranks must run the same blocks; under
            DDP each rank draws its own drops, as Composer does.

    In ``"block"`` mode ``find_unused_parameters`` is true, so the bridge configures DDP for it.

    Examples:
        >>> StochasticDepth(drop_rate=0.1)  # doctest: +NORMALIZE_WHITESPACE
        StochasticDepth(target_layer_name='BasicBlock', stochastic_method='block', drop_rate=0.1,
                        drop_distribution='linear', drop_warmup=0.0, policy=None, same_on_every_rank=None)
    """

    def __init__(
        self,
        target_layer_name: str = "BasicBlock",
        stochastic_method: str = "block",
        drop_rate: float = 0.2,
        drop_distribution: str = "linear",
        drop_warmup: float | str | Time = 0.0,
        policy: StochasticDepthPolicy | None = None,
        same_on_every_rank: bool | None = None,
    ) -> None:
        _check(stochastic_method, drop_rate, drop_distribution)
        if same_on_every_rank not in (None, True, False):
            raise TypeError(f"StochasticDepth(same_on_every_rank={same_on_every_rank!r}): must be None, True or False.")
        _policy(target_layer_name, policy)
        # A warm-up may outlast the run (the drop rate then never reaches drop_rate), as before.
        self._warmup = schedule_point(drop_warmup, "drop_warmup", "StochasticDepth", at_most_one_run=False)
        if stochastic_method == "sample" and float(self._warmup.value) > 0:
            raise ValueError(
                f"StochasticDepth(drop_warmup={drop_warmup!r}) only works with stochastic_method='block' (as in "
                "Composer); use drop_warmup=0 with 'sample'."
            )
        self.target_layer_name = target_layer_name
        self.stochastic_method = stochastic_method
        self.drop_rate = drop_rate
        self.drop_distribution = drop_distribution
        self.drop_warmup = drop_warmup
        self.policy = policy
        self.same_on_every_rank = same_on_every_rank

    @property  # type: ignore[override]
    def find_unused_parameters(self) -> bool:
        return self.stochastic_method == "block"

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.INIT, Event.AFTER_DATALOADER) or (
            event == Event.BATCH_START and float(self._warmup.value) > 0
        )

    def surgery(self, state: State) -> int:
        return apply_stochastic_depth(
            state.model, self.target_layer_name, self.stochastic_method, self.drop_rate, self.drop_distribution,
            self.policy,
        )

    def _blocks(self, state: State) -> list[StochasticBlock]:
        return [m for m in state.model.modules() if isinstance(m, StochasticBlock)]

    @property
    def needs_run_length(self) -> bool:
        """Whether the drop-rate warm-up is a fraction of the run (the bridge then needs its length at setup)."""
        return float(self._warmup.value) > 0 and self._warmup.unit == TimeUnit.DURATION

    def _warmup_fraction(self, state: State) -> float:
        warmup = self._warmup
        if float(warmup.value) <= 0:
            return 1.0
        if warmup.unit == TimeUnit.DURATION:
            elapsed = state.get_elapsed_duration()
            done = float(elapsed.value) if elapsed is not None else 1.0
        else:
            done = float(state.timestamp.get(warmup.unit).value)
        return min(done / float(warmup.value), 1.0)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.INIT:
            super().apply(event, state, logger)
        elif event == Event.BATCH_START:
            factor = self._warmup_fraction(state)
            for block in self._blocks(state):
                block.drop_rate = block.base_drop_rate * factor
            logger.log_metrics({"StochasticDepth/drop_rate": self.drop_rate * factor})
        else:
            device = torch.device("cpu") if self.stochastic_method == "block" else state.device
            shared = self.same_on_every_rank
            if shared is None:  # a sharded model: every rank must run the same blocks (FSDP2 gathers per block)
                shared = self.stochastic_method == "block" and is_sharded(state.model)
            generator = state.generator(type(self).__name__, device, same_on_every_rank=shared)
            for block in self._blocks(state):
                block.generator = generator
