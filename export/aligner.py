"""The aligner graph: where each output token looked in its source, for placing markup.

A teacher-forced pass of the decoder over a finished translation (``Transformer.alignment``),
written node by node from the weights like the other graphs. It is not on the decoding path:
the server runs it only for texts with markup or placeholders (server/documents/markup.py), once per
sentence after the search, so the decoder step stays as fast as it is.

Inputs:   tgt_tokens (B, T) int64: the start token, then the output (right-padded: causal
          attention keeps padding out of every real position);
          src_mask (B, S) int32 (1 on real tokens);
          cross_k / cross_v (L, B, H, S, d_k) float32: the encoder graph's outputs.
Outputs:  alignment (L', B, T, S) float32: the cross-attention probabilities of the first L' decoder
          layers (those ALIGNMENT_READINGS need), averaged over heads (row t: the step that predicted
          output token t + 1).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from export.builder import (
    IR_VERSION,
    MS_DOMAIN,
    OPSET,
    GraphBuilder,
    feed_forward,
    position_table,
    residual,
)
from model.transformer import Transformer

# Which attention places markup: the mean of these (layer, offset) readings, where offset 0 reads
# output token t's row at the step that predicted it and offset 1 at the step that read it (a layer
# counts from the last when negative). Measured by benchmarks/alignment.py on the default model (a
# tag around a lexicon word lands exactly on its translation): the last layer alone 70.9%, the
# second-to-last 65.2%, this pair 82.7%.
ALIGNMENT_READINGS = ((-2, 0), (0, 1))
# Added to the scores of padded source positions before the softmax (exp underflows to 0).
MASKED = -1e9


def aligner_layers(model: Transformer) -> int:
    """The decoder layers the aligner runs: up to the deepest of ALIGNMENT_READINGS (the rest change none)."""
    n = model.config.n_decoder_layers
    return max(layer % n for layer, _ in ALIGNMENT_READINGS) + 1


def build_aligner(model: Transformer, layers: int | None = None) -> onnx.ModelProto:
    """The aligner graph of ``model`` over its first ``layers`` decoder layers (default: aligner_layers)."""
    model = model.eval().float()
    c = model.config
    d_model, heads, d_head = c.d_model, c.n_heads, c.d_head
    b = GraphBuilder(np.float32)
    embed = model.embedding.weight.detach().float().numpy() * model.embed_scale
    zero, one = b.constant("zero", np.array([0], np.int64)), b.constant("one", np.array([1], np.int64))
    length = b.one("Slice", [b.one("Shape", ["tgt_tokens"]), one, b.constant("two", np.array([2], np.int64))])
    tokens = b.one("Gather", [b.constant("embedding", embed), "tgt_tokens"])  # (B, T, D)
    x = b.one("Add", [tokens, b.one("Slice", [b.constant("positions", position_table(c)), zero, length])])
    # Padded source positions: MASKED, real ones 0, broadcast over heads and queries (B, 1, 1, S).
    real = b.one("Cast", ["src_mask"], to=TensorProto.FLOAT)
    padding = b.one("Sub", [b.constant("unit", np.array(1, np.float32)), real])
    bias = b.one("Mul", [padding, b.constant("masked", np.array(MASKED, np.float32))])
    bias = b.one("Unsqueeze", [bias, b.constant("axes_1_2", np.array([1, 2], np.int64))])
    split_heads = b.constant("split_heads", np.array([0, 0, heads, d_head], np.int64))
    merge_heads = b.constant("merge_heads", np.array([0, 0, d_model], np.int64))
    thirds = b.constant("thirds", np.array([d_model] * 3, np.int64))
    scale = b.constant("scale", np.array(1.0 / math.sqrt(d_head), np.float32))
    first = b.constant("axis_0", np.array([0], np.int64))
    alignments = []
    used = layers or aligner_layers(model)
    for i, layer in enumerate(model.decoder_layers[:used]):
        name = f"decoder.{i}"
        index = b.constant(f"layer_{i}", np.array([i], np.int64))

        def self_attention(h: str, layer=layer, name=name) -> str:
            q, k, v = b.op("Split", [b.linear(h, layer.self_attn.qkv_proj, f"{name}.qkv"), thirds], 3, axis=-1)
            attended = b.one("MultiHeadAttention", [q, k, v], domain=MS_DOMAIN, num_heads=heads, unidirectional=1)
            return b.linear(attended, layer.self_attn.out_proj, f"{name}.self_out")

        def cross_attention(h: str, layer=layer, name=name, index=index) -> str:
            q = b.linear(h, layer.cross_attn.q_proj, f"{name}.cross_q")
            q = b.one("Transpose", [b.one("Reshape", [q, split_heads])], perm=[0, 2, 1, 3])  # (B, H, T, d_k)
            keys = b.one("Squeeze", [b.one("Gather", ["cross_k", index], axis=0), first])  # (B, H, S, d_k)
            values = b.one("Squeeze", [b.one("Gather", ["cross_v", index], axis=0), first])
            scores = b.one("MatMul", [q, b.one("Transpose", [keys], perm=[0, 1, 3, 2])])  # (B, H, T, S)
            weights = b.one("Softmax", [b.one("Add", [b.one("Mul", [scores, scale]), bias])], axis=-1)
            alignments.append(b.one("ReduceMean", [weights], axes=[1], keepdims=0))  # (B, T, S)
            attended = b.one("Transpose", [b.one("MatMul", [weights, values])], perm=[0, 2, 1, 3])  # (B, T, H, d_k)
            return b.linear(b.one("Reshape", [attended, merge_heads]), layer.cross_attn.out_proj, f"{name}.cross_out")

        x = residual(b, x, layer.self_block, f"{name}.self", self_attention)
        x = residual(b, x, layer.cross_block, f"{name}.cross", cross_attention)
        if i < used - 1:  # the last layer's feed-forward block changes no alignment
            x = residual(
                b,
                x,
                layer.ffn_block,
                f"{name}.ffn",
                lambda h, f=layer.ffn, n=name: feed_forward(b, h, f, c.activation, n),
            )
    b.op("Concat", [b.one("Unsqueeze", [a, first]) for a in alignments], ["alignment"], axis=0)

    value = helper.make_tensor_value_info
    cross = [c.n_decoder_layers, "batch", heads, "src_len", d_head]
    inputs = [
        value("tgt_tokens", TensorProto.INT64, ["batch", "tgt_len"]),
        value("src_mask", TensorProto.INT32, ["batch", "src_len"]),
        value("cross_k", TensorProto.FLOAT, cross),
        value("cross_v", TensorProto.FLOAT, cross),
    ]
    outputs = [value("alignment", TensorProto.FLOAT, [used, "batch", "tgt_len", "src_len"])]
    graph = helper.make_graph(b.nodes, "aligner", inputs, outputs, b.initializers)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name="translation-service")


def check_aligner(
    model: Transformer, session, sources: list[list[int]], outputs: list[list[int]], tolerance: float
) -> float:
    """The largest difference between the aligner graph's probabilities and ``Transformer.alignment``
    over (source, output) pairs, one pair at a time; raises AssertionError over ``tolerance``."""
    c = model.config
    worst = 0.0
    for source, output in zip(sources, outputs, strict=True):
        src = np.array([[*source, c.eos_id]], np.int64)
        src_mask = np.ones_like(src, dtype=bool)
        tgt = np.array([[c.decoder_start_id, *output]], np.int64)
        with torch.no_grad():
            memory = model.encode(torch.from_numpy(src), torch.from_numpy(src_mask))
            cross_k, cross_v = (t.numpy() for t in model.cross_kv(memory))
            expected = model.alignment(torch.from_numpy(src), torch.from_numpy(src_mask), torch.from_numpy(tgt))
        feeds = {"tgt_tokens": tgt, "src_mask": src_mask.astype(np.int32), "cross_k": cross_k, "cross_v": cross_v}
        got = session.run(None, feeds)[0]
        worst = max(worst, float(np.abs(got - expected.numpy()[: len(got)]).max()))
    if worst > tolerance:
        raise AssertionError(f"aligner graph differs from PyTorch by {worst:.3g} (tolerance {tolerance:g})")
    return worst
