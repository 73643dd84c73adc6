"""Sharpness-aware minimization (Foret et al. 2020): step with the gradient at the worst nearby point.

Examples:
    >>> import torch
    >>> model = torch.nn.Linear(2, 1)
    >>> optimizer = SAMOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.05)
    >>> x, y = torch.randn(8, 2), torch.randn(8, 1)
    >>> def closure():
    ...     optimizer.zero_grad()
    ...     loss = torch.nn.functional.mse_loss(model(x), y)
    ...     loss.backward()
    ...     return loss
    >>> loss = optimizer.step(closure)  # two forward/backward passes, one update
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State

__all__ = ["SAM", "SAMOptimizer"]


def _check(rho: object, epsilon: object, interval: object, where: str) -> None:
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not (math.isfinite(rho) and rho >= 0):
        raise ValueError(f"{where}(rho={rho!r}): the neighbourhood radius must be a finite number >= 0, e.g. 0.05.")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"{where}(epsilon={epsilon!r}): must be a small positive number, e.g. 1e-12.")
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(f"{where}(interval={interval!r}): must be an int >= 1 (1 = SAM on every step).")


class SAMOptimizer(torch.optim.Optimizer):
    """Wrap ``base_optimizer`` so that :meth:`step` performs a SAM update (needs a closure).

    On SAM steps (every ``interval``-th call) the closure runs twice: once at ``w`` for the
    gradient ``g``, then at ``w + e`` with ``e = rho * g / (|g| + epsilon)`` (``|g|`` is the norm of
    all gradients together); the weights go back to ``w`` and the base optimizer steps with the
    second gradient. On other steps it is the base optimizer with one closure call.

    The wrapper shares the base optimizer's parameter groups and state; its ``state_dict`` *is* the
    base optimizer's, so checkpoints load with or without SAM. The closure must zero the gradients
    before its backward pass (Lightning's automatic optimization and the usual closures do).

    Args:
        base_optimizer: the optimizer that makes the actual update.
        rho: neighbourhood radius (>= 0). Default ``0.05``.
        epsilon: added to the gradient norm for stability. Default ``1e-12``.
        interval: run SAM every ``interval`` steps. Default ``1``.
        global_step: steps taken so far (for ``interval``; restored on resume).
    """

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho: float = 0.05,
        epsilon: float = 1.0e-12,
        interval: int = 1,
        global_step: int = 0,
    ) -> None:
        if not isinstance(base_optimizer, torch.optim.Optimizer):
            raise TypeError(f"SAMOptimizer(base_optimizer={base_optimizer!r}): must be a torch.optim.Optimizer.")
        if isinstance(base_optimizer, SAMOptimizer):
            raise TypeError("SAMOptimizer(base_optimizer=...) is already a SAMOptimizer; wrap the plain optimizer once.")
        _check(rho, epsilon, interval, "SAMOptimizer")
        self.base_optimizer = base_optimizer
        self.rho = float(rho)
        self.epsilon = float(epsilon)
        self.interval = interval
        self.global_step = global_step
        #: Called between the two closure evaluations of a SAM step (the bridge uses it).
        self.before_second_closure: Callable[[], None] | None = None
        super().__init__(base_optimizer.param_groups, {})
        self._share_base()

    def _share_base(self) -> None:
        self.param_groups = self.base_optimizer.param_groups
        self.state = self.base_optimizer.state
        self.defaults = self.base_optimizer.defaults

    # The base optimizer owns the persistent state: checkpoints hold exactly what it would hold alone.
    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return self.base_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.base_optimizer.load_state_dict(state_dict)
        self._share_base()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "base_optimizer", None) is not None and self.param_groups is self.base_optimizer.param_groups:
            self.base_optimizer.add_param_group(param_group)
        else:  # during torch.optim.Optimizer.__init__
            super().add_param_group(param_group)

    def _gradient_norm(self) -> torch.Tensor:
        norms = [p.grad.detach().float().norm(2) for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not norms:
            return torch.zeros(())
        device = norms[0].device
        return torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), 2)

    @torch.no_grad()
    def _perturb(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        scale = self.rho / (self._gradient_norm() + self.epsilon)
        moved = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                e_w = (p.grad.detach().float() * scale.to(p.device)).to(p.dtype)
                p.add_(e_w)
                moved.append((p, e_w))
        return moved

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        if closure is None:
            raise RuntimeError(
                "SAMOptimizer.step() needs a closure that recomputes the loss and gradients (it evaluates it twice). "
                "Under fp16 AMP (precision='16-mixed') Lightning's gradient scaler steps without one: use "
                "precision='bf16-mixed' or '32-true' with SAM."
            )
        closure = torch.enable_grad()(closure)
        is_sam_step = (self.global_step + 1) % self.interval == 0
        self.global_step += 1
        loss = closure()
        if loss is None:  # the step was skipped (e.g. training_step returned None)
            return None
        if not is_sam_step or self.rho == 0:
            self.base_optimizer.step()
            return loss
        moved = self._perturb()
        try:
            if self.before_second_closure is not None:
                self.before_second_closure()
            second = closure()
        finally:
            for p, e_w in moved:
                p.sub_(e_w)
        if second is not None:
            self.base_optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)

    def __repr__(self) -> str:
        return f"SAMOptimizer({self.base_optimizer!r}, rho={self.rho}, epsilon={self.epsilon}, interval={self.interval})"


class SAM(Algorithm):
    """Sharpness-aware minimization: wraps the run's optimizers in :class:`SAMOptimizer` at ``FIT_START``.

    Under Lightning's automatic optimization the optimizer's closure runs ``training_step`` and
    backward, so each SAM step evaluates the batch twice (about twice the cost of a step, or
    ``1 + 1/interval`` on average). Both evaluations fire the forward/loss/backward events and
    ``AFTER_TRAIN_BATCH`` (as in Composer: gradient clipping applies to both gradients);
    ``train/loss`` is logged for both. Works with ``precision='32-true'`` and ``'bf16-mixed'``;
    ``'16-mixed'`` is refused (Lightning's gradient scaler evaluates the closure once, then steps
    without it), and so is ``accumulate_grad_batches > 1`` (the second evaluation could only
    recompute the last micro-batch): use a larger batch instead. Under DDP both gradients are
    averaged across ranks.

    Checkpoints hold the base optimizer's state as usual (Lightning saves and restores it through
    the wrapper) and this algorithm's step counters, so resumed runs continue exactly.

    Args:
        rho: neighbourhood radius (>= 0). Default ``0.05``.
        epsilon: added to the gradient norm for stability. Default ``1e-12``.
        interval: run SAM every ``interval`` optimizer steps. Default ``1``.

    Examples:
        >>> SAM(rho=0.05, epsilon=1e-12, interval=1)
        SAM(rho=0.05, epsilon=1e-12, interval=1)
    """

    unique = True
    needs_optimizer_closure = True

    def __init__(self, rho: float = 0.05, epsilon: float = 1.0e-12, interval: int = 1) -> None:
        _check(rho, epsilon, interval, "SAM")
        self.rho = rho
        self.epsilon = epsilon
        self.interval = interval
        self._global_steps: list[int] = []
        self._wrapped: list[SAMOptimizer] = []

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.INIT, Event.FIT_START)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.INIT:
            self._check_loop(state)
            return
        self._check_loop(state)
        steps = self._global_steps or [int(state.timestamp.batch.value)] * len(state.optimizers)
        wrapped = []
        for i, optimizer in enumerate(state.optimizers):
            if isinstance(optimizer, SAMOptimizer):
                wrapped.append(optimizer)
                continue
            wrapped.append(SAMOptimizer(optimizer, self.rho, self.epsilon, self.interval, steps[i] if i < len(steps) else 0))
        self._wrapped = wrapped
        # The loop steps what state.optimizers holds after FIT_START (the Lightning bridge hands the
        # wrappers to its strategy); every closure evaluation fires AFTER_TRAIN_BATCH, so gradient
        # clipping and friends see both gradients of a SAM step, as in Composer.
        state.optimizers = list(wrapped)

    def _check_loop(self, state: State) -> None:
        """Refuse loops that cannot evaluate the closure twice (the bridge checks the Trainer at setup too)."""
        if str(state.precision) in ("16-mixed", "16"):
            raise ValueError(
                f"SAM cannot run with precision={state.precision!r}: fp16 AMP's gradient scaler evaluates the "
                "closure once and then steps without it, so SAM's second forward/backward cannot happen. Use "
                "precision='bf16-mixed' (no scaler) or '32-true'."
            )
        if state.accumulate_grad_batches > 1:
            raise ValueError(
                f"SAM cannot run with accumulate_grad_batches={state.accumulate_grad_batches}: the loop's closure "
                "re-evaluates only the last micro-batch, so SAM's second gradient would miss the others. Use a "
                "larger batch size (or more devices) instead of accumulation."
            )
        if not state.automatic_optimization:
            raise ValueError(
                "SAM wraps the optimizer for the loop's automatic optimization; this module sets "
                "automatic_optimization=False. Call SAMOptimizer(optimizer).step(closure) in your training_step."
            )

    def state_dict(self) -> dict[str, Any]:
        steps = [o.global_step for o in self._wrapped] if self._wrapped else list(self._global_steps)
        return {"global_steps": steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"global_steps"}:
            raise ValueError(f"SAM state has keys {sorted(state)}; expected ['global_steps'].")
        self._global_steps = [int(s) for s in state["global_steps"]]

