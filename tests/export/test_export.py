from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from export import __main__ as export_main
from export import pipeline
from export.cache_ops import DTYPES, OPS, build
from export.parity import ParityReport, check_graphs
from model.checkpoint import load_checkpoint
from model.translate import TorchTranslator
from runtime import offline
from runtime.backend import OrtBackend
from runtime.batch import pad_sources
from runtime.contract import CANDIDATE_OUTPUTS
from runtime.device_cache import cache_op_path
from runtime.manifest import read_manifest
from runtime.options import EngineSettings, RuntimeOptions
from runtime.search import Decoding
from tests.conftest import own_sentences


def test_manifest_describes_the_folder(tiny_export: Path):
    manifest = read_manifest(tiny_export)
    assert set(manifest["variants"]) == {"fp32", "int8", "fp16"}
    assert manifest["variants"]["fp32"]["parity"]["passed"] is True
    assert manifest["variants"]["fp32"]["parity"]["decoder_max_abs_diff"] <= 1e-4
    assert manifest["variants"]["fp32"]["quality"]["greedy_token_agreement_with_pytorch"] == 1.0
    assert {"onnxruntime", "onnx", "torch"} <= set(manifest["versions"])
    decoder_inputs = [i["name"] for i in manifest["graphs"]["decoder"]["inputs"]]
    step = ["tokens", "lengths", "total_length", "groups", "row_position", "src_mask", "top_k"]
    search_head = ["row_scores", "candidate_bias"]
    assert decoder_inputs == step + search_head + [
        f"{part}_{kind}_{i}" for part in ("past", "cross") for i in range(2) for kind in ("key", "value")
    ]
    decoder_outputs = [o["name"] for o in manifest["graphs"]["decoder"]["outputs"]]
    assert decoder_outputs[:6] == ["top_log_probs", "top_ids", "eos_log_probs", *CANDIDATE_OUTPUTS]
    assert set(manifest["files"]) == {p.name for p in tiny_export.iterdir()} - {"manifest.json"}
    assert manifest["export_command"].startswith("python -m export")


def test_the_folder_is_readable_by_other_users(tiny_export: Path):
    """Exported through a private temporary folder, the result still gets a new folder's permissions (the
    image's server runs as another user than the export)."""
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(tiny_export.stat().st_mode) == 0o777 & ~umask
    assert all(stat.S_IMODE(f.stat().st_mode) & 0o444 == 0o444 & ~umask for f in tiny_export.iterdir())


def test_parity_with_rows_of_different_cache_lengths(tiny_checkpoint: Path, tiny_export: Path):
    model, _ = load_checkpoint(tiny_checkpoint)
    sessions = [
        ort.InferenceSession(str(tiny_export / f), providers=["CPUExecutionProvider"])
        for f in ("encoder.onnx", "decoder.onnx")
    ]
    report = check_graphs(model, *sessions)
    assert report.passed, report
    assert report.cases >= 9


def test_existing_output_needs_force(tiny_checkpoint: Path, tiny_export: Path, capsys):
    assert export_main.main(["--checkpoint", str(tiny_checkpoint), "--out", str(tiny_export)]) == 1
    assert "already exists, use --force to override" in capsys.readouterr().err


def test_failed_parity_writes_nothing(tiny_checkpoint: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(pipeline, "check_graphs", lambda *a, **k: ParityReport(1.0, 1.0, 1, 1e-4))
    out = tmp_path / "model"
    assert export_main.main(["--checkpoint", str(tiny_checkpoint), "--out", str(out)]) == 1
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_check_command_passes_on_an_export(tiny_export: Path):
    result = subprocess.run(
        [sys.executable, "-m", "export.check", "--model", str(tiny_export)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["fp32"]["passed"] is True


def test_cache_op_graphs_are_the_ones_the_builder_writes():
    """The shipped one-node graphs (the server cannot build them: no onnx package) are current."""
    for op in OPS:
        for dtype in DTYPES:
            assert cache_op_path(op, dtype).read_bytes() == build(op, dtype), f"run python -m export.cache_ops ({op})"


def test_graphs_name_the_ir_version_of_their_opset(tiny_export: Path):
    """An onnx newer than the onnxruntime that loads the graphs must not stamp its own latest IR version
    (onnx 1.23 writes 14; onnxruntime-gpu 1.31 reads up to 13 and refused our export on a GPU machine)."""
    import onnx

    from export.builder import IR_VERSION

    graphs = sorted(tiny_export.glob("*.onnx")) + [cache_op_path(op, dtype) for op in OPS for dtype in DTYPES]
    versions = {path.name: onnx.load(str(path), load_external_data=False).ir_version for path in graphs}
    assert len(versions) >= 7 and set(versions.values()) == {IR_VERSION}, versions


def test_a_checkpoints_length_penalty_reaches_the_engine(tiny_checkpoint: Path, tmp_path: Path, monkeypatch):
    """The α a checkpoint was tuned with goes into the manifest; the engine's beam searches are made with
    it and translate as PyTorch does with the same α."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config["decoding"] = {"length_penalty": 2.0}
    (checkpoint / "config.json").write_text(json.dumps(config))
    assert export_main.main(["--checkpoint", str(checkpoint), "--out", str(tmp_path / "model")]) == 0
    assert read_manifest(tmp_path / "model")["decoding"] == {"length_penalty": 2.0}
    runtime = OrtBackend(tmp_path / "model", RuntimeOptions(settings=EngineSettings(provider="cpu")))
    assert runtime.length_penalty == 2.0
    model, tokenizer = load_checkpoint(checkpoint)
    ids = tokenizer.encode_source(own_sentences(40))
    tuned = TorchTranslator(model, tokenizer, max_output_tokens=20, length_penalty=2.0).translate_ids(ids, 3)
    alphas: list[float] = []
    search = Decoding.search
    monkeypatch.setattr(Decoding, "search", lambda self, *a: alphas.append(self.alpha) or search(self, *a))
    assert offline.translate_ids(runtime, ids, 3, max_output_tokens=20) == tuned
    assert set(alphas) == {2.0}


def test_the_encoder_multiplies_real_tokens_only(tiny_checkpoint: Path):
    """Padding removed: every matrix product runs over the batch's real tokens, and each source's outputs
    at its real tokens are what it gets encoded alone."""
    import onnx

    from export.encoder import build_encoder

    model, _ = load_checkpoint(tiny_checkpoint)
    graph = build_encoder(model)
    products = [node.output[0] for node in graph.graph.node if node.op_type == "MatMul"]
    graph.graph.output.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in products
    )
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    c = model.config
    sources = [[5, 6, 7], list(range(5, 45)), [8]]
    src, mask = pad_sources(sources, c.pad_id, c.eos_id)
    memory, cross_k, _, *outputs = session.run(None, {"src_tokens": src, "src_mask": mask})
    assert src.size == 3 * 41 and {output.shape[0] for output in outputs} == {int(mask.sum())} == {4 + 41 + 2}
    for row, source in enumerate(sources):
        alone, alone_mask = pad_sources([source], c.pad_id, c.eos_id)
        memory_alone, k_alone, _, *_ = session.run(None, {"src_tokens": alone, "src_mask": alone_mask})
        real = int(alone_mask.sum())
        np.testing.assert_allclose(memory[row, :real], memory_alone[0], atol=1e-5)
        np.testing.assert_allclose(cross_k[:, row, :, :real], k_alone[:, 0], atol=1e-5)
