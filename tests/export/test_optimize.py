"""export/optimize.py: an int8 export says what it did and nothing that reads like trouble."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from export.optimize import PRE_PROCESSING_ADVICE
from runtime.manifest import read_manifest


def test_an_int8_export_prints_no_pre_processing_advice(tiny_checkpoint: Path, tmp_path: Path):
    out = tmp_path / "model"
    command = [sys.executable, "-m", "export", "--checkpoint", str(tiny_checkpoint), "--out", str(out), "--int8"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "int8" in read_manifest(out)["variants"]
    printed = result.stdout + result.stderr
    assert PRE_PROCESSING_ADVICE not in printed, printed
    assert printed.strip() == f"exported {tiny_checkpoint} to {out}", printed
