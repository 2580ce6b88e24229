"""The aligner graph (export/aligner.py) against PyTorch's ``Transformer.alignment``, on the tiny model:
probabilities within 1e-5, one pair at a time and batched with padding on both sides."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from export.aligner import ALIGNMENT_READINGS, aligner_layers
from model.checkpoint import load_checkpoint
from runtime import offline
from runtime.backend import OrtBackend
from runtime.manifest import ModelFolderError, read_manifest, write_manifest
from tests.conftest import own_sentences

TOLERANCE = 1e-5


def reference(model, source: list[int], output: list[int]) -> np.ndarray:
    c = model.config
    src = torch.tensor([[*source, c.eos_id]])
    tgt = torch.tensor([[c.decoder_start_id, *output]])
    with torch.no_grad():
        return model.eval().alignment(src, torch.ones_like(src, dtype=torch.bool), tgt)[:, 0].numpy()


@pytest.fixture(scope="module")
def pairs(tiny_export: Path) -> list[tuple[list[int], list[int]]]:
    runtime = OrtBackend(tiny_export)
    sources = runtime.tokenizer.encode_source(own_sentences(6))
    outputs = offline.translate_ids(runtime, sources, max_output_tokens=24)
    # Teacher-forced: any output will do; cut to different lengths (the tiny model runs to its limit).
    return [(source, output[: 4 + 3 * i]) for i, (source, output) in enumerate(zip(sources, outputs, strict=True))]


def test_export_records_the_aligner_and_its_parity(tiny_export: Path):
    aligner = read_manifest(tiny_export)["aligner"]
    assert aligner["file"] == "aligner.onnx"
    assert aligner["parity_max_abs_diff"] <= 1e-4
    layers = 2  # the tiny model's decoder layers
    assert aligner["readings"] == [[layer % layers, offset] for layer, offset in ALIGNMENT_READINGS]


def test_aligner_matches_pytorch_batched_with_padding(tiny_checkpoint: Path, tiny_export: Path, pairs):
    model, _ = load_checkpoint(tiny_checkpoint)
    assert len({len(s) for s, _ in pairs}) > 1 and len({len(o) for _, o in pairs}) > 1  # ragged on both sides
    runtime = OrtBackend(tiny_export)
    every = runtime.aligner.alignments(pairs)  # one batch: padded sources and outputs
    for (source, output), got in zip(pairs, every, strict=True):
        expected = reference(model, source, output)[: aligner_layers(model)]  # the layers the readings need
        assert got.shape == expected.shape == (aligner_layers(model), len(output) + 1, len(source) + 1)
        np.testing.assert_allclose(got, expected, atol=TOLERANCE)
        np.testing.assert_allclose(got.sum(axis=-1), 1.0, atol=1e-5)  # each row is a distribution over the source


def test_align_is_the_mean_of_the_manifests_readings(tiny_checkpoint: Path, tiny_export: Path, pairs):
    model, _ = load_checkpoint(tiny_checkpoint)
    readings = read_manifest(tiny_export)["aligner"]["readings"]
    for (source, output), got in zip(pairs, OrtBackend(tiny_export).aligner.align(pairs), strict=True):
        every = reference(model, source, output)
        expected = np.mean([every[l, o : o + len(output), : len(source)] for l, o in readings], axis=0)  # noqa: E741
        np.testing.assert_allclose(got, expected, atol=TOLERANCE)


def test_a_folder_without_an_aligner_says_to_export_again(tiny_export: Path, tmp_path: Path, pairs):
    folder = tmp_path / "old"
    folder.mkdir()
    manifest = read_manifest(tiny_export)
    for name in manifest["files"]:
        if name != "aligner.onnx":
            (folder / name).write_bytes((tiny_export / name).read_bytes())
    del manifest["aligner"], manifest["files"], manifest["manifest_revision"]
    write_manifest(folder, manifest)
    with pytest.raises(ModelFolderError, match="exported without an aligner.*python -m export --out"):
        OrtBackend(folder).aligner.align(pairs[:1])
