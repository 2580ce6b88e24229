"""Fusions written into a loaded step graph (runtime/step_graphs.py), with ONNX Runtime's contrib operators only,
so the graph ONNX Runtime runs has the same nodes on every provider and version instead of whatever its own
optimizer finds (which the engine turns off on the CPU: runtime/providers.py).

``fuse_skip_layer_norm``: each post-norm residual, LayerNorm(x + (y·W + b)), becomes one
``SkipLayerNormalization(y·W, x, gamma, beta, b)``: the bias Add, the residual Add and the LayerNorm in one
kernel, 3 nodes to 1 per sub-layer (the default decoder step's 9 sub-layers: 18 fewer). It makes what ONNX
Runtime's own SkipLayerNormFusion makes where that is on (the same 53 nodes from the greedy step's 71), but as
part of the graph: the device greedy step has it on the CPU provider too, where the engine turns ONNX Runtime's
fusion off, so the tests run and count the graph a GPU runs.
"""

from __future__ import annotations

import onnx
from onnx import helper

CONTRIB = "com.microsoft"


def fuse_skip_layer_norm(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (changed in place and returned) with each LayerNormalization over a residual Add fused into a
    SkipLayerNormalization, the sub-layer's bias folded in where it is an Add of a 1-D weight read by nothing
    else; a LayerNormalization that does not read such an Add is left as it is."""
    graph = model.graph
    made_by = {output: node for node in graph.node for output in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    weights = {tensor.name: tensor for tensor in graph.initializer}
    gone: set[int] = set()
    replaced: dict[int, onnx.NodeProto] = {}
    for node in graph.node:
        residual = made_by.get(node.input[0])
        if node.op_type != "LayerNormalization" or residual is None or residual.op_type != "Add":
            continue
        if readers[residual.output[0]] != 1 or _axis(node) != -1:
            continue
        x, skip, bias = _sub_layer(residual, made_by, readers, weights)
        inputs = [x, skip, node.input[1], node.input[2] if len(node.input) > 2 else ""]
        if bias is not None:
            inputs.append(bias.input[1] if bias.input[1] in weights else bias.input[0])
            gone.add(id(bias))
        fused = helper.make_node(
            "SkipLayerNormalization",
            _trimmed(inputs),
            [node.output[0]],
            name=f"{node.name}.skip",
            domain=CONTRIB,
            epsilon=_epsilon(node),
        )
        gone.add(id(residual))
        replaced[id(node)] = fused
    nodes = [replaced.get(id(node), node) for node in graph.node if id(node) not in gone]
    del graph.node[:]
    graph.node.extend(nodes)
    if replaced and not any(opset.domain == CONTRIB for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(CONTRIB, 1))
    return model


def _sub_layer(residual: onnx.NodeProto, made_by: dict, readers: dict, weights: dict):
    """(the sub-layer's output before its bias, the residual, the bias Add or None) of a residual Add: the
    input made by a bias Add (y·W + b, b a 1-D weight, its sum read by nothing else) is the sub-layer's."""
    for i in (0, 1):
        bias = made_by.get(residual.input[i])
        if bias is None or bias.op_type != "Add" or readers[bias.output[0]] != 1:
            continue
        for j in (0, 1):
            weight = weights.get(bias.input[j])
            if weight is not None and len(weight.dims) == 1 and bias.input[1 - j] not in weights:
                return bias.input[1 - j], residual.input[1 - i], bias
    return residual.input[0], residual.input[1], None


def _trimmed(inputs: list[str]) -> list[str]:
    """Inputs without trailing absent ones (an absent one before a present one stays, as "")."""
    while inputs and not inputs[-1]:
        inputs = inputs[:-1]
    return inputs


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), -1)


def _epsilon(node: onnx.NodeProto) -> float:
    return next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
