"""The aligner graph's export (export/aligner.py) on the tiny model: the manifest records its file, its parity
with PyTorch's ``Transformer.alignment`` and the readings that place markup (runtime/aligner.py runs it)."""

from __future__ import annotations

from pathlib import Path

from export.aligner import ALIGNMENT_READINGS
from runtime.manifest import read_manifest


def test_export_records_the_aligner_and_its_parity(tiny_export: Path):
    aligner = read_manifest(tiny_export)["aligner"]
    assert aligner["file"] == "aligner.onnx"
    assert aligner["parity_max_abs_diff"] <= 1e-4
    layers = 2  # the tiny model's decoder layers
    assert aligner["readings"] == [[layer % layers, offset] for layer, offset in ALIGNMENT_READINGS]
