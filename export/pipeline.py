"""The ONNX export as a fixed pipeline (CTranslate2's ``Converter.convert`` in spirit): load the checkpoint →
validate the request → write the graphs each variant in ``VARIANTS`` asks for → check each against PyTorch →
describe the folder in its manifest → measure each variant → move the folder into place. A model that fails
fp32 parity is not written. The variants differ only by their row of ``VARIANTS``.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import onnxruntime as ort
import sacrebleu
import torch

from common.corpus import corpus_path, read_lines
from common.flags import setting
from export.aligner import ALIGNMENT_READINGS, build_aligner, check_aligner
from export.builder import OPSET
from export.graphs import ENCODER_AXES, ENCODER_INPUTS, ENCODER_OUTPUTS, export_graphs
from export.optimize import INT8_QUANTIZATION, optimize, quantize_int8
from export.parity import FP32_TOLERANCE, check_graphs
from model.checkpoint import (
    DEFAULT_CHECKPOINT,
    WEIGHTS_FILE,
    length_penalty,
    load_checkpoint,
    read_config,
    tokenizer_spec,
)
from model.folders import staged_folder
from model.marian import DEFAULT_LAYOUT
from model.transformer import Transformer
from model.translate import TorchTranslator
from runtime import offline
from runtime.backend import OrtBackend
from runtime.manifest import sha256, write_manifest
from runtime.options import EngineSettings, RuntimeOptions
from runtime.providers import NO_FUSIONS, PROVIDERS, resolve_provider

CHECK_SENTENCES = Path(__file__).resolve().parent / "sentences.en"
# The int8 aligner's largest difference from PyTorch's attention probabilities that is kept. Measured on the default
# model: 0.006 on a test sentence, and over 1,000 test_2016_flickr translations 99.8% of output units aligned to the
# same source word as the fp32 aligner's, tags placed exactly 82.8% against 82.7% (benchmarks/alignment.py's lexicon).
INT8_ALIGNER_TOLERANCE = 0.05
MarianLayout = Literal["opus-mt", "ours"]  # model.marian.LAYOUTS


class ExportError(RuntimeError):
    """The export cannot proceed; the message says what to do."""


@dataclass(frozen=True)
class ExportConfig:
    out: Path = setting(help="folder to write")
    checkpoint: Path = setting(DEFAULT_CHECKPOINT, "the PyTorch checkpoint folder")
    int8: bool = setting(False, "also write a dynamically quantized int8 variant (CPU)")
    fp16: bool = setting(False, "also write an fp16 variant (CUDA)")
    eval_data: Path | None = setting(None, "corpus folder: measure each variant's BLEU on --eval-split")
    eval_split: str = setting("test_2016_flickr", "the split --eval-data is measured on")
    eval_sentences: int = setting(0, "limit the BLEU evaluation to this many sentences (0: all)")
    force: bool = setting(False, "overwrite --out if it exists")
    format: Literal["onnx", "marian"] = setting(
        "onnx", "onnx: the folder the server loads; marian: a Hugging Face MarianMT folder (transformers, CTranslate2)"
    )
    marian_layout: MarianLayout = setting(
        DEFAULT_LAYOUT,
        "marian: OPUS-MT's ids and start token (<pad> last, zero start embedding, the start token folded into "
        "decoder position 0), which CTranslate2's converter needs, or ours (an exact round trip)",
    )


def validate(cfg: ExportConfig) -> None:
    """ExportError naming every reason the export (either format) cannot start, at once."""
    found = []
    if cfg.out.exists() and not cfg.force:
        found.append(f"{cfg.out} already exists, use --force to override")
    if cfg.format == "marian" and (cfg.int8 or cfg.fp16 or cfg.eval_data):
        found.append("--int8, --fp16 and --eval-data apply to --format onnx only")
    if cfg.format == "onnx" and cfg.marian_layout != DEFAULT_LAYOUT:
        found.append("--marian-layout applies to --format marian only")
    if found:
        raise ExportError("; ".join(found))


# --- the variants -------------------------------------------------------------------------------------------

Write = Callable[[Transformer, Path, Path], None]  # (model, raw graphs' folder, output folder)


def _write_fp32(model: Transformer, raw: Path, folder: Path) -> None:
    optimize(raw / "encoder.onnx", folder / "encoder.onnx")
    optimize(raw / "decoder.onnx", folder / "decoder.onnx")


def _write_int8(model: Transformer, raw: Path, folder: Path) -> None:
    for part in ("encoder", "decoder"):
        optimize(quantize_int8(raw / f"{part}.onnx", raw / f"{part}.int8.onnx"), folder / f"{part}.int8.onnx")


def _write_fp16(model: Transformer, raw: Path, folder: Path) -> None:
    export_graphs(model, folder, np.float16)  # not optimized on the CPU: that would bake in its casts


@dataclass(frozen=True)
class Variant:
    name: str
    write: Write
    tolerance: float | None  # max abs difference of graph outputs vs PyTorch; None: recorded, judged by BLEU
    on_cuda: bool  # checked and measured on CUDA where ONNX Runtime has it

    @property
    def files(self) -> dict[str, str]:
        suffix = "" if self.name == "fp32" else f".{self.name}"
        return {"encoder": f"encoder{suffix}.onnx", "decoder": f"decoder{suffix}.onnx"}

    @property
    def device(self) -> str:
        """Where it is checked and measured: "cuda" or "cpu"."""
        return resolve_provider("auto" if self.on_cuda else "cpu")

    @property
    def provider(self) -> str:
        return PROVIDERS[self.device]


VARIANTS = {
    "fp32": Variant("fp32", _write_fp32, FP32_TOLERANCE, on_cuda=False),
    "int8": Variant("int8", _write_int8, None, on_cuda=False),
    "fp16": Variant("fp16", _write_fp16, 5e-2, on_cuda=True),
}


def chosen(cfg: ExportConfig) -> list[Variant]:
    return [VARIANTS["fp32"]] + [VARIANTS[name] for name in ("int8", "fp16") if getattr(cfg, name)]


def load_sessions(folder: Path, variant: str, provider: str = "CPUExecutionProvider") -> tuple:
    files = VARIANTS[variant].files
    return tuple(
        ort.InferenceSession(str(folder / files[part]), providers=[provider], disabled_optimizers=NO_FUSIONS)
        for part in ("encoder", "decoder")
    )


def variant_parity(model: Transformer, folder: Path, name: str, real_sources) -> dict:
    """The variant's graphs against PyTorch; fp32 outside its tolerance is an ExportError (nothing is written)."""
    variant = VARIANTS[name]
    report = check_graphs(model, *load_sessions(folder, name, variant.provider), real_sources, variant.tolerance)
    if name == "fp32" and not report.passed:
        raise ExportError(f"fp32 parity failed: {report.to_dict()}; the model was not written")
    return {**report.to_dict(), "provider": variant.provider}


# --- the pipeline --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckSet:
    """The sentences every variant is checked on, with PyTorch's greedy translation of them."""

    sentences: list[str]
    sources: list[list[int]]
    reference_ids: list[list[int]]


def export(cfg: ExportConfig) -> Path:
    validate(cfg)
    model, tokenizer = load_checkpoint(cfg.checkpoint)
    sentences = read_lines(CHECK_SENTENCES)
    sources = tokenizer.encode_source(sentences)
    check = CheckSet(sentences, sources, TorchTranslator(model, tokenizer).translate_ids(sources))
    with staged_folder(cfg.out) as folder:
        raw = folder / "raw"
        raw.mkdir()
        for path in export_graphs(model, raw):
            onnx.checker.check_model(str(path), full_check=True)
        variants = chosen(cfg)
        for variant in variants:
            variant.write(model, raw, folder)
        onnx.save(build_aligner(model), str(raw / "aligner.onnx"))
        optimize(raw / "aligner.onnx", folder / "aligner.onnx")
        if cfg.int8:
            optimize(quantize_int8(raw / "aligner.onnx", raw / "aligner.int8.onnx"), folder / "aligner.int8.onnx")
        shutil.rmtree(raw)
        tokenizer_files = tokenizer_spec(cfg.checkpoint)
        for name in tokenizer_files["files"]:
            shutil.copy(cfg.checkpoint / name, folder / name)
        files = {v.name: {**v.files, "parity": variant_parity(model, folder, v.name, sources)} for v in variants}
        if "int8" in files:
            files["int8"]["quantization"] = INT8_QUANTIZATION
        aligner = _check_aligner(model, folder, check)
        manifest = describe(cfg, model, folder, files, aligner, tokenizer_files, tokenizer.special_ids)
        write_manifest(folder, manifest)  # hashes first, so the quality pass loads a verified folder
        for variant in variants:
            runtime = OrtBackend(
                folder, RuntimeOptions(settings=EngineSettings(variant=variant.name, provider=variant.device))
            )
            files[variant.name]["quality"] = evaluate(runtime, cfg, check)
        write_manifest(folder, manifest)
    return cfg.out


def _check_aligner(model: Transformer, folder: Path, check: CheckSet) -> dict:
    """The aligner's manifest entry: its file, readings and parity; and its int8 form's, where one was written
    and it holds INT8_ALIGNER_TOLERANCE (else that file is removed, and int8 engines run the fp32 aligner)."""
    entry = {
        "file": "aligner.onnx",
        "readings": [[layer % model.config.n_decoder_layers, offset] for layer, offset in ALIGNMENT_READINGS],
        "parity_max_abs_diff": _aligner_parity(model, folder / "aligner.onnx", check, FP32_TOLERANCE),
    }
    int8 = folder / "aligner.int8.onnx"
    if int8.exists():
        try:
            parity = _aligner_parity(model, int8, check, INT8_ALIGNER_TOLERANCE)
        except AssertionError as e:
            print(f"the int8 aligner was not kept: {e}", file=sys.stderr)
            int8.unlink()
        else:
            entry["int8"] = {"file": int8.name, "parity_max_abs_diff": parity}
    return entry


def _aligner_parity(model: Transformer, path: Path, check: CheckSet, tolerance: float) -> float:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"], disabled_optimizers=NO_FUSIONS)
    return check_aligner(model, session, check.sources, check.reference_ids, tolerance)


def describe(
    cfg: ExportConfig, model: Transformer, folder: Path, files: dict, aligner: dict, tokenizer_files: dict, special_ids
) -> dict:
    """The manifest: what the folder holds, where it came from and how to run it."""
    checkpoint_config = read_config(cfg.checkpoint)
    encoder, decoder = load_sessions(folder, "fp32")
    return {
        "name": checkpoint_config.get("name", cfg.checkpoint.name),
        "source_language": checkpoint_config.get("source_language", "en"),
        "target_language": checkpoint_config.get("target_language", "de"),
        "model_config": model.config.to_dict(),
        "decoding": {"length_penalty": length_penalty(cfg.checkpoint)},
        "special_ids": vars(special_ids),
        "tokenizer": tokenizer_files,
        "graphs": {"encoder": graph_signature(encoder), "decoder": graph_signature(decoder)},
        "dynamic_axes": {"encoder": ENCODER_AXES},
        "io_names": {"encoder": [ENCODER_INPUTS, ENCODER_OUTPUTS]},
        "opset": OPSET,
        "versions": {"onnxruntime": ort.__version__, "onnx": onnx.__version__, "torch": torch.__version__},
        "checkpoint": {"path": str(cfg.checkpoint), "weights_sha256": sha256(cfg.checkpoint / WEIGHTS_FILE)},
        "variants": files,
        "aligner": aligner,
        "export_command": "python -m export " + shlex.join(sys.argv[1:]),
    }


def graph_signature(session: ort.InferenceSession) -> dict:
    def describe(args: Sequence) -> list[dict]:
        return [
            {"name": a.name, "type": a.type, "shape": [d if isinstance(d, int) else str(d) for d in a.shape]}
            for a in args
        ]

    return {"inputs": describe(session.get_inputs()), "outputs": describe(session.get_outputs())}


def evaluate(model: OrtBackend, cfg: ExportConfig, check: CheckSet) -> dict:
    """Agreement of greedy token ids with PyTorch on the check sentences, and BLEU if a corpus is given."""
    ids = check.sources
    matches = zip(offline.translate_ids(model, ids), check.reference_ids, strict=True)
    quality = {"greedy_token_agreement_with_pytorch": sum(a == b for a, b in matches) / len(ids)}
    quality["check_sentences"] = len(ids)
    if cfg.eval_data:
        src = read_lines(corpus_path(cfg.eval_data, cfg.eval_split, "en"))
        ref = read_lines(corpus_path(cfg.eval_data, cfg.eval_split, "de"))
        if cfg.eval_sentences:
            src, ref = src[: cfg.eval_sentences], ref[: cfg.eval_sentences]
        metric = sacrebleu.BLEU()
        score = metric.corpus_score(offline.translate(model, src), [ref]).score
        quality.update(
            bleu_greedy=round(score, 2),
            bleu_signature=str(metric.get_signature()),
            eval_split=cfg.eval_split,
            eval_sentences=len(src),
        )
    return quality
