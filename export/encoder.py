"""The encoder graph, written node by node from the model's weights (not traced).

Inputs:   src_tokens (B, S) int64, src_mask (B, S) bool (True on real tokens)
Outputs:  memory (B, S, D), cross_k / cross_v (L, B, H, S, d_k): every decoder layer's
          cross-attention keys and values, which is what the decoder step takes.

Each layer is a fused Q·K·V projection, ONNX Runtime's ``MultiHeadAttention`` with the
source mask as key padding mask, and fused skip-layer-norms (about 10 nodes per layer against
about 40 in the traced graph, most of them the head reshapes and transposes that the fused
operator does inside). The cross-attention keys and values of all decoder layers come from
one matrix product, reshaped and transposed once.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from export.builder import (
    IR_VERSION,
    MS_DOMAIN,
    OPSET,
    GraphBuilder,
    feed_forward,
    layer_norm,
    position_table,
    residual,
)
from model.transformer import Transformer


def build_encoder(model: Transformer, dtype: type[np.floating] = np.float32) -> onnx.ModelProto:
    """The encoder graph of ``model`` (``Transformer.encode`` then ``cross_kv``), float32 or float16."""
    model = model.eval().float()
    c = model.config
    d_model, heads, layers = c.d_model, c.n_heads, c.n_decoder_layers
    b = GraphBuilder(dtype)
    embed = model.embedding.weight.detach().float().numpy() * model.embed_scale
    zero, one = b.constant("zero", np.array([0], np.int64)), b.constant("one", np.array([1], np.int64))
    length = b.one("Slice", [b.one("Shape", ["src_tokens"]), one, b.constant("two", np.array([2], np.int64))])  # [S]
    tokens = b.one("Gather", [b.constant("embedding", embed), "src_tokens"])  # (B, S, D)
    x = b.one("Add", [tokens, b.one("Slice", [b.constant("positions", position_table(c)), zero, length])])
    mask = b.one("Cast", ["src_mask"], to=TensorProto.INT32)
    thirds = b.constant("thirds", np.array([d_model] * 3, np.int64))
    for i, layer in enumerate(model.encoder_layers):
        name = f"encoder.{i}"

        def self_attention(h: str, layer=layer, name=name) -> str:
            q, k, v = b.op("Split", [b.linear(h, layer.self_attn.qkv_proj, f"{name}.qkv"), thirds], 3, axis=-1)
            attended = b.one("MultiHeadAttention", [q, k, v, "", mask], domain=MS_DOMAIN, num_heads=heads)
            return b.linear(attended, layer.self_attn.out_proj, f"{name}.out")

        x = residual(b, x, layer.attn_block, f"{name}.attn", self_attention)
        x = residual(
            b, x, layer.ffn_block, f"{name}.ffn", lambda h, f=layer.ffn, n=name: feed_forward(b, h, f, c.activation, n)
        )
    if c.norm == "pre":
        x = layer_norm(b, x, model.encoder_norm, "encoder.norm")
    b.op("Identity", [x], ["memory"])
    # Every decoder layer's keys, then every layer's values, from one product: (B, S, 2·L·D).
    kv = [layer.cross_attn.kv_proj for layer in model.decoder_layers]
    weight = np.concatenate(
        [p.weight.detach().float().numpy()[part] for part in (slice(0, d_model), slice(d_model, None)) for p in kv]
    )
    bias = np.concatenate(
        [p.bias.detach().float().numpy()[part] for part in (slice(0, d_model), slice(d_model, None)) for p in kv]
    )
    product = b.one("MatMul", ["memory", b.constant("cross.kv.weight", weight.T)])
    product = b.one("Add", [product, b.constant("cross.kv.bias", bias)])
    split_heads = b.constant("kv_heads", np.array([0, 0, 2 * layers, heads, c.d_head], np.int64))
    kv_heads = b.one(
        "Transpose", [b.one("Reshape", [product, split_heads])], perm=[2, 0, 3, 1, 4]
    )  # (2L, B, H, S, d_k)
    b.op(
        "Split", [kv_heads, b.constant("halves", np.array([layers, layers], np.int64))], ["cross_k", "cross_v"], axis=0
    )

    f = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    value = helper.make_tensor_value_info
    inputs = [
        value("src_tokens", TensorProto.INT64, ["batch", "src_len"]),
        value("src_mask", TensorProto.BOOL, ["batch", "src_len"]),
    ]
    cross = [layers, "batch", heads, "src_len", c.d_head]
    outputs = [
        value("memory", f, ["batch", "src_len", d_model]),
        value("cross_k", f, cross),
        value("cross_v", f, cross),
    ]
    graph = helper.make_graph(b.nodes, "encoder", inputs, outputs, b.initializers)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name="translation-service")
