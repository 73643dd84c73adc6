"""Named algorithm lists ("recipes"), with the hyper-parameters MosaicML published for them.

Vision recipes (:func:`vision`) are the three "Mosaic ResNet" recipes for ResNet-50 on ImageNet;
language recipes (:func:`language`) are Composer's and LLM Foundry's choices for GPT-style models.
Each call returns a fresh list of algorithm instances for
:class:`~composer_bridge.AlgorithmEngineCallback`; keyword overrides change, add or drop
algorithms by their snake_case name (:func:`override_key`).

Examples:
    >>> from composer_bridge import recipes
    >>> [type(a).__name__ for a in recipes.vision("mild")]
    ['BlurPool', 'ChannelsLast', 'EMA', 'ProgressiveResizing', 'LabelSmoothing']
    >>> recipes.vision("mild", label_smoothing=0.1)[-1]
    LabelSmoothing(smoothing=0.1, target_key=1)
    >>> [type(a).__name__ for a in recipes.vision("mild", ema=None, mixup=0.2)]
    ['BlurPool', 'ChannelsLast', 'ProgressiveResizing', 'LabelSmoothing', 'MixUp']

Where the numbers come from
---------------------------
*Vision* — ``examples/benchmarks/resnet_imagenet/main.py`` in the ``mosaicml/examples``
repository (the code behind MosaicML's "Mosaic ResNet" blog posts, 2022), which builds:

- **mild** (short runs, ≈36 epochs of ResNet-50): BlurPool, ChannelsLast,
  EMA(half_life="100ba", update_interval="20ba"), ProgressiveResizing(initial_scale=0.5,
  delay_fraction=0.4, finetune_fraction=0.2), LabelSmoothing(smoothing=0.08);
- **medium** (longer runs): mild with LabelSmoothing(0.1), plus MixUp(alpha=0.2) and
  SAM(rho=0.5, interval=10);
- **hot** (the longest runs, maximum accuracy): ProgressiveResizing(initial_scale=0.6,
  delay_fraction=0.2, finetune_fraction=0.2), LabelSmoothing(0.13), MixUp(alpha=0.25),
  SAM(rho=0.5, interval=5), ColOut(p_row=0.05, p_col=0.05), StochasticDepth(drop_rate=0.1,
  stochastic_method="sample", drop_distribution="linear") and RandAugment(depth=1, severity=9).

One recipe here is not MosaicML's: **short** is mild without ProgressiveResizing and EMA
(BlurPool, ChannelsLast, LabelSmoothing(smoothing=0.08)), for runs of a few hundred optimizer steps
on small images. There ProgressiveResizing has little to shrink (a network that trained on 6x6
digits re-learns at 8x8) and an EMA of the weights lags behind a learning rate that is already
annealed to zero. It was chosen on the digits Pareto benchmark (``benchmarks/pareto.py``) on
tuning seeds 100 to 117, among 21 variants (single algorithms and mild with SAM, GhostBatchNorm,
SelectiveBackprop, SWA, LayerFreezing, ...), and evaluated once on seeds 0 to 2; docs/benchmarks.md
has both.

The published recipes also change things that are not algorithms (binary cross-entropy loss,
a 176-pixel training crop, FFCV data loading, the number of epochs); set those in your own
module and data. RandAugment here works on the batch, after the data loader, and reads images
in ``[0, 1]``: if your loader normalises them, pass the normalisation, e.g.
``randaugment={"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}``. One difference here:
StochasticDepth targets :class:`~composer_bridge.models.BasicBlock` (the residual block of this
package's ResNets) instead of torchvision's ``Bottleneck``: pass
``stochastic_depth={"target_layer_name": ...}`` for your own block.

*Language* — ``"gpt"`` is the set of methods LLM Foundry's MPT models train with:
GradientClipping(clipping_type="norm", clipping_threshold=1.0) from its pre-training YAMLs
(``scripts/train/yamls/pretrain/mpt-*.yaml``), LowPrecisionLayerNorm (MPT's default
``norm_type``) and ALiBi position biases (``attn_config.alibi: true`` in MPT-7B), here at the full
training length. ``"gpt-fast"`` adds the settings Composer's method cards suggest for speed:
SeqLengthWarmup(duration=0.3, min_seq_length=8, step_size=8) and GatedLinearUnits.

``"muon-wsd"`` is this library's, not MosaicML's: Muon(lr=0.02) on the hidden weight matrices,
WarmupStableDecay (in place of your schedule), QKNorm and ZLoss(class_dim=-1, logits of shape
``(..., vocabulary)``). It was measured on the bundled character-level GPT at 2,000 to 8,000 steps
(docs/benchmarks.md, "The newer language methods"), where it reached the baseline's best quality
2.46x sooner on three seeds no choice used, against 1.68x for ``"gpt-fast"``, ahead on every seed.
ZLoss reads the targets at ``target_key`` (default the batch's second item): for a dict batch pass
``zloss={"target_key": "labels"}``, or declare ``batch_keys`` on your module.

These numbers were tuned for ImageNet-scale and billion-token runs. For a run of known length,
pass ``total_steps`` (optimizer steps) and the hyper-parameters counted in steps are scaled to it
(see :data:`RUN_LENGTH_RULES`); the others are already fractions of the run::

    >>> [a for a in vision("mild", total_steps=300) if type(a).__name__ == "EMA"]
    [EMA(half_life='15ba', smoothing=None, ema_start='0.0dur', update_interval='3ba')]

Without ``total_steps`` the published numbers are used as they are.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Mapping
from typing import Any

from composer_bridge.core.algorithm import Algorithm

__all__ = ["LANGUAGE_RECIPES", "RUN_LENGTH_RULES", "VISION_RECIPES", "MissingAlgorithmWarning", "for_run",
           "language", "override_key", "scale_to_run", "vision"]


class MissingAlgorithmWarning(UserWarning):
    """A recipe built with ``missing="drop"`` left out algorithms this library version lacks."""

# A recipe is a list of (algorithm class name, keyword arguments). Classes are looked up in
# composer_bridge.algorithms when a recipe is built, so this module imports no algorithm.
_Spec = list[tuple[str, dict[str, Any]]]

_MILD: _Spec = [
    ("BlurPool", {}),
    ("ChannelsLast", {}),
    ("EMA", {"half_life": "100ba", "update_interval": "20ba"}),
    ("ProgressiveResizing", {"initial_scale": 0.5, "delay_fraction": 0.4, "finetune_fraction": 0.2}),
    ("LabelSmoothing", {"smoothing": 0.08}),
]

#: Vision recipe name → ``[(algorithm class name, init arguments), ...]`` (see the module docstring).
VISION_RECIPES: dict[str, _Spec] = {
    "mild": _MILD,
    "medium": [
        *_MILD[:4],
        ("LabelSmoothing", {"smoothing": 0.1}),
        ("MixUp", {"alpha": 0.2}),
        ("SAM", {"rho": 0.5, "interval": 10}),
    ],
    "hot": [
        *_MILD[:3],
        ("ProgressiveResizing", {"initial_scale": 0.6, "delay_fraction": 0.2, "finetune_fraction": 0.2}),
        ("LabelSmoothing", {"smoothing": 0.13}),
        ("MixUp", {"alpha": 0.25}),
        ("SAM", {"rho": 0.5, "interval": 5}),
        ("ColOut", {"p_row": 0.05, "p_col": 0.05}),
        ("RandAugment", {"depth": 1, "severity": 9}),
        ("StochasticDepth", {
            "target_layer_name": "BasicBlock", "stochastic_method": "sample",
            "drop_distribution": "linear", "drop_rate": 0.1,
        }),
    ],
    # Not a MosaicML recipe: mild without ProgressiveResizing and EMA, for short runs on small images
    # (see the module docstring and docs/benchmarks.md, "Quality against training time (Pareto)").
    "short": [_MILD[0], _MILD[1], _MILD[4]],
}

_GPT: _Spec = [
    ("GradientClipping", {"clipping_type": "norm", "clipping_threshold": 1.0}),
    ("LowPrecisionLayerNorm", {}),
    ("Alibi", {"max_sequence_length": "{max_seq_length}", "train_sequence_length_scaling": 1.0}),
]

#: Language recipe name → ``[(algorithm class name, init arguments), ...]``; ``"{max_seq_length}"``
#: stands for :func:`language`'s ``max_seq_length`` argument.
LANGUAGE_RECIPES: dict[str, _Spec] = {
    "gpt": _GPT,
    "gpt-fast": [
        *_GPT,
        ("SeqLengthWarmup", {
            "duration": 0.3, "min_seq_length": 8, "max_seq_length": "{max_seq_length}", "step_size": 8,
        }),
        ("GatedLinearUnits", {}),
    ],
    # Measured here, not published by MosaicML: see the module docstring.
    "muon-wsd": [
        ("Muon", {"lr": 0.02}),
        ("WarmupStableDecay", {}),
        ("QKNorm", {}),
        ("ZLoss", {"class_dim": -1}),
    ],
}

# The hyper-parameter a plain number or string sets (``vision("mild", label_smoothing=0.1)``).
_MAIN_PARAMETER = {
    "Alibi": "max_sequence_length",
    "AugMix": "severity",
    "ColOut": "p_row",
    "CutMix": "alpha",
    "CutOut": "length",
    "EMA": "half_life",
    "GradientClipping": "clipping_threshold",
    "LabelSmoothing": "smoothing",
    "MixUp": "alpha",
    "ProgressiveResizing": "initial_scale",
    "RandAugment": "severity",
    "SAM": "rho",
    "SeqLengthWarmup": "duration",
    "StochasticDepth": "drop_rate",
}


# --- Run-length scaling -------------------------------------------------------------------------
# The published numbers count optimizer steps of runs tens of thousands of steps long. On a run of
# a few hundred steps they mean something else: EMA(half_life="100ba") averages over a third of a
# 300-step run, so the evaluated weights are mostly early, poor ones (validation accuracy 0.07 with
# "mild" on a 96-step digits run). Each rule maps the published arguments and the run's length to
# the arguments for that run; it changes nothing once the run is long enough for the published
# value to be a small part of it.

#: EMA: the half-life is at most this fraction of the run (EMA's own ``"auto"`` choice) ...
EMA_MAX_FRACTION = 0.05
#: ... SAM: at least this many SAM steps in the run (its interval is a frequency: 1/interval of the
#: steps pay a second forward and backward, which the recipe chose and the scaling keeps when it can).
SAM_MIN_STEPS = 10


def _steps(value: Any) -> int | None:
    """``"100ba"`` → 100; anything not counted in batches → ``None`` (left as it is)."""
    if isinstance(value, str) and value.endswith("ba") and value[:-2].isdigit():
        return int(value[:-2])
    return None


def _scale_ema(kwargs: dict[str, Any], total_steps: int) -> dict[str, Any]:
    half_life, interval = _steps(kwargs.get("half_life")), _steps(kwargs.get("update_interval"))
    if half_life is None:
        return kwargs
    scaled = max(1, min(half_life, round(EMA_MAX_FRACTION * total_steps)))
    out = {**kwargs, "half_life": f"{scaled}ba"}
    if interval is not None:  # keep the published ratio of update interval to half-life (20/100)
        out["update_interval"] = f"{max(1, round(scaled * interval / half_life))}ba"
    return out


def _scale_sam(kwargs: dict[str, Any], total_steps: int) -> dict[str, Any]:
    interval = kwargs.get("interval")
    if not isinstance(interval, int) or isinstance(interval, bool):
        return kwargs
    return {**kwargs, "interval": max(1, min(interval, total_steps // SAM_MIN_STEPS))}


#: Algorithm class name → ``rule(published_kwargs, total_steps) -> kwargs``: how
#: ``total_steps=`` rescales the hyper-parameters counted in optimizer steps. ProgressiveResizing,
#: SeqLengthWarmup, StochasticDepth, ColOut, RandAugment, MixUp, LabelSmoothing and Alibi have none: their
#: schedules are already fractions of the run (``delay_fraction``, ``duration``) or not schedules.
RUN_LENGTH_RULES: dict[str, Any] = {"EMA": _scale_ema, "SAM": _scale_sam}


def _check_total_steps(where: str, total_steps: Any) -> None:
    if total_steps is None:
        return
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(
            f"{where}(total_steps={total_steps!r}): needs the run's number of optimizer steps as an int >= 1 "
            "(e.g. max_epochs * len(train_loader) // accumulate_grad_batches), or None for the published values."
        )


def scale_to_run(class_name: str, kwargs: Mapping[str, Any], total_steps: int) -> dict[str, Any]:
    """The arguments of ``class_name`` from a recipe, rescaled for a run of ``total_steps`` optimizer steps.

    Examples:
        >>> scale_to_run("EMA", {"half_life": "100ba", "update_interval": "20ba"}, total_steps=300)
        {'half_life': '15ba', 'update_interval': '3ba'}
        >>> scale_to_run("EMA", {"half_life": "100ba", "update_interval": "20ba"}, total_steps=50_000)
        {'half_life': '100ba', 'update_interval': '20ba'}
        >>> scale_to_run("SAM", {"rho": 0.5, "interval": 10}, total_steps=60)
        {'rho': 0.5, 'interval': 6}
    """
    _check_total_steps("scale_to_run", total_steps)
    rule = RUN_LENGTH_RULES.get(class_name)
    return dict(kwargs) if rule is None else rule(dict(kwargs), total_steps)


def vision(name: str = "mild", *, total_steps: int | None = None, missing: str = "error",
           **overrides: Any) -> list[Algorithm]:
    """The Mosaic ResNet recipe ``name`` (``"mild"``, ``"medium"`` or ``"hot"``), or ``"short"``, as algorithm instances.

    ``"short"`` (BlurPool, ChannelsLast, LabelSmoothing) is for runs of a few hundred steps on
    small images, where mild's ProgressiveResizing and EMA cost accuracy (see the module docstring).

    Args:
        name: which recipe.
        total_steps: the run's length in optimizer steps, if known: the hyper-parameters counted in
            steps (EMA's half-life and update interval, SAM's interval) are scaled to it by
            :data:`RUN_LENGTH_RULES` before the overrides apply. ``None`` (default): as published.
        **overrides: per algorithm, by snake_case class name (``label_smoothing``, ``ema``, ...):
            a number or string sets its main hyper-parameter (``label_smoothing=0.1``,
            ``ema="0.05dur"``); a dict updates its arguments (``ema={"update_interval": "1ba"}``);
            an :class:`~composer_bridge.Algorithm` instance replaces it; ``None`` or ``False``
            drops it; ``True`` keeps it with the recipe's arguments. Naming a library algorithm
            the recipe lacks adds it at the end (``mixup=0.2``).
        missing: what to do when the installed ``composer_bridge.algorithms`` lacks one of the
            recipe's algorithms: ``"error"`` (default) raises, ``"drop"`` leaves it out with a
            :class:`MissingAlgorithmWarning` naming it.

    Raises:
        ValueError: unknown recipe name or override key, a value of the wrong kind, or (with
            ``missing="error"``) an algorithm this version of the library does not provide.

    Examples:
        >>> [type(a).__name__ for a in vision("medium")]
        ['BlurPool', 'ChannelsLast', 'EMA', 'ProgressiveResizing', 'LabelSmoothing', 'MixUp', 'SAM']
    """
    _check_total_steps("vision", total_steps)
    return _build("vision", VISION_RECIPES, name, overrides, {}, missing, total_steps)


def language(name: str = "gpt", max_seq_length: int = 1024, *, total_steps: int | None = None,
             missing: str = "error", **overrides: Any) -> list[Algorithm]:
    """The language-model recipe ``name`` (``"gpt"``, ``"gpt-fast"`` or ``"muon-wsd"``) as algorithm instances.

    Args:
        name: which recipe.
        max_seq_length: the longest sequence the model sees (ALiBi's ``max_sequence_length`` and
            SeqLengthWarmup's ``max_seq_length``).
        total_steps: as for :func:`vision` (the language recipes' schedules are fractions of the
            run already, so today this changes nothing; it is accepted so code can pass it to both).
        missing: as for :func:`vision`.
        **overrides: as for :func:`vision` (``seq_length_warmup={"duration": 0.5}``, ``alibi=None``).

    Examples:
        >>> [type(a).__name__ for a in language("gpt-fast", max_seq_length=128)]
        ['GradientClipping', 'LowPrecisionLayerNorm', 'Alibi', 'SeqLengthWarmup', 'GatedLinearUnits']
    """
    if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, int) or max_seq_length < 1:
        raise ValueError(f"language(max_seq_length={max_seq_length!r}): needs a positive int (your model's context).")
    _check_total_steps("language", total_steps)
    return _build("language", LANGUAGE_RECIPES, name, overrides, {"max_seq_length": max_seq_length}, missing,
                  total_steps)


def for_run(name: str, total_steps: int, **kwargs: Any) -> list[Algorithm]:
    """The recipe ``name`` (vision or language, by name) scaled for a run of ``total_steps`` optimizer steps.

    ``for_run("mild", 300)`` is ``vision("mild", total_steps=300)``; ``for_run("gpt-fast", 500,
    max_seq_length=128)`` is ``language("gpt-fast", max_seq_length=128, total_steps=500)``. Other
    keyword arguments (``missing``, overrides) pass through.

    Examples:
        >>> [type(a).__name__ for a in for_run("mild", total_steps=120, ema=None)]
        ['BlurPool', 'ChannelsLast', 'ProgressiveResizing', 'LabelSmoothing']
    """
    if name in VISION_RECIPES:
        return vision(name, total_steps=total_steps, **kwargs)
    if name in LANGUAGE_RECIPES:
        return language(name, total_steps=total_steps, **kwargs)
    choices = sorted([*VISION_RECIPES, *LANGUAGE_RECIPES])
    close = difflib.get_close_matches(str(name), choices, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"for_run(name={name!r}): unknown recipe.{hint} Choose one of {choices}.")


# Composer's module names, which are the override keys (``blurpool``, not ``blur_pool``).
_MODULE_NAMES = {
    "BlurPool": "blurpool", "ColOut": "colout", "CutMix": "cutmix", "CutOut": "cutout", "MixUp": "mixup",
    "GhostBatchNorm": "ghost_batchnorm", "LowPrecisionLayerNorm": "low_precision_layernorm",
    "LowPrecisionGroupNorm": "low_precision_groupnorm", "SqueezeExcite": "squeeze_excite",
    "RandAugment": "randaugment", "AugMix": "augmix",
}


def override_key(class_name: str) -> str:
    """The keyword that overrides the algorithm ``class_name`` in :func:`vision` and :func:`language`.

    It is Composer's module name for the algorithm: the class name in snake_case, except where
    Composer writes it as one word (``blurpool``, ``mixup``, ``ghost_batchnorm``).

    Examples:
        >>> override_key("ProgressiveResizing"), override_key("MixUp"), override_key("EMA")
        ('progressive_resizing', 'mixup', 'ema')
    """
    if class_name in _MODULE_NAMES:
        return _MODULE_NAMES[class_name]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", class_name).lower()


def _library() -> dict[str, type]:
    from composer_bridge import algorithms

    return {name: getattr(algorithms, name) for name in getattr(algorithms, "__all__", [])
            if isinstance(getattr(algorithms, name, None), type)
            and issubclass(getattr(algorithms, name), Algorithm)}


def _build(kind: str, table: Mapping[str, _Spec], name: str, overrides: Mapping[str, Any],
           fill: Mapping[str, Any], missing: str = "error", total_steps: int | None = None) -> list[Algorithm]:
    if missing not in ("error", "drop"):
        raise ValueError(f"{kind}(missing={missing!r}): choose 'error' (raise) or 'drop' (leave the algorithm out).")
    if name not in table:
        close = difflib.get_close_matches(str(name), table, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{kind}(name={name!r}): unknown recipe.{hint} Choose one of {sorted(table)}.")
    library = _library()
    by_snake = {override_key(n): n for n in library}
    spec = [(cls, {k: _fill(v, fill) for k, v in kwargs.items()}) for cls, kwargs in table[name]]
    if total_steps is not None:
        spec = [(cls, scale_to_run(cls, kwargs, total_steps)) for cls, kwargs in spec]
    in_recipe = {override_key(cls): i for i, (cls, _) in enumerate(spec)}
    entries: list[Any] = list(spec)
    for key, value in overrides.items():
        if key not in in_recipe and key not in by_snake and key not in _known_snake_names():
            choices = sorted(set(in_recipe) | set(by_snake))
            close = difflib.get_close_matches(key, choices, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"{kind}({name!r}, {key}=...): {key!r} names no algorithm.{hint} Override keys are algorithm "
                f"names in snake_case; this recipe has {sorted(in_recipe)}, the library has {sorted(by_snake)}."
            )
        if key in in_recipe:
            index = in_recipe[key]
            class_name, kwargs = spec[index]
            entries[index] = _apply_override(kind, name, key, class_name, kwargs, value)
        elif value is not None and value is not False:
            class_name = by_snake.get(key) or _known_snake_names()[key]
            entries.append(_apply_override(kind, name, key, class_name, {}, value))
    entries = [entry for entry in entries if entry is not None]
    if missing == "drop":
        absent = [e[0] for e in entries if not isinstance(e, Algorithm)
                  and library.get(e[0]) is None]
        if absent:
            warnings.warn(
                f"{kind}({name!r}): this version of composer_bridge.algorithms has no {', '.join(absent)}; "
                f"the recipe runs without {'it' if len(absent) == 1 else 'them'}.", MissingAlgorithmWarning, stacklevel=3,
            )
            entries = [e for e in entries if isinstance(e, Algorithm) or e[0] not in absent]
    return [entry if isinstance(entry, Algorithm) else _instantiate(kind, name, entry, library) for entry in entries]


def _known_snake_names() -> dict[str, str]:
    names = {cls for spec in (*VISION_RECIPES.values(), *LANGUAGE_RECIPES.values()) for cls, _ in spec}
    return {override_key(n): n for n in names | set(_MAIN_PARAMETER)}


def _fill(value: Any, fill: Mapping[str, Any]) -> Any:
    if isinstance(value, str) and value.startswith("{") and value.endswith("}") and value[1:-1] in fill:
        return fill[value[1:-1]]
    return value


def _apply_override(kind: str, name: str, key: str, class_name: str, kwargs: dict[str, Any], value: Any) -> Any:
    if value is None or value is False:
        return None
    if value is True:
        return (class_name, dict(kwargs))
    if isinstance(value, Algorithm):
        return value
    if isinstance(value, Mapping):
        return (class_name, {**kwargs, **value})
    if isinstance(value, (int, float, str)):
        main = _MAIN_PARAMETER.get(class_name)
        if main is None:
            raise ValueError(
                f"{kind}({name!r}, {key}={value!r}): {class_name} has no single main hyper-parameter to set "
                f"from a plain value. Pass a dict of its arguments instead, e.g. {key}={{...}}."
            )
        return (class_name, {**kwargs, main: value})
    raise ValueError(
        f"{kind}({name!r}, {key}={value!r}): expected a number or string (its main hyper-parameter), a dict of "
        f"arguments, an Algorithm instance, True (keep) or None/False (drop); got {type(value).__name__}."
    )


def _instantiate(kind: str, name: str, entry: tuple[str, dict[str, Any]], library: Mapping[str, type]) -> Algorithm:
    class_name, kwargs = entry
    cls = library.get(class_name)
    if cls is None:
        raise ValueError(
            f"{kind}({name!r}) needs {class_name}, which composer_bridge.algorithms does not provide in this "
            f"version. Drop it with {override_key(class_name)}=None, or pass your own instance with "
            f"{override_key(class_name)}=MyAlgorithm(...)."
        )
    try:
        return cls(**kwargs)
    except TypeError as error:
        raise TypeError(f"{kind}({name!r}): could not build {class_name}(**{kwargs!r}): {error}") from error
