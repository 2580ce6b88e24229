"""Fusions written into a step graph (runtime/fusions.py): each post-norm residual's bias, Add and LayerNorm become
one SkipLayerNormalization that computes what they did; what does not match the pattern is left as it was."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from runtime.fusions import fuse_skip_layer_norm
from runtime.step_graphs import greedy_step_graph
from tests.runtime.step_feeds import greedy_step_feeds


def test_the_fused_greedy_step_computes_what_the_greedy_step_computes(tiny_export: Path):
    step = onnx.load(str(tiny_export / "decoder.onnx"))
    plain, fused = greedy_step_graph(step), fuse_skip_layer_norm(greedy_step_graph(step))
    ops, before = Counter(node.op_type for node in fused.graph.node), Counter(n.op_type for n in plain.graph.node)
    layers = before["GroupQueryAttention"]
    assert ops["SkipLayerNormalization"] == before["LayerNormalization"] == 3 * layers and not ops["LayerNormalization"]
    assert before["Add"] - ops["Add"] == 2 * 3 * layers  # each sub-layer's bias and residual
    sessions = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (plain, fused)]
    inputs = greedy_step_feeds(sessions[0], [5, 17, 9], [5, 5, 5], cache_len=16, src_len=7)
    (log_p, ids, *presents), (fused_log_p, fused_ids, *fused_presents) = (s.run(None, inputs) for s in sessions)
    np.testing.assert_array_equal(fused_ids, ids)
    np.testing.assert_allclose(fused_log_p, log_p, atol=1e-5)
    for a, b in zip(fused_presents, presents, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_layer_norm_over_no_residual_and_a_bias_read_twice_are_left_as_they_are():
    """LayerNorm(x) stays; LayerNorm(x + (y + b)) with y + b also read elsewhere keeps that Add and fuses the rest."""
    width = 4
    weight = lambda name, value: numpy_helper.from_array(np.full(width, value, np.float32), name)  # noqa: E731
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["plain"], axis=-1, epsilon=1e-5),
        helper.make_node("Add", ["y", "b"], ["biased"]),
        helper.make_node("Add", ["plain", "biased"], ["sum"]),
        helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["out"], axis=-1, epsilon=1e-5),
        helper.make_node("Relu", ["biased"], ["also"]),
    ]
    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, width]) for name in ("x", "y")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, width]) for name in ("out", "also")]
    weights = [weight("gamma", 1.5), weight("beta", 0.25), weight("b", 0.5)]
    model = helper.make_model(
        helper.make_graph(nodes, "g", values, outputs, weights), opset_imports=[helper.make_opsetid("", 17)]
    )
    rng = np.random.default_rng(1)
    inputs = {
        "x": rng.standard_normal((2, width)).astype(np.float32),
        "y": rng.standard_normal((2, width)).astype(np.float32),
    }
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    fused = fuse_skip_layer_norm(model)
    assert [node.op_type for node in fused.graph.node] == [
        "LayerNormalization",
        "Add",
        "SkipLayerNormalization",
        "Relu",
    ]
    skip = fused.graph.node[2]
    assert sorted(skip.input[:2]) == ["biased", "plain"] and len(skip.input) == 4  # no bias folded in
    got = ort.InferenceSession(fused.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
