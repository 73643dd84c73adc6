"""SelectiveBackprop: back-propagate only the examples the model finds hardest (Jiang et al., 2019).

Functional forms :func:`should_selective_backprop` (is this step a selective one?) and
:func:`select_using_loss` (an extra no-grad forward pass, then keep a loss-weighted random subset
of the batch). The :class:`SelectiveBackprop` algorithm prunes training micro-batches at
``AFTER_DATALOADER``; the default passes run it before every other algorithm.

The selection stays on the batch's device: examples are ranked by loss, and ``int(keep * N)`` of
them are drawn without replacement with probability growing with their rank (Composer's
weights), using the Gumbel-top-k trick, so no value is read back to the host.

Examples:
    >>> import torch
    >>> x, y = torch.arange(8.0).view(8, 1), torch.zeros(8)
    >>> def per_example_loss(outputs, target, reduction="none"):
    ...     return (outputs.squeeze(1) - target) ** 2
    >>> x_kept, y_kept = select_using_loss(x, y, lambda inputs: inputs, per_example_loss, keep=0.5,
    ...                                    generator=torch.Generator().manual_seed(0))
    >>> x_kept.shape
    torch.Size([4, 1])
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from composer_bridge.algorithms._schedule import elapsed_fraction, fraction_of_run, schedule_point
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.batch import BatchKey, set_batch_item
from composer_bridge.core.event import Event
from composer_bridge.core.loss_source import LossNotSeenYet
from composer_bridge.core.time import Time, TimeUnit

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["SelectiveBackprop", "select_using_loss", "should_selective_backprop"]

_INTERPOLATION = {3: "linear", 4: "bilinear", 5: "trilinear"}


def should_selective_backprop(
    current_duration: float,
    batch_idx: int,
    start: float = 0.5,
    end: float = 0.9,
    interrupt: int = 2,
) -> bool:
    """Whether to prune this batch: inside ``[start, end)`` of the run, and not an interrupting step.

    With ``interrupt = k > 0`` every ``k``-th batch of an epoch (``(batch_idx + 1) % k == 0``) is
    a plain full-batch step; ``interrupt = 0`` never interrupts.

    Examples:
        >>> tuple(should_selective_backprop(0.6, i, interrupt=2) for i in range(4))
        (True, False, True, False)
        >>> should_selective_backprop(0.95, 0)
        False
    """
    in_interval = start <= current_duration < end
    return in_interval and (interrupt == 0 or (batch_idx + 1) % interrupt != 0)


def _loss_weighted_choice(losses: torch.Tensor, keep: float, generator: torch.Generator | None) -> torch.Tensor:
    """Indices of ``int(keep * N)`` examples (at least one), drawn without replacement, favouring high losses.

    The example of loss rank ``r`` (0 = lowest of ``N``) has weight ``((r + 0.5) / N) ** (1 / keep - 1)``;
    adding Gumbel noise to the log-weights and taking the top ``k`` draws ``k`` of them one after
    another without replacement, in proportion to their weights (as ``numpy``'s ``choice`` does).
    """
    n = losses.shape[0]
    count = max(1, int(keep * n))
    order = torch.argsort(losses.detach().float())
    ranks = torch.arange(n, device=losses.device, dtype=torch.float32)
    log_weights = torch.log((ranks + 0.5) / n) * (1.0 / keep - 1.0)
    if generator is None:
        uniform = torch.rand(n, device=losses.device)
    else:
        uniform = torch.rand(n, generator=generator, device=generator.device).to(losses.device)
    gumbel = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(torch.float32).tiny)))
    chosen_ranks = torch.topk(log_weights + gumbel, count).indices
    return order[chosen_ranks]


def select_using_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    model: Callable[[torch.Tensor], Any],
    loss_fun: Callable[..., torch.Tensor],
    keep: float = 0.5,
    scale_factor: float = 1,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the part of a batch to back-propagate, favouring examples with a high loss.

    Runs ``model`` without gradients on ``input`` (downscaled by ``scale_factor`` for a cheaper
    pass), computes per-example losses with ``loss_fun(outputs, target, reduction='none')``, and
    keeps ``int(keep * N)`` examples (at least one) drawn without replacement, the example of loss
    rank ``r`` (0 = lowest) with weight ``((r + 0.5) / N) ** (1 / keep - 1)``.

    Args:
        input: ``(N, ...)`` inputs.
        target: ``(N, ...)`` targets.
        model: maps inputs to outputs.
        loss_fun: per-example loss; must take ``reduction='none'`` and return ``(N,)`` losses
            (extra dimensions are averaged).
        keep: fraction of the batch to keep, in ``(0, 1]``. Default ``0.5``.
        scale_factor: downscaling of ``(N, C, ...)`` inputs for the selection pass, in ``(0, 1]``.
        generator: the source of the draw (best on the batch's device).

    Returns:
        ``(input_kept, target_kept)``, full size, in the drawn order.

    Examples:
        >>> import torch
        >>> net = torch.nn.Linear(3, 2)
        >>> def loss(outputs, target, reduction="none"):
        ...     return torch.nn.functional.cross_entropy(outputs, target, reduction=reduction)
        >>> x, y = select_using_loss(torch.randn(10, 3), torch.randint(0, 2, (10,)), net, loss, keep=0.3)
        >>> x.shape, y.shape
        (torch.Size([3, 3]), torch.Size([3]))
    """
    chosen = _selected_examples(input, target, model, loss_fun, keep, scale_factor, generator)
    return input[chosen], target[chosen]


def _selected_examples(
    input: torch.Tensor,
    target: torch.Tensor,
    model: Callable[[torch.Tensor], Any],
    loss_fun: Callable[..., torch.Tensor],
    keep: float,
    scale_factor: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """The indices :func:`select_using_loss` keeps, in the drawn order."""
    _check_keep(keep, "select_using_loss")
    _check_scale(scale_factor, "select_using_loss")
    if not callable(loss_fun):
        raise TypeError(f"select_using_loss: loss_fun must be callable, got {type(loss_fun).__name__}.")
    if not _takes_reduction(loss_fun, unknown=True):
        name = getattr(loss_fun, "__qualname__", None) or type(loss_fun).__name__
        raise TypeError(
            f"select_using_loss: the loss function {name} must take a keyword argument `reduction`: it is called "
            "as loss_fun(outputs, target, reduction='none') and must then return one loss per example. Add the "
            "argument (def loss(outputs, target, reduction='none'): ...) or pass a loss that has it, such as "
            "torch.nn.functional.cross_entropy."
        )
    with torch.no_grad():
        losses = _per_example(loss_fun(model(_downscale(input, scale_factor)), target, reduction="none"), input)
        return _loss_weighted_choice(losses, keep, generator)


def _per_example_tensor(value: Any, input: torch.Tensor) -> bool:
    return isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape[0] == input.shape[0]


def _downscale(input: torch.Tensor, scale_factor: float) -> torch.Tensor:
    if scale_factor == 1:
        return input
    if input.ndim not in _INTERPOLATION:
        raise ValueError(
            f"scale_factor={scale_factor} downsamples (N, C, L), (N, C, H, W) or (N, C, D, H, W) inputs, got "
            f"shape {tuple(input.shape)}; use scale_factor=1."
        )
    return F.interpolate(input, scale_factor=scale_factor, mode=_INTERPOLATION[input.ndim],
                         align_corners=False, recompute_scale_factor=False)


def _per_example(losses: Any, input: torch.Tensor) -> torch.Tensor:
    if not isinstance(losses, torch.Tensor) or losses.ndim == 0 or losses.shape[0] != input.shape[0]:
        shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise ValueError(
            f"SelectiveBackprop needs one loss per example ({input.shape[0]},), got {shape}. The loss must not "
            "reduce over the batch: pass loss_fn=... returning per-example losses (e.g. "
            "functools.partial(torch.nn.functional.cross_entropy, reduction='none'))."
        )
    return losses.flatten(1).mean(1) if losses.ndim > 1 else losses


def _check_keep(keep: float, where: str) -> None:
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 < keep <= 1:
        raise ValueError(f"{where}(keep={keep!r}): the fraction of the batch to keep must be in (0, 1] (default 0.5).")


def _check_scale(scale_factor: float, where: str) -> None:
    if isinstance(scale_factor, bool) or not isinstance(scale_factor, (int, float)) or not 0 < scale_factor <= 1:
        raise ValueError(
            f"{where}(scale_factor={scale_factor!r}): the downscaling of the selection pass must be in (0, 1] "
            "(1 = full size, the default)."
        )


def _autocast(state: State, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The run's mixed-precision context, so the selection pass costs what the training forward costs."""
    precision = str(state.precision)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


class SelectiveBackprop(Algorithm):
    """Prune training micro-batches to the examples with the highest loss, in part of the run.

    At ``AFTER_DATALOADER``, when :func:`should_selective_backprop` says so (``start`` <= elapsed
    fraction of the run < ``end``, except every ``interrupt``-th batch of an epoch), the model
    runs once without gradients (in the run's mixed precision), and the inputs and targets are
    replaced by ``int(keep * N)`` examples chosen by :func:`select_using_loss`. Only the entries
    at ``input_key`` and ``target_key`` are pruned.

    Per-example losses come from, in order:

    1. ``loss_fn(outputs, targets)`` if given: it must return one loss per example, e.g.
       ``functools.partial(torch.nn.functional.cross_entropy, reduction="none")``;
    2. for a plain module (``state.loss_source`` set by the adapter), the loss its training step
       was seen to compute, with ``reduction="none"``, on ``module(inputs)``;
    3. the model's ``loss(outputs, batch, reduction="none")`` if its ``loss`` takes a
       ``reduction`` argument (Composer's convention);
    4. otherwise the model's ``loss(outputs, batch)`` evaluated per example with
       :func:`torch.func.vmap` over one-example batches: exact for any loss that averages (or
       sums) over examples, such as :class:`~composer_bridge.ComposerClassifier`'s.

    The model is called as ``model(batch)`` with the (downscaled) inputs in place, so it may read
    the whole batch, as a :class:`~composer_bridge.ComposerModule` does.

    Args:
        start: when pruning starts: a fraction of the run, or a time string (``"0.5dur"``,
            ``"5ep"``, ``"300ba"``). Default ``0.5``.
        end: when it stops (excluded), same forms. Default ``0.9``.
        keep: fraction of each batch kept, in ``(0, 1]``. Default ``0.5``.
        scale_factor: downscaling of the inputs for the selection pass, in ``(0, 1]``. Default ``1``.
        interrupt: every ``interrupt``-th batch of an epoch is a full step (0: never); an int or
            a batch count such as ``"2ba"``. Default ``2``.
        input_key: where the inputs are in the batch (index, dict key or ``(getter, setter)``).
        target_key: where the targets are in the batch.
        loss_fn: optional ``(outputs, targets) -> per-example losses`` (see above).

    Examples:
        >>> SelectiveBackprop(start="0.5dur", end=0.9, keep=0.5)
        SelectiveBackprop(start='0.5dur', end=0.9, keep=0.5, scale_factor=1.0, interrupt=2, input_key=0, \
target_key=1, loss_fn=None)
    """

    unique = True
    needs_run_length = True  # selects between fractions of the run (start, end)
    needs_loss_events = True
    runs_first = True

    def __init__(
        self,
        start: float | str = 0.5,
        end: float | str = 0.9,
        keep: float = 0.5,
        scale_factor: float = 1.0,
        interrupt: int | str = 2,
        input_key: BatchKey = 0,
        target_key: BatchKey = 1,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    ) -> None:
        where = "SelectiveBackprop"
        self._start = schedule_point(start, "start", where)
        self._end = schedule_point(end, "end", where)
        if self._start.unit == self._end.unit and self._start.value > self._end.value:
            raise ValueError(f"{where}(start={start!r}, end={end!r}): start must not come after end.")
        _check_keep(keep, where)
        _check_scale(scale_factor, where)
        self._interrupt = _interrupt_count(interrupt, where)
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(f"{where}(loss_fn={loss_fn!r}): must be a callable (outputs, targets) -> losses, or None.")
        self.start = start
        self.end = end
        self.keep = keep
        self.scale_factor = scale_factor
        self.interrupt = interrupt
        self.input_key = input_key
        self.target_key = target_key
        self.loss_fn = loss_fn
        self._told_unselected = False  # the warning for a step taken whole before the loss was known, given once

    def match(self, event: Event, state: State) -> bool:
        if event != Event.AFTER_DATALOADER or self.keep >= 1:
            return False
        where = type(self).__name__
        return should_selective_backprop(
            elapsed_fraction(state, where),
            int(state.timestamp.batch_in_epoch),
            fraction_of_run(self._start, state, where),
            fraction_of_run(self._end, state, where),
            self._interrupt,
        )

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.INIT:  # Composer's set-up event: check where the losses will come from, select nothing
            if state.loss_source is None:
                self._check_loss_source(state.model)
            return
        input = state.batch_get_item(self.input_key)
        target = state.batch_get_item(self.target_key)
        if not isinstance(input, torch.Tensor) or not isinstance(target, torch.Tensor):
            raise TypeError(
                f"SelectiveBackprop prunes one input tensor and one target tensor, got {type(input).__name__} at "
                f"input_key={self.input_key!r} and {type(target).__name__} at target_key={self.target_key!r}."
            )
        batch = state.batch
        model = state.model
        source = state.loss_source

        def forward(inputs: torch.Tensor) -> Any:
            if source is not None:  # a module that takes the inputs alone (its training_step unpacks the batch)
                return source.forward(inputs)
            return model(set_batch_item(copy.copy(batch), self.input_key, inputs))

        def per_example_loss(outputs: Any, targets: torch.Tensor, reduction: str = "none") -> torch.Tensor:
            if source is not None and self.loss_fn is None:
                return source.loss(outputs, targets, reduction="none")
            return self._per_example_loss(model, outputs, batch, targets)

        try:
            with _autocast(state, input.device):
                chosen = _selected_examples(
                    input, target, forward, per_example_loss, self.keep, self.scale_factor,
                    state.generator(type(self).__name__, input.device),
                )
        except LossNotSeenYet as error:  # a plain module before its first step: this step trains on the whole batch
            if not self._told_unselected:
                warnings.warn(f"SelectiveBackprop: {error} This step trains on the whole batch.", stacklevel=2)
                self._told_unselected = True
            return
        if isinstance(state.batch, Mapping):  # a dict batch's other per-example tensors (attention_mask, ...) too
            pruned = copy.copy(state.batch)
            for key, value in state.batch.items():
                if _per_example_tensor(value, input):
                    pruned[key] = value[chosen]
            state.batch = pruned
        state.batch_set_item(self.input_key, input[chosen])
        state.batch_set_item(self.target_key, target[chosen])

    def _check_loss_source(self, model: Any) -> None:
        if self.loss_fn is None and not callable(getattr(model, "loss", None)):
            raise TypeError(
                f"SelectiveBackprop needs per-example losses, but {type(model).__name__} has no loss(outputs, batch); "
                "pass SelectiveBackprop(loss_fn=...) returning one loss per example."
            )

    def _per_example_loss(self, model: Any, outputs: Any, batch: Any, targets: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is not None:
            return self.loss_fn(outputs, targets)
        self._check_loss_source(model)
        loss = model.loss
        if _takes_reduction(loss):
            return loss(outputs, batch, reduction="none")
        key = self.target_key

        def one_example(example_outputs: Any, example_target: torch.Tensor) -> torch.Tensor:
            single = set_batch_item(copy.copy(batch), key, example_target.unsqueeze(0))
            outputs_1 = torch.utils._pytree.tree_map(lambda t: t.unsqueeze(0), example_outputs)
            return loss(outputs_1, single)

        try:
            return torch.func.vmap(one_example)(outputs, targets)
        except Exception as error:
            raise RuntimeError(
                f"SelectiveBackprop could not evaluate {type(model).__name__}.loss per example with torch.func.vmap "
                f"({type(error).__name__}: {error}). Pass SelectiveBackprop(loss_fn=...) returning one loss per "
                "example, or give the model's loss a reduction='none' argument."
            ) from error


def _takes_reduction(loss: Callable[..., Any], unknown: bool = False) -> bool:
    """Whether ``loss`` accepts ``reduction=``; ``unknown`` when its signature cannot be read."""
    try:
        parameters = inspect.signature(loss).parameters
    except (TypeError, ValueError):
        return unknown
    return "reduction" in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _interrupt_count(interrupt: int | str | Time, where: str) -> int:
    if isinstance(interrupt, (str, Time)):
        try:
            count = Time.from_input(interrupt, TimeUnit.BATCH)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}(interrupt={interrupt!r}): expected an int or a batch count like '2ba' ({error}).") from None
        if count.unit != TimeUnit.BATCH:
            raise ValueError(f"{where}(interrupt={interrupt!r}): interrupt counts batches; write e.g. 2 or '2ba'.")
        return int(count.value)
    if isinstance(interrupt, bool) or not isinstance(interrupt, int) or interrupt < 0:
        raise ValueError(
            f"{where}(interrupt={interrupt!r}): must be an int >= 0 (every interrupt-th batch is a full step; "
            "0 never interrupts)."
        )
    return interrupt

