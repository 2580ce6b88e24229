"""The aligner graph's export (export/aligner.py) on the tiny model: the manifest records its file, its parity
with PyTorch's ``Transformer.alignment`` and the readings that place markup (runtime/aligner.py runs it), and, with
--int8, its int8 form's file and parity."""

from __future__ import annotations

from pathlib import Path

from export.aligner import ALIGNMENT_READINGS
from export.pipeline import INT8_ALIGNER_TOLERANCE
from runtime.manifest import read_manifest


def test_export_records_the_aligner_and_its_parity(tiny_export: Path):
    aligner = read_manifest(tiny_export)["aligner"]
    assert aligner["file"] == "aligner.onnx"
    assert aligner["parity_max_abs_diff"] <= 1e-4
    layers = 2  # the tiny model's decoder layers
    assert aligner["readings"] == [[layer % layers, offset] for layer, offset in ALIGNMENT_READINGS]


def test_export_with_int8_records_the_int8_aligner_and_its_parity(tiny_export: Path):
    int8 = read_manifest(tiny_export)["aligner"]["int8"]
    assert int8["file"] == "aligner.int8.onnx" and (tiny_export / int8["file"]).is_file()
    assert 0 < int8["parity_max_abs_diff"] <= INT8_ALIGNER_TOLERANCE
