"""What the docs tests read: the pages (README.md and docs/*.md) and where in them a match is."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1
