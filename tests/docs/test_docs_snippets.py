"""Every ```python block of README.md and docs/**/*.md runs as written.

The blocks are extracted from the Markdown and run in one fresh interpreter (started once, to keep
the whole check within seconds), each block in a fresh namespace of its own, in a temporary
working directory, with W&B offline and one torch thread. Two visible markers, on the line before a block, change that:

- ``<!-- snippet: skip (reason) -->`` leaves the block out (for what cannot run here, such as a
  multi-GPU launch); the reason is required and shows in the skip message.
- ``<!-- snippet: continues -->`` runs the block in the namespace of the previous block of the same
  page (a page that builds one example over several blocks).

A failing block is reported with its page, line, and the error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP = re.compile(r"<!--\s*snippet:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->")
CONTINUES = re.compile(r"<!--\s*snippet:\s*continues\s*-->")


@dataclass(frozen=True)
class Snippet:
    page: str  #: path relative to the repository root
    line: int  #: line of the opening fence
    code: str
    skip: str | None  #: the reason, for a block marked to skip
    continues: bool  #: runs in the previous block's namespace

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def extract(path: Path, root: Path = ROOT) -> list[Snippet]:
    """The ```python blocks of one Markdown page, with the marker on the line before each (if any)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    snippets, i = [], 0
    while i < len(lines):
        opening = lines[i].strip()
        if opening.startswith("```python") or opening == "```py":
            indent = len(lines[i]) - len(lines[i].lstrip())
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            skip = SKIP.search(before)
            body = "\n".join(line[indent:] for line in lines[i + 1: j])
            snippets.append(Snippet(str(path.relative_to(root)), i + 1, body,
                                    skip.group("reason") if skip else None, bool(CONTINUES.search(before))))
            i = j
        i += 1
    return snippets


ALL = [snippet for page in pages() for snippet in extract(page)]

# Runs in the child interpreter: reads the snippets as JSON on stdin, writes one result per snippet.
RUNNER = r"""
import json, sys, traceback, warnings
warnings.filterwarnings("ignore")
import torch
torch.set_num_threads(1)  # the snippets are tiny; one thread keeps them quick on shared cores
snippets = json.load(sys.stdin)
results, namespaces = {}, {}
for s in snippets:
    if s["skip"]:
        continue
    namespace = namespaces.get(s["page"]) if s["continues"] else None
    if namespace is None:
        namespace = {"__name__": "__snippet__"}
    namespaces[s["page"]] = namespace
    try:
        exec(compile(s["code"], s["id"], "exec"), namespace)
        results[s["id"]] = None
    except BaseException:
        results[s["id"]] = traceback.format_exc(limit=6)
print("@@RESULTS@@" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    payload = json.dumps([{"page": s.page, "id": s.id, "code": s.code, "skip": s.skip, "continues": s.continues}
                          for s in ALL])
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", RUNNER], input=payload, capture_output=True, text=True,
                          cwd=tmp_path_factory.mktemp("snippets"), env=env, timeout=300)
    marker = done.stdout.rfind("@@RESULTS@@")
    assert marker >= 0, f"the snippet runner died:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(done.stdout[marker + len("@@RESULTS@@"):])


def test_the_extractor_finds_blocks_markers_and_indentation(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\nx = 1\n```\n\n<!-- snippet: skip (needs 8 GPUs) -->\n```python\ny = 2\n```\n"
                    "<!-- snippet: continues -->\n\n```python\nz = x\n```\n- item\n\n    ```python\n    w = 3\n    ```\n"
                    "```bash\nls\n```\n")
    found = extract(page, root=tmp_path)
    assert [(s.line, s.code, s.skip, s.continues) for s in found] == [
        (3, "x = 1", None, False), (8, "y = 2", "needs 8 GPUs", False), (13, "z = x", None, True),
        (18, "w = 3", None, False)]


def test_there_are_snippets_to_check() -> None:
    assert len(ALL) > 20 and any(s.page == "README.md" for s in ALL)


@pytest.mark.parametrize("snippet", ALL, ids=[s.id for s in ALL])
def test_snippet_runs(snippet: Snippet, results: dict[str, str | None]) -> None:
    if snippet.skip:
        pytest.skip(f"marked in the page: {snippet.skip}")
    assert snippet.id in results, f"{snippet.id} was not run"
    error = results[snippet.id]
    assert error is None, f"{snippet.id} raised:\n{error}\n--- the block ---\n{snippet.code}"
