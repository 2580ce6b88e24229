"""The aligner (runtime/aligner.py) on the tiny model: its graph's cross-attention probabilities against PyTorch's
``Transformer.alignment`` within 1e-5, one pair at a time, batched with padding on both sides and in groups;
``align`` is the mean of the manifest's readings; an int8 engine runs the int8 form, within the export's int8 tolerance,
and the fp32 graph where the folder has none; a folder exported without the graph is refused with what to do."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from export.aligner import aligner_layers
from export.pipeline import INT8_ALIGNER_TOLERANCE
from model.checkpoint import load_checkpoint
from runtime import aligner, offline
from runtime.backend import OrtBackend
from runtime.manifest import ModelFolderError, read_manifest, write_manifest
from runtime.options import EngineSettings, RuntimeOptions
from tests.conftest import own_sentences
from tests.runtime.spies import counted

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


def older_export(export: Path, tmp_path: Path, left_out: str, forget: Callable[[dict], object]) -> Path:
    """A copy of ``export`` without the file ``left_out``, its manifest as ``forget`` leaves it: a folder exported
    before that file existed."""
    folder = tmp_path / "older"
    folder.mkdir()
    manifest = read_manifest(export)
    for name in manifest.pop("files"):
        if name != left_out:
            (folder / name).write_bytes((export / name).read_bytes())
    forget(manifest)
    del manifest["manifest_revision"]
    write_manifest(folder, manifest)
    return folder


def int8(folder: Path) -> OrtBackend:
    return OrtBackend(folder, RuntimeOptions(settings=EngineSettings(variant="int8")))


def test_an_int8_engine_aligns_with_the_int8_graph_within_its_tolerance(tiny_export: Path, pairs):
    quantized = int8(tiny_export)
    encoded = quantized.encode_sources([source for source, _ in pairs])
    kept = [encoded.source(i) for i in range(len(pairs))]
    got, expected = quantized.aligner.align(pairs, kept), OrtBackend(tiny_export).aligner.align(pairs, kept)
    for one, other in zip(got, expected, strict=True):
        assert 0 < np.abs(one - other).max() <= INT8_ALIGNER_TOLERANCE  # another graph, near the same


def test_an_int8_engine_without_an_int8_aligner_runs_the_fp32_one(tiny_export: Path, tmp_path: Path, pairs):
    """A folder exported before the int8 aligner existed (or whose int8 form failed its tolerance)."""
    folder = older_export(tiny_export, tmp_path, "aligner.int8.onnx", lambda manifest: manifest["aligner"].pop("int8"))
    quantized = int8(folder)
    encoded = quantized.encode_sources([source for source, _ in pairs])
    kept = [encoded.source(i) for i in range(len(pairs))]  # one encoder's output for both: the graphs alone differ
    got, expected = quantized.aligner.align(pairs, kept), OrtBackend(folder).aligner.align(pairs, kept)
    for one, other in zip(got, expected, strict=True):
        np.testing.assert_array_equal(one, other)


def test_pairs_aligned_in_several_groups_come_back_in_their_own_order(tiny_export: Path, pairs, monkeypatch):
    """Pairs are aligned in groups of ALIGN_GROUP by length: each result is its own pair's, as in one group."""
    runtime = OrtBackend(tiny_export)
    shuffled = [pairs[i] for i in (3, 0, 5, 1, 4, 2)]
    whole = runtime.aligner.alignments(shuffled)
    encoded = []
    encode = runtime.aligner.encode
    runtime.aligner.encode = lambda tokens, mask: encoded.append(len(tokens)) or encode(tokens, mask)
    monkeypatch.setattr(aligner, "ALIGN_GROUP", 2)
    grouped = runtime.aligner.alignments(shuffled)
    assert encoded == [2, 2, 2]
    for (source, output), got, expected in zip(shuffled, grouped, whole, strict=True):
        assert got.shape[1:] == (len(output) + 1, len(source) + 1)
        np.testing.assert_allclose(got, expected, atol=TOLERANCE)


def test_a_folder_without_an_aligner_says_to_export_again(tiny_export: Path, tmp_path: Path, pairs):
    folder = older_export(tiny_export, tmp_path, "aligner.onnx", lambda manifest: manifest.pop("aligner"))
    with pytest.raises(ModelFolderError, match="exported without an aligner.*python -m export --out"):
        OrtBackend(folder).aligner.align(pairs[:1])


def test_sources_kept_from_their_decodings_encoder_call_are_not_encoded_again(tiny_export: Path, pairs):
    """A sentence's encoder output, kept from the call that encoded it among others (``EncodedSources.source``:
    its own tokens, without the group's padding), aligns as encoding it again would, without another encoder call;
    a group where any source was not kept is encoded whole."""
    runtime = OrtBackend(tiny_export)
    fresh = runtime.aligner.align(pairs)
    encoded = runtime.encode_sources([source for source, _ in pairs])  # one padded call, as a lane's join makes
    kept = [encoded.source(i) for i in range(len(pairs))]
    assert [state.cross_k.shape[3] for state in kept] == [len(source) + 1 for source, _ in pairs]
    calls = Counter()
    runtime.aligner.encode = counted(calls, "encode", runtime.aligner.encode)
    for got, expected in zip(runtime.aligner.align(pairs, kept), fresh, strict=True):
        np.testing.assert_allclose(got, expected, atol=TOLERANCE)
    assert calls["encode"] == 0
    runtime.aligner.align(pairs, [*kept[:-1], None])
    assert calls["encode"] == 1
