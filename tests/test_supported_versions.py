"""docs/versions.md's "Supported versions" table, pyproject.toml, .ci/corner and the README say the same thing."""

from __future__ import annotations

import re

from helpers.support import REPO

PYPROJECT = (REPO / "pyproject.toml").read_text()
TABLE = {
    row[0]: row[1:]
    for row in (
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in (REPO / "docs" / "versions.md").read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| package")
    )
    if len(row) == 4
}


def declared(name: str) -> str:
    found = re.search(rf'"{re.escape(name)}>=([0-9.]+)"', PYPROJECT)
    assert found, f"no {name}>= bound in pyproject.toml"
    return found.group(1)


def test_the_declared_column_is_pyprojects() -> None:
    python = re.search(r'requires-python = ">=([0-9.]+)"', PYPROJECT)
    assert python and TABLE["Python"][2] == f"`>={python.group(1)}`"
    for row, name in [("torch", "torch"), ("lightning / pytorch-lightning", "lightning"),
                      ("torchmetrics", "torchmetrics"), ("transformers (`[hf]`)", "transformers"), ("wandb (`[wandb]`)", "wandb")]:
        assert TABLE[row][2] == f"`>={declared(name)}`", row
    assert declared("lightning") == declared("pytorch-lightning")


def test_the_oldest_tested_are_the_declared_bounds_and_the_newest_torch_is_cis() -> None:
    assert TABLE["torch"][0].startswith(declared("torch") + ".")
    assert TABLE["Python"][0].startswith(re.search(r'requires-python = ">=([0-9.]+)"', PYPROJECT).group(1) + ".")
    assert TABLE["lightning / pytorch-lightning"][0] == f"{declared('lightning')}.0 / {declared('pytorch-lightning')}.0"
    assert TABLE["torchmetrics"][0].startswith(declared("torchmetrics") + ".")
    assert TABLE["transformers (`[hf]`)"][0].startswith(declared("transformers") + ".")
    newest = re.search(r"^NEWEST_TORCH=([0-9.]+)", (REPO / ".ci" / "corner").read_text(), re.MULTILINE)
    assert newest and TABLE["torch"][1] == newest.group(1)


def test_the_readme_and_constraints_name_the_same_torch_range_and_link_the_table() -> None:
    readme, constraints = (REPO / "README.md").read_text(), (REPO / "constraints.txt").read_text()
    bound = f"torch>={declared('torch')}"
    assert f"`{bound}`" in readme and "docs/versions.md" in readme
    assert f"({bound})" in constraints
    assert re.findall(r"torch>=[0-9.]+", readme + constraints) == [bound] * len(re.findall(r"torch>=[0-9.]+", readme + constraints))
