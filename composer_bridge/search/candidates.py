"""What the recipe search may add to a run: candidate algorithms, and which of them can apply to a model.

A :class:`Candidate` names an algorithm of :mod:`composer_bridge.algorithms` and its arguments as
a recipe would publish them; :meth:`Candidate.build` makes a fresh instance for a run of a given
length, with the arguments counted in optimizer steps rescaled by
:func:`composer_bridge.recipes.scale_to_run` (EMA's half-life, SAM's interval).

Examples:
    >>> Candidate("EMA", {"half_life": "100ba", "update_interval": "20ba"}).build(total_steps=200)
    EMA(half_life='10ba', smoothing=None, ema_start='0.0dur', update_interval='2ba')
    >>> Candidate("LabelSmoothing", {"smoothing": 0.1}).label
    'LabelSmoothing'
"""

from __future__ import annotations

import copy
import difflib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from composer_bridge import recipes
from composer_bridge.core.algorithm import INPUT_KINDS, Algorithm, declaring
from composer_bridge.core.batch import get_batch_item
from composer_bridge.search.errors import SearchInputError

__all__ = ["DEFAULT_CANDIDATES", "SETTING_LADDERS", "Candidate", "applicability", "as_candidates", "from_recipe",
           "ladder", "unmet_input_need", "with_ladders"]


@dataclass(frozen=True)
class Candidate:
    """One algorithm the search may add: its class name in :mod:`composer_bridge.algorithms` and arguments.

    Args:
        algorithm: the class name (``"LabelSmoothing"``).
        kwargs: its arguments as published; those counted in optimizer steps are rescaled to each
            run's length when the run is built (:func:`composer_bridge.recipes.scale_to_run`).
        name: a label for tables (default: the class name); labels must be unique in a search.
    """

    algorithm: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.algorithm

    def algorithm_class(self) -> type:
        from composer_bridge import algorithms

        cls = getattr(algorithms, self.algorithm, None)
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            names = [n for n in getattr(algorithms, "__all__", []) if isinstance(getattr(algorithms, n), type)]
            close = difflib.get_close_matches(self.algorithm, names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise SearchInputError(f"Candidate({self.algorithm!r}): composer_bridge.algorithms has no such algorithm.{hint} "
                             f"Choose one of {sorted(names)}.")
        return cls

    @property
    def pays_late(self) -> bool:
        """Whether its gain shows only late in a run: it averages the weights (EMA, SWA: the average lags the
        weights early on) or owns the learning-rate schedule (WarmupStableDecay holds the peak rate until its
        decay; ScheduleFree evaluates an average). The prescription search judges such a candidate first at its
        last rung, not its first.

        Examples:
            >>> Candidate("EMA").pays_late, Candidate("WarmupStableDecay").pays_late, Candidate("MixUp").pays_late
            (True, True, False)
        """
        cls = self.algorithm_class()
        return bool(cls.averages_weights or cls.owns_schedule)

    def scaled_kwargs(self, total_steps: int) -> dict[str, Any]:
        """The arguments for a run of ``total_steps`` optimizer steps."""
        return recipes.scale_to_run(self.algorithm, dict(self.kwargs), total_steps)

    def build(self, total_steps: int) -> Algorithm:
        """A fresh instance for a run of ``total_steps`` optimizer steps."""
        kwargs = self.scaled_kwargs(total_steps)
        try:
            return self.algorithm_class()(**kwargs)
        except (TypeError, ValueError) as error:
            raise SearchInputError(f"Candidate({self.algorithm!r}, {dict(self.kwargs)!r}): could not build it: {error}. "
                                   f"Pass its arguments: Candidate({self.algorithm!r}, {{...}}).") from error


#: The candidates tried when none are given: the published recipes' algorithms with their published
#: arguments (mild/medium's EMA, ProgressiveResizing, MixUp, SAM; LabelSmoothing at medium's 0.1),
#: plus CutOut, CutMix, GhostBatchNorm and GradientClipping. Those that cannot apply to the model or
#: its batches (what each algorithm declares it needs, :attr:`~composer_bridge.Algorithm.needs`)
#: are left out with a warning (:func:`applicability`).
DEFAULT_CANDIDATES: tuple[Candidate, ...] = (
    Candidate("BlurPool"),
    Candidate("ChannelsLast"),
    Candidate("LabelSmoothing", {"smoothing": 0.1}),
    Candidate("MixUp", {"alpha": 0.2}),
    Candidate("CutMix", {"alpha": 1.0}),
    Candidate("CutOut", {"length": 0.25}),
    Candidate("EMA", {"half_life": "100ba", "update_interval": "20ba"}),
    Candidate("ProgressiveResizing", {"initial_scale": 0.5, "delay_fraction": 0.4, "finetune_fraction": 0.2}),
    Candidate("SAM", {"rho": 0.5, "interval": 10}),
    Candidate("GhostBatchNorm", {"ghost_batch_size": 32}),
    Candidate("GradientClipping", {"clipping_type": "norm", "clipping_threshold": 1.0}),
    # The methods language-model training adopted since: Muon (at lr 0.02, the setting measured in
    # docs/benchmarks.md; offered only where it finds a hidden layer: nn.Linear, Conv1D, convolution), a warmup-stable-decay schedule, and
    # the two stabilisers (QKNorm where its surgery finds attention, ZLoss where the bridge sees the loss).
    # Muon also with its speedrun variants together (Polar Express, NorMuon, cautious weight decay), under its
    # own label: on the workloads benchmark they scored 0.81 against plain Muon's 0.73, ahead on some models
    # and behind on others; one Muon at most joins a recipe.
    # ScheduleFree is not a default: it refuses EMA, SWA, SAM, Muon and WarmupStableDecay beside it.
    # BatchSizeWarmup is not a default: with its defaults it helped on no workload of the benchmark (0.72,
    # baseline 0.82). Compile is not a default: on the CPU its compile time outweighs what it saves.
    Candidate("Muon", {"lr": 0.02}),
    Candidate("Muon", {"lr": 0.02, "ns_coefficients": "polar_express", "normuon": True,
                       "cautious_weight_decay": True}, name="Muon+variants"),
    Candidate("WarmupStableDecay"),
    Candidate("QKNorm"),
    Candidate("ZLoss"),
)


#: A few settings of each algorithm whose strength decides whether it helps, weakest first: the
#: published setting and one on either side where the literature uses them. Raced by the same
#: successive halving as any candidates (:func:`with_ladders`); one rung at most joins a recipe.
#: EMA has none: its half-life is scaled to at most 5 % of each run, so short runs would see one rung.
SETTING_LADDERS: dict[str, tuple[dict[str, Any], ...]] = {
    "LabelSmoothing": ({"smoothing": 0.05}, {"smoothing": 0.1}, {"smoothing": 0.2}),
    "MixUp": ({"alpha": 0.1}, {"alpha": 0.2}, {"alpha": 0.4}),
    "CutMix": ({"alpha": 0.5}, {"alpha": 1.0}),
    "CutOut": ({"length": 0.15}, {"length": 0.25}, {"length": 0.4}),
    "ProgressiveResizing": ({"initial_scale": 0.75, "delay_fraction": 0.2, "finetune_fraction": 0.2},
                            {"initial_scale": 0.5, "delay_fraction": 0.4, "finetune_fraction": 0.2}),
    "SAM": ({"rho": 0.05, "interval": 10}, {"rho": 0.5, "interval": 10}, {"rho": 0.5, "interval": 5}),
}


def ladder(algorithm: str) -> list[Candidate]:
    """The rungs of ``algorithm``'s settings ladder as candidates, labelled by their settings.

    Examples:
        >>> [c.label for c in ladder("LabelSmoothing")]
        ['LabelSmoothing(smoothing=0.05)', 'LabelSmoothing(smoothing=0.1)', 'LabelSmoothing(smoothing=0.2)']
    """
    if algorithm not in SETTING_LADDERS:
        raise SearchInputError(f"ladder({algorithm!r}): no settings ladder; those with one: {sorted(SETTING_LADDERS)}.")
    return [Candidate(algorithm, kwargs, name=f"{algorithm}({', '.join(f'{k}={v}' for k, v in kwargs.items())})")
            for kwargs in SETTING_LADDERS[algorithm]]


def with_ladders(candidates: Sequence[Candidate | str] | None = None) -> list[Candidate]:
    """``candidates`` (default: :data:`DEFAULT_CANDIDATES`) with each algorithm that has a settings
    ladder replaced by its rungs; pass the result as ``search_recipe(candidates=...)``.

    Each rung is one more curve per search seed in the first step, so the budget must cover them.

    Examples:
        >>> [c.label for c in with_ladders(["BlurPool", "MixUp"])]
        ['BlurPool', 'MixUp(alpha=0.1)', 'MixUp(alpha=0.2)', 'MixUp(alpha=0.4)']
    """
    out: list[Candidate] = []
    for c in as_candidates(candidates):
        out.extend(ladder(c.algorithm) if c.algorithm in SETTING_LADDERS else [c])
    return out


def as_candidates(candidates: Sequence[Candidate | str] | None) -> list[Candidate]:
    """``candidates`` as :class:`Candidate` objects (a string is a class name with default arguments).

    Raises :class:`~composer_bridge.search.errors.SearchInputError` for an unknown algorithm, an empty list or two candidates with one label.

    Examples:
        >>> [c.label for c in as_candidates(["BlurPool", Candidate("MixUp", {"alpha": 0.2})])]
        ['BlurPool', 'MixUp']
    """
    if candidates is None:
        return list(DEFAULT_CANDIDATES)
    out = []
    for item in candidates:
        if isinstance(item, str):
            item = Candidate(item)
        if not isinstance(item, Candidate):
            raise SearchInputError(f"candidates: {item!r} is a {type(item).__name__}; expected an algorithm class name "
                            "(\"MixUp\") or composer_bridge.search.Candidate(\"MixUp\", {\"alpha\": 0.2}).")
        item.build(1000)  # unknown names and missing or wrong arguments fail here, before any training
        out.append(item)
    if not out:
        raise SearchInputError("candidates=[]: nothing to search. Pass None for the default candidates, or a list of names.")
    labels = [c.label for c in out]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise SearchInputError(f"candidates: the labels {twice} appear more than once; give each variant its own "
                         "name=, e.g. Candidate(\"MixUp\", {\"alpha\": 0.4}, name=\"MixUp(0.4)\").")
    return out


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _tensors(batch: Any) -> list[torch.Tensor]:
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else [batch]
    return [item for item in items if isinstance(item, torch.Tensor)]


#: How each kind of input in :data:`composer_bridge.core.algorithm.INPUT_KINDS` is recognised:
#: ``(the algorithm's input, the whole batch) -> bool``.
_INPUT_CHECKS = {
    "floating input": lambda item, batch: isinstance(item, torch.Tensor) and item.is_floating_point(),
    "image": lambda item, batch: isinstance(item, torch.Tensor) and item.is_floating_point() and item.dim() == 4,
    "sequence": lambda item, batch: any(t.dim() >= 2 for t in _tensors(batch)),
}


def unmet_input_need(algorithm: Algorithm, batch: Any) -> str | None:
    """What ``algorithm`` declares it needs of its input (:attr:`~composer_bridge.Algorithm.needs`) and
    ``batch`` lacks, in words; ``None`` when the batch has all of it.

    Examples:
        >>> from composer_bridge.algorithms import CutMix, MixUp
        >>> signals = (torch.randn(8, 1, 40), torch.zeros(8, dtype=torch.long))
        >>> unmet_input_need(MixUp(), signals) is None
        True
        >>> print(unmet_input_need(CutMix(), signals))
        CutMix needs a floating-point image batch (N, C, H, W): two spatial dimensions; this batch's input is a float32 tensor of shape (8, 1, 40)
    """
    key = getattr(algorithm, "input_key", 0)
    try:
        item = get_batch_item(batch, key)
    except (KeyError, IndexError, TypeError, ValueError):
        item = batch
    for kind in sorted(type(algorithm).needs):
        if kind not in _INPUT_CHECKS:
            raise ValueError(f"{type(algorithm).__name__}.needs names {kind!r}; the kinds are {sorted(INPUT_KINDS)}.")
        if not _INPUT_CHECKS[kind](item, batch):
            return (f"{type(algorithm).__name__} needs {INPUT_KINDS[kind]}; this batch's input is {_describe(item)}")
    return None


def missing_targets(algorithm: Algorithm, batch: Any) -> str | None:
    """Why ``algorithm`` cannot find the targets it reads (its ``target_key``) in ``batch``; ``None`` if it can.

    Examples:
        >>> from composer_bridge.algorithms import LabelSmoothing
        >>> graph_batch = {"x": torch.randn(5, 3), "edge_index": torch.zeros(2, 4, dtype=torch.long), "y": torch.zeros(2)}
        >>> print(missing_targets(LabelSmoothing(), graph_batch).split(":")[0])
        LabelSmoothing reads the targets at 1, which batches like this one do not hold
        >>> missing_targets(LabelSmoothing(target_key="y"), graph_batch) is None
        True
    """
    key = getattr(algorithm, "target_key", None)
    if key is None:
        return None
    try:
        get_batch_item(batch, key)
    except (KeyError, IndexError, TypeError, ValueError) as error:
        return (f"{type(algorithm).__name__} reads the targets at {key!r}, which batches like this one do not hold: "
                f"{error} (declare them on the module, batch_keys = {{'target_key': ...}}, or give the candidate "
                f"target_key=..., e.g. Candidate({type(algorithm).__name__!r}, {{'target_key': 'y'}}))")
    return None


def applicability(candidate: Candidate, module: torch.nn.Module, batch: Any, total_steps: int) -> str | None:
    """Why ``candidate`` cannot apply to ``module`` trained on batches like ``batch``, or ``None`` if it can.

    Checked without training, from what the algorithm declares it needs: the kinds of input
    (:attr:`~composer_bridge.Algorithm.needs`: an image, any floating input, a sequence) must be
    in the batch; an algorithm that needs the loss events, on a plain module (not a
    :class:`~composer_bridge.ComposerModule`), must pass the bridge's set-up check of what the
    module shows (a criterion's options, manual optimization); a surgery algorithm is run on a
    deep copy of the module and must replace something.
    """
    from composer_bridge import State
    from composer_bridge.algorithms import SurgeryAlgorithm
    from composer_bridge.lightning.batch_keys import give_declared_keys
    from composer_bridge.lightning.module import ComposerModuleMixin
    from composer_bridge.lightning.plain_loss import check_plain_module

    algorithm = candidate.build(total_steps)
    give_declared_keys([algorithm], module)  # the module's batch_keys, as the run gives them at setup
    unmet = unmet_input_need(algorithm, batch) or missing_targets(algorithm, batch)
    if unmet is not None:
        return unmet
    if declaring([algorithm], "needs_loss_events") and not isinstance(module, ComposerModuleMixin):
        try:
            check_plain_module([algorithm], module)
        except ValueError as error:  # BridgeConfigurationError
            return f"{candidate.label} cannot act on {type(module).__name__}'s loss: {error}"
    nothing = algorithm.finds_nothing_in(module)
    if nothing is not None:
        return nothing
    if isinstance(algorithm, SurgeryAlgorithm):
        model = copy.deepcopy(module)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                replaced = algorithm.surgery(State(model))
            except Exception as error:  # noqa: BLE001 - the reason goes into the message
                return f"{candidate.label}'s surgery fails on {type(module).__name__}: {error}"
        if not replaced:
            return f"{candidate.label} would replace nothing in {type(module).__name__}"
    return None


def from_recipe(name: str, prefix: str | None = None, **fill: Any) -> list[Candidate]:
    """A named recipe of :mod:`composer_bridge.recipes` as candidates (to confirm it beside the search's pick).

    Labels are ``"<prefix>:<class name>"`` (prefix default: the recipe's name) so they never clash
    with search candidates of the same class and other arguments. ``fill`` supplies a language
    recipe's placeholders (``max_seq_length=128``).

    Examples:
        >>> print(", ".join(c.label for c in from_recipe("short")))
        short:BlurPool, short:ChannelsLast, short:LabelSmoothing
    """
    table = {**recipes.VISION_RECIPES, **recipes.LANGUAGE_RECIPES}
    if name not in table:
        raise ValueError(f"from_recipe({name!r}): unknown recipe; choose one of {sorted(table)}.")
    out = []
    for cls, kwargs in table[name]:
        filled = {k: (fill[v[1:-1]] if isinstance(v, str) and v.startswith("{") and v[1:-1] in fill else v)
                  for k, v in kwargs.items()}
        out.append(Candidate(cls, filled, name=f"{prefix or name}:{cls}"))
    return out
