"""Imports point down only: core and models (torch only) <- algorithms <- training <- the Lightning adapter <- the package root.

Only the Lightning adapter (and the modules above it) may import Lightning.

Read from the source with ``ast`` (imports inside functions and ``TYPE_CHECKING`` blocks count too),
so a new module is checked as soon as it is added.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import composer_bridge

ROOT = Path(composer_bridge.__file__).parent
# layer -> the composer_bridge modules it may import (by dotted prefix)
ALLOWED = {
    "core": ("composer_bridge.core",),
    "models": ("composer_bridge.models",),  # the example networks some surgeries recognise
    "algorithms": ("composer_bridge.core", "composer_bridge.models", "composer_bridge.algorithms"),
    "training": ("composer_bridge.core", "composer_bridge.models", "composer_bridge.algorithms", "composer_bridge.training"),
    "lightning": ("composer_bridge._version", "composer_bridge.core", "composer_bridge.algorithms",
                  "composer_bridge.training", "composer_bridge.lightning"),
}
MODULES = sorted((layer, path) for layer in ALLOWED for path in (ROOT / layer).rglob("*.py"))


def package_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.split(".")[0] == "composer_bridge"]


@pytest.mark.parametrize(("layer", "path"), MODULES, ids=lambda v: v if isinstance(v, str) else v.name)
def test_a_layer_imports_only_the_layers_below_it(layer: str, path: Path) -> None:
    allowed = ALLOWED[layer]
    upward = [
        f"line {line}: {name}" for line, name in package_imports(path)
        if not any(name == prefix or name.startswith(prefix + ".") for prefix in allowed)
    ]
    assert not upward, f"{layer}/{path.name} imports upward ({', '.join(upward)}); allowed: {', '.join(allowed)}"


@pytest.mark.parametrize(("layer", "path"), [m for m in MODULES if m[0] != "lightning"],
                         ids=lambda v: v if isinstance(v, str) else v.name)
def test_only_the_lightning_adapter_imports_lightning(layer: str, path: Path) -> None:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
        found += [n for n in names if n.split(".")[0] in ("lightning", "pytorch_lightning")]
    assert not found, f"{layer}/{path.name} imports {found}: only composer_bridge.lightning may."



# the packages on top of the adapter -> what docs/code-map.md says each may import: exact modules, and prefixes
# (a module and everything under it); a private module (``_name``) of another package is never allowed
TOP = {
    "search": ({"composer_bridge", "composer_bridge.algorithms", "composer_bridge.recipes", "composer_bridge.core.algorithm",
                "composer_bridge.core.batch", "composer_bridge.lightning.package", "composer_bridge.lightning.module",
                "composer_bridge.lightning.plain_loss", "composer_bridge.lightning.batch_keys"},
               ("composer_bridge.search",)),
    "hf": ({"composer_bridge", "composer_bridge.surgery", "composer_bridge.lightning.module"},
           ("composer_bridge.hf", "composer_bridge.algorithms")),
    "pl": ({"composer_bridge"}, ("composer_bridge.pl", "composer_bridge.lightning", "composer_bridge.hf")),
}
TOP_MODULES = sorted((package, path) for package in TOP for path in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize(("package", "path"), TOP_MODULES, ids=lambda v: v if isinstance(v, str) else v.name)
def test_the_packages_on_top_import_only_what_the_code_map_says(package: str, path: Path) -> None:
    exact, prefixes = TOP[package]
    wrong = []
    for line, name in package_imports(path):
        own = name == f"composer_bridge.{package}" or name.startswith(f"composer_bridge.{package}.")
        private = any(part.startswith("_") for part in name.split(".")[1:])
        allowed = name in exact or any(name == p or name.startswith(p + ".") for p in prefixes)
        if not allowed or (private and not own):
            wrong.append(f"line {line}: {name}")
    assert not wrong, f"{package}/{path.name} imports {', '.join(wrong)}; docs/code-map.md allows {sorted(exact)} " \
                      f"and everything under {list(prefixes)}"
