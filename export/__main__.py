"""Export a checkpoint for serving: ``python -m export [--checkpoint DIR] --out DIR [--int8] [--fp16]``.

A fixed pipeline: load and validate the checkpoint, export the encoder and
decoder-step graphs, optimize, check parity against PyTorch, quantize, measure
each variant, and write the folder with its manifest. A model that fails
parity is not written.

``--format marian`` writes a Hugging Face MarianMT folder instead (see export/marian.py), by
default in OPUS-MT's layout, which CTranslate2's converter accepts.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import sacrebleu
import torch

from export.aligner import ALIGNMENT_READINGS, build_aligner, check_aligner
from export.builder import OPSET
from export.graphs import ENCODER_AXES, ENCODER_INPUTS, ENCODER_OUTPUTS, export_graphs
from export.manifest import sha256, write_manifest
from export.marian import export_marian
from export.optimize import optimize, quantize_int8
from export.parity import FP32_TOLERANCE, check_graphs
from export.runtime import NO_FUSIONS, OrtModel, RuntimeOptions
from model.checkpoint import (
    DEFAULT_CHECKPOINT,
    WEIGHTS_FILE,
    length_penalty,
    load_checkpoint,
    read_config,
    tokenizer_spec,
)
from model.corpus import corpus_path, read_lines
from model.marian import DEFAULT_LAYOUT, LAYOUTS, MarianError
from model.translate import TorchTranslator

CHECK_SENTENCES = Path(__file__).resolve().parent / "sentences.en"
# Max abs difference of graph outputs vs PyTorch. int8 has none: its quality is judged by BLEU.
TOLERANCES = {"fp32": FP32_TOLERANCE, "fp16": 5e-2, "int8": None}


class ExportError(RuntimeError):
    """The export cannot proceed; the message says what to do."""


@dataclass(frozen=True)
class ExportConfig:
    checkpoint: Path
    out: Path
    int8: bool = False
    fp16: bool = False
    eval_data: Path | None = None
    eval_split: str = "test_2016_flickr"
    eval_sentences: int = 0
    force: bool = False
    format: str = "onnx"
    marian_layout: str = DEFAULT_LAYOUT


def parse_args(argv: Sequence[str] | None) -> ExportConfig:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=DEFAULT_CHECKPOINT,
        help="checkpoint folder (default: the embedded default model)",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder to write")
    parser.add_argument("--int8", action="store_true", help="also write a dynamically quantized int8 variant (CPU)")
    parser.add_argument("--fp16", action="store_true", help="also write an fp16 variant (CUDA)")
    parser.add_argument("--eval-data", type=Path, help="corpus folder: measure each variant's BLEU on --eval-split")
    parser.add_argument("--eval-split", default="test_2016_flickr")
    parser.add_argument("--eval-sentences", type=int, default=0, help="limit the BLEU evaluation (0 = all)")
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    parser.add_argument(
        "--format",
        choices=["onnx", "marian"],
        default="onnx",
        help="onnx: the folder the server loads; marian: a Hugging Face MarianMT folder (transformers, CTranslate2)",
    )
    parser.add_argument(
        "--marian-layout",
        choices=LAYOUTS,
        default=DEFAULT_LAYOUT,
        help="marian: OPUS-MT's ids and start token (<pad> last, zero start embedding, the start token folded "
        "into decoder position 0), which CTranslate2's converter needs (default), or ours (exact round trip)",
    )
    args = parser.parse_args(argv)
    return ExportConfig(**vars(args))


def graph_signature(session: ort.InferenceSession) -> dict:
    def describe(args):
        return [
            {"name": a.name, "type": a.type, "shape": [d if isinstance(d, int) else str(d) for d in a.shape]}
            for a in args
        ]

    return {"inputs": describe(session.get_inputs()), "outputs": describe(session.get_outputs())}


def evaluate(model: OrtModel, cfg: ExportConfig, reference_ids: list[list[int]], sentences: list[str]) -> dict:
    """Agreement of greedy token ids with PyTorch on the check sentences, and BLEU if a corpus is given."""
    ids = model.tokenizer.encode_source(sentences)
    agreement = sum(a == b for a, b in zip(model.translate_ids(ids), reference_ids, strict=True)) / len(ids)
    quality = {"greedy_token_agreement_with_pytorch": agreement, "check_sentences": len(ids)}
    if cfg.eval_data:
        src = read_lines(corpus_path(cfg.eval_data, cfg.eval_split, "en"))
        ref = read_lines(corpus_path(cfg.eval_data, cfg.eval_split, "de"))
        if cfg.eval_sentences:
            src, ref = src[: cfg.eval_sentences], ref[: cfg.eval_sentences]
        metric = sacrebleu.BLEU()
        score = metric.corpus_score(model.translate(src), [ref]).score
        quality.update(
            bleu_greedy=round(score, 2),
            bleu_signature=str(metric.get_signature()),
            eval_split=cfg.eval_split,
            eval_sentences=len(src),
        )
    return quality


def run(cfg: ExportConfig) -> Path:
    if cfg.out.exists() and not cfg.force:
        raise ExportError(f"{cfg.out} already exists, use --force to override")
    if cfg.format == "marian":
        if cfg.int8 or cfg.fp16 or cfg.eval_data:
            raise ExportError("--int8, --fp16 and --eval-data apply to --format onnx only")
        return export_marian(cfg.checkpoint, cfg.out, read_lines(CHECK_SENTENCES), cfg.marian_layout)
    if cfg.marian_layout != DEFAULT_LAYOUT:
        raise ExportError("--marian-layout applies to --format marian only")
    model, tokenizer = load_checkpoint(cfg.checkpoint)
    checkpoint_config = read_config(cfg.checkpoint)
    sentences = read_lines(CHECK_SENTENCES)
    reference_ids = TorchTranslator(model, tokenizer).translate_ids(tokenizer.encode_source(sentences))
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cfg.out.parent, prefix=f".{cfg.out.name}.", ignore_cleanup_errors=True) as tmp:
        folder, raw = Path(tmp), Path(tmp) / "raw"
        raw.mkdir()
        raw_encoder, raw_decoder = export_graphs(model, raw)
        for path in (raw_encoder, raw_decoder):
            onnx.checker.check_model(str(path), full_check=True)
        variants = {"fp32": {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}}
        optimize(raw_encoder, folder / "encoder.onnx")
        optimize(raw_decoder, folder / "decoder.onnx")
        if cfg.int8:
            variants["int8"] = {"encoder": "encoder.int8.onnx", "decoder": "decoder.int8.onnx"}
            for part, source in (("encoder", raw_encoder), ("decoder", raw_decoder)):
                optimize(quantize_int8(source, raw / f"{part}.int8.onnx"), folder / f"{part}.int8.onnx")
        onnx.save(build_aligner(model), str(raw / "aligner.onnx"))
        optimize(raw / "aligner.onnx", folder / "aligner.onnx")
        if cfg.fp16:
            variants["fp16"] = {"encoder": "encoder.fp16.onnx", "decoder": "decoder.fp16.onnx"}
            export_graphs(model, folder, np.float16)  # not optimized on the CPU: that would bake in its casts
        shutil.rmtree(raw)
        tokenizer_files = tokenizer_spec(cfg.checkpoint)
        for name in tokenizer_files["files"]:
            shutil.copy(cfg.checkpoint / name, folder / name)

        real_sources = tokenizer.encode_source(sentences)
        for name, files in variants.items():
            files["parity"] = variant_parity(model, folder, name, real_sources)
        aligner_session = ort.InferenceSession(
            str(folder / "aligner.onnx"), providers=["CPUExecutionProvider"], disabled_optimizers=NO_FUSIONS
        )
        aligner = {
            "file": "aligner.onnx",
            "readings": [[layer % model.config.n_decoder_layers, offset] for layer, offset in ALIGNMENT_READINGS],
            "parity_max_abs_diff": check_aligner(model, aligner_session, real_sources, reference_ids, FP32_TOLERANCE),
        }
        sessions = load_sessions(folder, "fp32")
        signature = {"encoder": graph_signature(sessions[0]), "decoder": graph_signature(sessions[1])}
        manifest = {
            "name": checkpoint_config.get("name", cfg.checkpoint.name),
            "source_language": checkpoint_config.get("source_language", "en"),
            "target_language": checkpoint_config.get("target_language", "de"),
            "model_config": model.config.to_dict(),
            "decoding": {"length_penalty": length_penalty(cfg.checkpoint)},
            "special_ids": vars(tokenizer.special_ids),
            "tokenizer": tokenizer_files,
            "graphs": signature,
            "dynamic_axes": {"encoder": ENCODER_AXES},
            "io_names": {"encoder": [ENCODER_INPUTS, ENCODER_OUTPUTS]},
            "opset": OPSET,
            "versions": {"onnxruntime": ort.__version__, "onnx": onnx.__version__, "torch": torch.__version__},
            "checkpoint": {"path": str(cfg.checkpoint), "weights_sha256": sha256(cfg.checkpoint / WEIGHTS_FILE)},
            "variants": variants,
            "aligner": aligner,
            "export_command": "python -m export " + shlex.join(sys.argv[1:]),
        }
        write_manifest(folder, manifest)  # hashes first, so the quality pass loads a verified folder
        for name, files in variants.items():
            runtime = OrtModel(
                folder, RuntimeOptions(variant=name, provider="cuda" if name == "fp16" and _cuda() else "cpu")
            )
            files["quality"] = evaluate(runtime, cfg, reference_ids, sentences)
        write_manifest(folder, manifest)
        if cfg.out.exists():
            shutil.rmtree(cfg.out)
        folder.rename(cfg.out)
    # The temporary folder was made private (0700): give the export the permissions of any new folder,
    # so that a server running as another user (the image's uid 10001) can read it.
    umask = os.umask(0)
    os.umask(umask)
    cfg.out.chmod(0o777 & ~umask)
    return cfg.out


def _cuda() -> bool:
    return "CUDAExecutionProvider" in ort.get_available_providers()


def load_sessions(folder: Path, variant: str, provider: str = "CPUExecutionProvider") -> tuple:
    files = {"fp32": ("encoder.onnx", "decoder.onnx")}.get(
        variant, (f"encoder.{variant}.onnx", f"decoder.{variant}.onnx")
    )
    return tuple(
        ort.InferenceSession(str(folder / f), providers=[provider], disabled_optimizers=NO_FUSIONS) for f in files
    )


def variant_parity(model, folder: Path, name: str, real_sources) -> dict:
    """fp32 must match PyTorch within FP32_TOLERANCE or nothing is written; int8 differences
    are recorded (its quality is judged by BLEU); fp16 runs on CUDA where present, else on CPU."""
    provider = "CUDAExecutionProvider" if name == "fp16" and _cuda() else "CPUExecutionProvider"
    report = check_graphs(model, *load_sessions(folder, name, provider), real_sources, TOLERANCES[name])
    if name == "fp32" and not report.passed:
        raise ExportError(f"fp32 parity failed: {report.to_dict()}; the model was not written")
    return {**report.to_dict(), "provider": provider}


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        out = run(cfg)
    except (ExportError, MarianError) as e:
        print(f"export: {e}", file=sys.stderr)
        return 1
    print(f"exported {cfg.checkpoint} to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
