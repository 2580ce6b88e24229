"""Reading line-aligned corpora (plain or .gz). No torch: the load generator uses it."""

from __future__ import annotations

import gzip
from pathlib import Path

# Where the Multi30k corpus (SPLIT.LANG.gz) is unless a --data flag says otherwise: beside the repository, in
# the shared data folder, whatever the working directory.
MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def read_lines(path: str | Path) -> list[str]:
    """Lines of a plain or gzipped UTF-8 file, without their newlines."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def read_parallel(source: str | Path, target: str | Path) -> tuple[list[str], list[str]]:
    src, tgt = read_lines(source), read_lines(target)
    if len(src) != len(tgt):
        raise ValueError(f"{source} has {len(src)} lines but {target} has {len(tgt)}; files must be line-aligned")
    return src, tgt


def corpus_path(directory: str | Path, split: str, lang: str) -> Path:
    """``DIR/split.lang.gz`` or ``DIR/split.lang``, whichever exists."""
    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        if (Path(directory) / name).exists():
            return Path(directory) / name
    raise FileNotFoundError(f"no {split}.{lang}[.gz] in {directory}")
