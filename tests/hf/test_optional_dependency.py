"""transformers stays optional: the library imports without it; composer_bridge.hf brings it in."""

from __future__ import annotations

import subprocess
import sys

from helpers.support import REPO


def test_importing_the_library_does_not_import_transformers():
    code = (
        "import sys, composer_bridge, composer_bridge.algorithms, composer_bridge.functional, composer_bridge.recipes\n"
        "composer_bridge.recipes.language('gpt-fast', max_seq_length=32)\n"
        "print('transformers' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_pyproject_declares_the_extra_and_ci_installs_it():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: tomllib is new in 3.11; pytest itself depends on tomli there
        import tomli as tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("transformers") for dep in project["dependencies"])
    hf = project["optional-dependencies"]["hf"]
    assert any(dep.startswith("transformers") for dep in hf)
    assert set(hf) <= set(project["optional-dependencies"]["dev"])  # the README's test command installs it


def test_importing_composer_bridge_hf_registers_its_policies():
    import composer_bridge.hf as hf
    from composer_bridge.algorithms.alibi import default_alibi_policy
    from composer_bridge.algorithms.gated_linear_units import default_glu_policy

    def registered():
        alibi, glu = default_alibi_policy(), default_glu_policy()
        return ({cls: alibi.get(cls) for cls in hf.ALIBI_POLICY}, {cls: glu.get(cls) for cls in hf.GLU_POLICY})

    assert registered() == (hf.ALIBI_POLICY, hf.GLU_POLICY)
    hf.register_hf_policies()  # again: nothing changes
    assert registered() == (hf.ALIBI_POLICY, hf.GLU_POLICY)
    assert len(default_alibi_policy()) == 3 + len(hf.ALIBI_POLICY)
