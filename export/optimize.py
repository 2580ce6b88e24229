"""Graph rewrites applied after export: ONNX Runtime optimization, int8, fp16."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.float16 import convert_float_to_float16


def optimize(source: Path, target: Path) -> Path:
    """Apply ONNX Runtime's extended graph optimizations (fusions that every provider can
    run) and save the result, so serving skips them at start-up."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(target)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
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


def _position_nodes(graph: onnx.GraphProto) -> list[str]:
    """Nodes from the encoder's positions (its Range) up to the Sin/Cos of the sinusoidal encoding:
    kept in fp32, since fp16 cannot hold position × frequency precisely beyond a few hundred
    positions. (The decoder step looks its positions up in a table computed in fp32.)"""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    frontier = [node for node in graph.node if node.op_type == "Range"]
    blocked: dict[str, onnx.NodeProto] = {}
    while frontier:
        node = frontier.pop()
        if node.name in blocked:
            continue
        blocked[node.name] = node
        if node.op_type in ("Sin", "Cos"):
            continue
        for output in node.output:
            frontier += consumers.get(output, [])
    return list(blocked)


def convert_fp16(source: Path, target: Path) -> Path:
    """fp16 weights and activations (for CUDA); inputs/outputs that were float become float16."""
    model = onnx.load(str(source))
    blocked = _position_nodes(model.graph)
    converted = convert_float_to_float16(model, keep_io_types=False, node_block_list=blocked)
    onnx.save(converted, str(target))
    return target
