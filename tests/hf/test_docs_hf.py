"""Every code block of docs/huggingface.md runs as written, and the page is in the docs navigation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "huggingface.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_code_block_runs(index, capsys):
    exec(compile(BLOCKS[index], f"docs/huggingface.md[{index}]", "exec"), {"__name__": "docs"})  # noqa: S102
    last = BLOCKS[index].strip().splitlines()[-1]
    if last.startswith("print(") and "  # " in last:  # the comment shows what it prints
        assert capsys.readouterr().out.strip().splitlines()[-1] == last.split("  # ", 1)[1].strip()


def test_page_is_in_the_nav_and_the_readme():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    assert "huggingface.md" in str(config["nav"])
    assert "docs/huggingface.md" in (ROOT / "README.md").read_text()
