"""Graph rewrites applied after export: ONNX Runtime optimization and int8."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

from runtime.providers import NO_FUSIONS


def optimize(source: Path, target: Path) -> Path:
    """Apply ONNX Runtime's extended graph optimizations (fusions that every provider can
    run) and save the result, so serving skips them at start-up."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(target)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"], disabled_optimizers=NO_FUSIONS)
    return target


# How int8 weights are stored (recorded in the manifest). Activations are u8, quantized on the fly; weights s8 per
# output channel in 7 bits (reduce_range): on CPUs without VNNI (AVX2, AVX-512 alone) ONNX Runtime's u8×s8
# kernel sums pairs of products in 16 bits (VPMADDUBSW), which 8-bit weights overflow (2 × 255 × 127 > 32,767)
# and 7-bit ones never do (2 × 255 × 64). test_2016_flickr BLEU en→de / de→en, fp32 40.09 / 38.63 on both CPUs
# (2-core AMD EPYC with avx512_vnni, and the same under qemu-user -cpu EPYC-Rome: AVX2, no VNNI):
#   8-bit weights: VNNI 40.24 / 38.78, no VNNI 38.75 / 38.67 (en→de loses 1.34)
#   7-bit weights: VNNI 40.23 / 38.79, no VNNI 40.23 / 38.74
# With VNNI the 7-bit weights ran at 0.98-0.99x / 1.05-1.12x the 8-bit ones' tokens/s (translate-file --workers 1
# --threads 2 --max-repeats 0, medians of 5, alternating, two runs); u8 weights (U8U8) never saturate either, but
# ran at 0.70-0.72x / 0.77-0.81x.
INT8_QUANTIZATION = {"activations": "uint8, dynamic", "weights": "int8, per channel", "reduce_range": True}


# What ONNX Runtime's quantizer logs on the root logger for every graph not run through its quant_pre_process
# (shape inference and optimization): the pipeline quantizes the graph as built and optimizes it afterwards, so
# the advice is not a fault, yet it came twice per model and read like one.
PRE_PROCESSING_ADVICE = "Please consider to run pre-processing before quantization"


def _not_pre_processing_advice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(PRE_PROCESSING_ADVICE)


@contextlib.contextmanager
def _without_pre_processing_advice() -> Iterator[None]:
    root = logging.getLogger()
    root.addFilter(_not_pre_processing_advice)
    try:
        yield
    finally:
        root.removeFilter(_not_pre_processing_advice)


def quantize_int8(source: Path, target: Path) -> Path:
    """Dynamic int8 quantization of the MatMul weights (activations quantized on the fly), for CPU."""
    with _without_pre_processing_advice():
        quantize_dynamic(
            source,
            target,
            op_types_to_quantize=["MatMul"],
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=INT8_QUANTIZATION["reduce_range"],
            # Shape inference stops at contrib operators (the decoder's attention): the rest is float.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    return target
