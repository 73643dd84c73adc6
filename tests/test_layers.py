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

