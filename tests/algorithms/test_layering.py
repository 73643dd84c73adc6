"""algorithms/ holds algorithms: no algorithm module imports another, shared code lives in private modules.

Read from the source with ``ast`` (imports inside functions and ``TYPE_CHECKING`` blocks count too),
so a new module is checked as soon as it is added.
"""

from __future__ import annotations

import ast
import doctest
import importlib
from pathlib import Path

import pytest

import composer_bridge.algorithms as algorithms

PACKAGE = "composer_bridge.algorithms"
MODULES = sorted(p for p in Path(algorithms.__file__).parent.glob("*.py") if p.name != "__init__.py")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, as ``(line, dotted name)``; ``from pkg import a`` gives ``pkg.a``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                base = PACKAGE.rsplit(".", node.level - 1)[0] if node.level > 1 else PACKAGE
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            # ``from composer_bridge.algorithms import mixup`` imports a module by its name
            found += [(node.lineno, f"{module}.{alias.name}" if module == PACKAGE else module) for alias in node.names]
    return found


def algorithm_imports(path: Path) -> list[tuple[int, str]]:
    """The imports of ``composer_bridge.algorithms`` modules (the package itself included)."""
    return [(line, name) for line, name in imported_modules(path) if name == PACKAGE or name.startswith(PACKAGE + ".")]


def is_private(name: str) -> bool:
    return name != PACKAGE and name[len(PACKAGE) + 1:].split(".")[0].startswith("_")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_modules_in_algorithms_import_only_private_algorithm_modules(path: Path) -> None:
    wrong = [f"line {line}: {name}" for line, name in algorithm_imports(path) if not is_private(name)]
    assert not wrong, (
        f"{path.name} imports other algorithm modules ({', '.join(wrong)}); move what they share into a "
        "private module composer_bridge/algorithms/_<name>.py and import it from there."
    )


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_modules_in_algorithms_import_no_lightning(path: Path) -> None:
    lightning = [name for _, name in imported_modules(path) if name.split(".")[0] in ("lightning", "pytorch_lightning")]
    assert not lightning, f"{path.name} imports {lightning}: algorithms must not know Lightning."


def test_the_check_catches_an_algorithm_importing_another(tmp_path: Path) -> None:
    source = tmp_path / "fake.py"
    source.write_text(
        "from composer_bridge.algorithms._draws import random_int\n"
        "from composer_bridge.algorithms import _boxes\n"
        "from composer_bridge.algorithms.mixup import mixup_batch\n"
        "def later():\n    from . import cutmix\n    import composer_bridge.algorithms.cutout\n"
        "from composer_bridge.algorithms import EMA\n"
    )
    offenders = [name for _, name in algorithm_imports(source) if not is_private(name)]
    assert offenders == [
        "composer_bridge.algorithms.mixup", "composer_bridge.algorithms.EMA",
        "composer_bridge.algorithms.cutmix", "composer_bridge.algorithms.cutout",
    ]


def test_shared_names_stay_importable_where_users_import_them() -> None:
    from composer_bridge.algorithms import NoEffectWarning, SurgeryAlgorithm, replace_modules
    from composer_bridge.algorithms._surgery import SurgeryAlgorithm as private

    assert SurgeryAlgorithm is private and issubclass(NoEffectWarning, UserWarning) and callable(replace_modules)
    assert not {"NoEffectWarning", "SurgeryAlgorithm", "replace_modules"} & set(algorithms.__all__), (
        "__all__ lists algorithm classes only"
    )


@pytest.mark.parametrize("name", ["_draws", "_boxes", "_targets", "_mixing", "_low_precision", "_library_policies", "_pil_images"])
def test_private_modules_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(f"{PACKAGE}.{name}")
    assert doctest.testmod(module).failed == 0
