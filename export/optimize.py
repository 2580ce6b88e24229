"""Graph rewrites applied after export: ONNX Runtime optimization and int8."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

from export.runtime import NO_FUSIONS


def optimize(source: Path, target: Path) -> Path:
    """Apply ONNX Runtime's extended graph optimizations (fusions that every provider can
    run) and save the result, so serving skips them at start-up."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(target)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"], disabled_optimizers=NO_FUSIONS)
    return target


def quantize_int8(source: Path, target: Path) -> Path:
    """Dynamic int8 quantization of the MatMul weights (activations quantized on the fly), for CPU."""
    quantize_dynamic(
        source,
        target,
        op_types_to_quantize=["MatMul"],
        weight_type=QuantType.QInt8,
        per_channel=True,
        # Shape inference stops at contrib operators (the decoder's attention): the rest is float.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    return target
