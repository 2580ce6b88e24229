"""Output folders written whole or not at all: the checkpoint an import writes (model/marian.py), the Marian
folder and the ONNX folder an export writes (export/marian.py, export/pipeline.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A temporary folder beside ``out`` to write into; it replaces ``out`` when the block succeeds and vanishes
    when it raises, so a reader never sees half a folder. The temporary folder is private (0700) while it is
    written; it ends with the permissions of any new folder, so that a server running as another user (the
    image's uid 10001) can read it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.", ignore_cleanup_errors=True) as tmp:
        yield Path(tmp)
        if out.exists():
            shutil.rmtree(out)
        Path(tmp).rename(out)
    umask = os.umask(0)
    os.umask(umask)
    out.chmod(0o777 & ~umask)
