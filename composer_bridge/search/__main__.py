"""``python -m composer_bridge.search --config search.yaml``: the recipe search from a LightningCLI-style config.

The config names your module and data the way LightningCLI does (``class_path`` and
``init_args``); the search builds a fresh one for every fit, passing ``total_steps`` to the
module's class (or function) when it takes that argument and ``seed`` to the data's::

    module:
      class_path: my_project.models.MyModule      # a LightningModule class, or a function returning one
      init_args: {lr: 0.1}
    data:
      class_path: my_project.data.MyDataModule    # a LightningDataModule, or a function -> (train, val) loaders
      init_args: {batch_size: 64}
    search:                                       # search_recipe's arguments
      monitor: val/acc
      mode: max
      candidates: [BlurPool, LabelSmoothing, {algorithm: MixUp, kwargs: {alpha: 0.2}}]
      run_lengths: [50, 100, 200]
      max_train_seconds: 600
      search_seeds: [0, 1]
      confirm_seeds: [1000, 1001, 1002]
      also_confirm: {published mild: mild}        # recipes of composer_bridge.recipes, by name
      starting_recipes: {mine: [BlurPool, LabelSmoothing]}  # optional: absent = the published ones that apply
      target: 0.9                                 # optional: the quality you need (default: your baseline run's best)
      confidence: 0.8                             # optional: how sure a change must be to be taken
      proxy: {fraction: 0.25}                     # optional: search on runs a quarter as long, confirm at full size
                                                  # (the greedy search's: with it, method is greedy)
      screen: 0.3333                              # optional: the share of a step kept at each run length but the longest (null: all)
      shortlist: false                            # optional: later steps try only what the first look kept (cheaper, loses pairs)
    trainer: {accelerator: cpu, devices: 1}       # your Trainer arguments
    executor: {name: ray, workers: 2, cpus_per_fit: 1}   # optional: fits side by side on Ray
                                                  # (RayExecutor's arguments; address: for a cluster)
    out: outputs/search                           # state, tables, plot, recipe.py, recipe.yaml
    wandb: auto                                   # the table to W&B offline when wandb is installed

Run it again with the same ``out`` to resume an interrupted search or re-report a finished one.
``--executor ray --workers 2`` (and ``--address host:6379``) override the config's ``executor``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from composer_bridge.search.candidates import Candidate, from_recipe
from composer_bridge.search.errors import SearchInputError
from composer_bridge.search.proxy import Proxy
from composer_bridge.search.results import SearchResult
from composer_bridge.search.search import search_recipe

__all__ = ["factory", "main"]

SECTIONS = {"module", "data", "search", "trainer", "out", "wandb", "executor"}
EXECUTOR_KEYS = {"name", "address", "workers", "cpus_per_fit", "gpus_per_fit", "runtime_env"}


def _import(path: str) -> Any:
    module_name, _, attribute = str(path).rpartition(".")
    if not module_name:
        raise SearchInputError(f"class_path={path!r}: expected a dotted path, e.g. my_project.models.MyModule.")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise SearchInputError(f"class_path={path!r}: cannot import it ({error}). Is its package on PYTHONPATH?") from error


class _Build:
    """``target(**init_args, passes=value)``: a factory that pickles (a Ray worker or child process can take it)."""

    def __init__(self, target: Any, init_args: dict[str, Any], passes: str | None) -> None:
        self.target, self.init_args, self.passes = target, init_args, passes

    def __call__(self, value: Any) -> Any:
        return self.target(**self.init_args, **({self.passes: value} if self.passes else {}))


def factory(section: dict[str, Any], name: str, passes: str) -> Callable[[Any], Any]:
    """A function ``f(value)`` that builds ``section``'s ``class_path`` with ``init_args`` (and ``passes=value``
    when the class or function takes that argument).

    Examples:
        >>> make = factory({"class_path": "collections.OrderedDict", "init_args": {"a": 1}}, "data", "seed")
        >>> dict(make(0))
        {'a': 1}
    """
    if not isinstance(section, dict) or "class_path" not in section:
        raise SearchInputError(f"{name}: expected a mapping with class_path (and init_args), got {section!r}.")
    target = _import(section["class_path"])
    init_args = dict(section.get("init_args") or {})
    try:
        takes = passes in inspect.signature(target).parameters
    except (TypeError, ValueError):
        takes = False

    return _Build(target, init_args, passes if takes else None)


def _candidates(items: Any) -> list[Candidate | str] | None:
    if items is None:
        return None
    out: list[Candidate | str] = []
    for item in items:
        if isinstance(item, dict):
            unknown = set(item) - {"algorithm", "kwargs", "name"}
            if "algorithm" not in item or unknown:
                raise SearchInputError(f"search.candidates: {item!r}: expected a class name or "
                                       "{algorithm: Name, kwargs: {...}, name: label}.")
            out.append(Candidate(item["algorithm"], dict(item.get("kwargs") or {}), item.get("name")))
        else:
            out.append(str(item))
    return out


def proxy_from(section: Any, run_lengths: Any) -> Proxy:
    """The search's proxy from the config's ``search.proxy``: ``{fraction: 0.25}`` (that share of every run
    length) or ``{run_lengths: [...]}``, and optionally ``module``/``data`` sections as at the top level.

    Examples:
        >>> proxy_from({"fraction": 0.25}, [100, 200, 400]).run_lengths
        (25, 50, 100)
    """
    if not isinstance(section, dict) or not set(section) <= {"fraction", "run_lengths", "module", "data"}:
        raise SearchInputError(f"search.proxy: {section!r}: expected a mapping with fraction or run_lengths, and "
                               "optionally module and data sections (class_path, init_args), e.g. {fraction: 0.25}.")
    lengths = section.get("run_lengths")
    if section.get("fraction") is not None:
        if lengths is not None:
            raise SearchInputError("search.proxy: give fraction or run_lengths, not both.")
        try:
            lengths = Proxy.shorter(run_lengths, section["fraction"]).run_lengths
        except ValueError as error:
            raise SearchInputError(f"search.proxy: {error}") from None
    module = factory(section["module"], "proxy.module", "total_steps") if section.get("module") else None
    data = factory(section["data"], "proxy.data", "seed") if section.get("data") else None
    return Proxy(run_lengths=lengths, make_module=module, make_data=data)


def executor_from(section: Any) -> Any:
    """The search's executor from the config's ``executor`` (``None``, ``local``, ``ray``, or a mapping).

    Examples:
        >>> executor_from(None) is None, executor_from({"name": "local"}) is None
        (True, True)
    """
    if section is None or section == "local":
        return None
    given = section
    if isinstance(section, str):
        section = {"name": section}
    if not isinstance(section, dict) or section.get("name") not in ("local", "ray") or set(section) - EXECUTOR_KEYS:
        raise SearchInputError(f"executor: {given!r}: expected 'local' (fits one at a time here), 'ray', or "
                               f"{{name: ray, ...}} with keys among {sorted(EXECUTOR_KEYS - {'name'})}.")
    if section["name"] == "local":
        return None
    from composer_bridge.search.ray_executor import RayExecutor

    return RayExecutor(**{k: v for k, v in section.items() if k != "name"})


def main(argv: list[str] | None = None) -> SearchResult:
    """Parse ``--config``, run the search, write its outputs and print its summary."""
    parser = argparse.ArgumentParser(prog="python -m composer_bridge.search", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a YAML file (see the module docstring)")
    parser.add_argument("--out", default=None, help="overrides the config's out")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--executor", choices=("local", "ray"), default=None, help="overrides the config's executor")
    parser.add_argument("--workers", type=int, default=None, help="Ray: fits at once on a Ray started here")
    parser.add_argument("--address", default=None, help="Ray: a running cluster (host:6379, ray://host:10001, auto)")
    args = parser.parse_args(argv)
    config = yaml.safe_load(Path(args.config).read_text()) or {}
    unknown = sorted(set(config) - SECTIONS)
    if unknown:
        raise SearchInputError(f"{args.config}: unknown sections {unknown}; expected {sorted(SECTIONS)}.")
    section = config.get("executor")
    section = {"name": section} if isinstance(section, str) else dict(section or {})
    for key in ("executor", "workers", "address"):
        if getattr(args, key) is not None:
            section["name" if key == "executor" else key] = getattr(args, key)
    if section and "name" not in section:
        section["name"] = "ray"  # --workers / --address alone mean Ray
    executor = executor_from(section or None)
    settings = dict(config.get("search") or {})
    settings["candidates"] = _candidates(settings.get("candidates"))
    also = settings.pop("also_confirm", None) or {}
    settings["also_confirm"] = {name: (from_recipe(recipe) if isinstance(recipe, str) else _candidates(recipe))
                                for name, recipe in also.items()}
    if settings.get("starting_recipes") is not None:  # absent: the published recipes that apply
        settings["starting_recipes"] = {
            name: (from_recipe(recipe) if isinstance(recipe, str) else _candidates(recipe))
            for name, recipe in settings["starting_recipes"].items()}
    if settings.get("proxy") is not None:
        settings["proxy"] = proxy_from(settings["proxy"], settings.get("run_lengths", (50, 100, 200)))
    out = Path(args.out or config.get("out") or "outputs/search")
    allowed = set(inspect.signature(search_recipe).parameters) - {"make_module", "make_data", "trainer_kwargs",
                                                                    "state_dir", "executor"}
    wrong = sorted(set(settings) - allowed)
    if wrong:
        raise SearchInputError(f"{args.config}: search: unknown keys {wrong}; it takes search_recipe's arguments "
                               f"{sorted(allowed)}.")
    result = search_recipe(
        factory(config.get("module"), "module", "total_steps"), factory(config.get("data"), "data", "seed"),
        trainer_kwargs=config.get("trainer") or {}, state_dir=out, executor=executor,
        progress=not args.no_progress and settings.pop("progress", True), **settings)
    result.write(out, wandb=config.get("wandb", "auto"))
    print(result.summary())
    print(f"\n{result.python_code()}")  # the run to start: its algorithms, max_steps and the schedule's length
    return result


if __name__ == "__main__":
    main()
