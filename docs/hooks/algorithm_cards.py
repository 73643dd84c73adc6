"""MkDocs hook: every ``docs/algorithms/<name>.md`` method card joins the nav and the algorithms index.

The algorithm developers add cards as they add algorithms; with this hook neither ``mkdocs.yml``
nor ``docs/algorithms/index.md`` has to be edited for a new card. In ``index.md`` the line
``<!-- algorithm-cards -->`` is replaced by a table of the cards: the card's title (its first
``#`` heading) and its first sentence.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MARKER = "<!-- algorithm-cards -->"


def _cards(docs_dir: Path) -> list[Path]:
    return sorted(p for p in (docs_dir / "algorithms").glob("*.md") if p.name != "index.md")


def _title_and_summary(path: Path) -> tuple[str, str]:
    title, summary = path.stem, ""
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# "):
            title = line[2:].strip()
            paragraph: list[str] = []
            for rest in lines[i + 1:]:
                text = rest.strip()
                if paragraph and not text:
                    break
                if text and (paragraph or not text.startswith(("#", "|", "```", "!!!", "<", "[", "-", "*", ">"))):
                    paragraph.append(text)
            summary = re.split(r"(?<=[.!?])\s", " ".join(paragraph), maxsplit=1)[0]
            break
    return title, summary


def on_config(config: Any) -> Any:
    docs_dir = Path(config["docs_dir"])
    cards = [f"algorithms/{p.name}" for p in _cards(docs_dir)]
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and "Algorithms" in entry and isinstance(entry["Algorithms"], list):
            listed = {v if isinstance(v, str) else next(iter(v.values())) for v in entry["Algorithms"]}
            entry["Algorithms"].extend(c for c in cards if c not in listed)
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != "algorithms/index.md" or MARKER not in markdown:
        return markdown
    rows = ["| algorithm | what it does |", "|---|---|"]
    for path in _cards(Path(config["docs_dir"])):
        title, summary = _title_and_summary(path)
        rows.append(f"| [{title}]({path.name}) | {summary.replace('|', '/')} |")
    if len(rows) == 2:
        rows = ["*(No method card yet.)*"]
    return markdown.replace(MARKER, "\n".join(rows))
