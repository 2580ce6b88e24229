"""The decoder-step graph, written node by node from the model's weights (not traced).

One step for R rows, each with its own history, built for speed:

- every row decodes one token, so the states are (R, 1, D) from the embedding to the
  logits, as the attention operators take them, with no reshapes between: the graph holds
  few, fused nodes (about 13 per layer against about 80 in the traced graph);
- masked self-attention is ONNX Runtime's ``GroupQueryAttention`` over a key/value buffer
  per layer that is both the ``past`` input and the ``present`` output: bound to the same
  memory, the step writes each row's new entry in place at that row's own length, and the
  cache is never copied (rows of different lengths need no mask: ``lengths`` is the mask);
- cross-attention is ``MultiHeadAttention`` over each source's keys/values, kept once per
  source and gathered to the rows by ``source_index`` (the beams of a source share them);
- positions are a table lookup; embeddings are pre-scaled;
- only the best ``top_k`` log-probabilities of each row leave the graph (and the log-probability
  of eos, which beam search needs when a hypothesis reaches its length limit), not the
  whole vocabulary.

Inputs:   tokens (R,) int64, lengths (R,) int32 (tokens cached per row = its position),
          total_length () int32 (max(lengths) + 1), source_index (R,) int64,
          src_mask (N, S) int32, top_k (1,) int64,
          past_key_i / past_value_i (R, H, T, d_cache) for each layer i, T ≥ total_length,
          cross_key_i / cross_value_i (N, H, S, d_k)
Outputs:  top_log_probs (R, K) float32, top_ids (R, K) int64, eos_log_probs (R, 1) float32,
          present_key_i / present_value_i: the past buffers with the new entries written.

``GroupQueryAttention`` needs a head size that is a multiple of 8: other sizes are padded with
zero columns (d_cache), which changes no result.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from model.positional import sinusoidal_encoding
from model.search import STEP_OUTPUTS, layer_names
from model.transformer import Transformer

OPSET = 17
MS_DOMAIN = "com.microsoft"
# Positions the table covers: the longest output the engine allows (it caps max_output_tokens to this).
MAX_POSITIONS = 4096
HEAD_MULTIPLE = 8  # GroupQueryAttention's CPU kernel requires head_size % 8 == 0
ACTIVATION_OPS = {"relu": "Relu", "gelu": "Gelu"}  # swish is x · sigmoid(x), two nodes


def cache_head_size(d_head: int) -> int:
    return -(-d_head // HEAD_MULTIPLE) * HEAD_MULTIPLE


class _Builder:
    """Collects nodes and initializers; names are unique by construction."""

    def __init__(self, dtype: type[np.floating]) -> None:
        self.dtype = dtype  # of the weights and states; the log-probabilities are always float32
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def constant(self, name: str, value: np.ndarray) -> str:
        if value.dtype == np.float32:
            value = value.astype(self.dtype)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "", **attrs) -> list[str]:
        """One node; ``outputs`` is a count of fresh names or the names themselves."""
        self._count += 1
        names = (
            outputs if isinstance(outputs, list) else [f"{op_type.lower()}_{self._count}_{k}" for k in range(outputs)]
        )
        node = helper.make_node(op_type, inputs, names, name=f"{op_type}_{self._count}", domain=domain, **attrs)
        self.nodes.append(node)
        return names

    def one(self, op_type: str, inputs: list[str], domain: str = "", **attrs) -> str:
        return self.op(op_type, inputs, 1, domain, **attrs)[0]

    def linear(self, x: str, layer: torch.nn.Linear, name: str, in_order: np.ndarray | None = None) -> str:
        """x · Wᵀ + b with W stored transposed (D_in, D_out), as dynamic int8 quantization wants MatMul."""
        weight = layer.weight.detach().float().numpy().T
        if in_order is not None:  # input features padded: zero rows where the padding is
            padded = np.zeros((len(in_order), weight.shape[1]), np.float32)
            padded[in_order >= 0] = weight[in_order[in_order >= 0]]
            weight = padded
        y = self.one("MatMul", [x, self.constant(f"{name}.weight", weight)])
        if layer.bias is None:
            return y
        return self.one("Add", [y, self.constant(f"{name}.bias", layer.bias.detach().float().numpy())])


def _padded_order(heads: int, d_head: int, d_cache: int) -> np.ndarray:
    """For each padded feature (head h, dim j < d_cache): the unpadded feature it holds, or -1."""
    j = np.arange(d_cache)
    order = np.arange(heads)[:, None] * d_head + j[None, :]
    return np.where(j[None, :] < d_head, order, -1).reshape(-1)


def _padded_qkv(weight: np.ndarray, bias: np.ndarray, heads: int, d_head: int, d_cache: int):
    """The fused Q, K, V projection (3D, D) with each head's rows padded to d_cache (zeros)."""
    order = _padded_order(heads, d_head, d_cache)
    d_model = heads * d_head
    rows = np.concatenate([np.where(order >= 0, order + part * d_model, -1) for part in range(3)])
    w = np.zeros((len(rows), weight.shape[1]), np.float32)
    b = np.zeros(len(rows), np.float32)
    w[rows >= 0], b[rows >= 0] = weight[rows[rows >= 0]], bias[rows[rows >= 0]]
    return w, b


def _layer_norm(b: _Builder, x: str, norm: torch.nn.LayerNorm, name: str, skip: str | None = None) -> str:
    gamma = b.constant(f"{name}.weight", norm.weight.detach().float().numpy())
    beta = b.constant(f"{name}.bias", norm.bias.detach().float().numpy())
    if skip is None:
        return b.one("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=norm.eps)
    return b.one("SkipLayerNormalization", [x, skip, gamma, beta], domain=MS_DOMAIN, epsilon=norm.eps)


def _residual(b: _Builder, x: str, block, name: str, sublayer) -> str:
    """Post-norm LayerNorm(x + Sublayer(x)) as one SkipLayerNormalization; pre-norm x + Sublayer(LN(x))."""
    if block.pre_norm:
        return b.one("Add", [x, sublayer(_layer_norm(b, x, block.norm, f"{name}.norm"))])
    return _layer_norm(b, sublayer(x), block.norm, f"{name}.norm", skip=x)


def build_decoder_step(model: Transformer, dtype: type[np.floating] = np.float32) -> onnx.ModelProto:
    """The decoder-step graph of ``model``, equivalent to ``Transformer.decode_step``: float32, or float16
    weights, caches and states (for CUDA) with the log-softmax in float32."""
    model = model.eval().float()
    c = model.config
    heads, d_head, d_model = c.n_heads, c.d_head, c.d_model
    d_cache = cache_head_size(d_head)
    padded = _padded_order(heads, d_head, d_cache) if d_cache != d_head else None
    b = _Builder(dtype)
    embed = model.embedding.weight.detach().float().numpy() * model.embed_scale
    positions = sinusoidal_encoding(torch.arange(MAX_POSITIONS), d_model, c.positions).numpy()
    token_embedding = b.one("Gather", [b.constant("embedding", embed), "tokens"])
    x = b.one("Add", [token_embedding, b.one("Gather", [b.constant("positions", positions), "lengths"])])  # (R, D)
    key_mask = b.one("Gather", ["src_mask", "source_index"], axis=0)  # (R, S)
    x = b.one("Unsqueeze", [x, b.constant("axis_1", np.array([1], np.int64))])  # (R, 1, D): what attention takes
    for i, layer in enumerate(model.decoder_layers):
        name = f"decoder.{i}"

        def self_attention(h: str, layer=layer, i=i, name=name) -> str:
            proj = layer.self_attn.qkv_proj
            weight, bias = proj.weight.detach().float().numpy(), proj.bias.detach().float().numpy()
            if padded is not None:
                weight, bias = _padded_qkv(weight, bias, heads, d_head, d_cache)
            product = b.one("MatMul", [h, b.constant(f"{name}.qkv.weight", weight.T)])
            qkv = b.one("Add", [product, b.constant(f"{name}.qkv.bias", bias)])  # (R, 1, 3·H·d_cache)
            cache = [f"past_key_{i}", f"past_value_{i}"]
            outputs = [f"attended_{i}", f"present_key_{i}", f"present_value_{i}"]
            attended = b.op(
                "GroupQueryAttention",
                [qkv, "", "", *cache, "lengths", "total_length"],
                outputs,
                MS_DOMAIN,
                num_heads=heads,
                kv_num_heads=heads,
                scale=1.0 / math.sqrt(d_head),
            )[0]
            return b.linear(attended, layer.self_attn.out_proj, f"{name}.self_out", padded)

        def cross_attention(h: str, layer=layer, i=i, name=name) -> str:
            q = b.linear(h, layer.cross_attn.q_proj, f"{name}.cross_q")
            keys = b.one("Gather", [f"cross_key_{i}", "source_index"], axis=0)  # (R, H, S, d_k)
            values = b.one("Gather", [f"cross_value_{i}", "source_index"], axis=0)
            attended = b.one("MultiHeadAttention", [q, keys, values, "", key_mask], domain=MS_DOMAIN, num_heads=heads)
            return b.linear(attended, layer.cross_attn.out_proj, f"{name}.cross_out")

        def feed_forward(h: str, layer=layer, name=name) -> str:
            hidden = b.linear(h, layer.ffn.fc1, f"{name}.fc1")
            if c.activation == "swish":
                hidden = b.one("Mul", [hidden, b.one("Sigmoid", [hidden])])
            else:
                domain = MS_DOMAIN if c.activation == "gelu" else ""
                hidden = b.one(ACTIVATION_OPS[c.activation], [hidden], domain=domain)
            return b.linear(hidden, layer.ffn.fc2, f"{name}.fc2")

        x = _residual(b, x, layer.self_block, f"{name}.self", self_attention)
        x = _residual(b, x, layer.cross_block, f"{name}.cross", cross_attention)
        x = _residual(b, x, layer.ffn_block, f"{name}.ffn", feed_forward)
    if c.norm == "pre":
        x = _layer_norm(b, x, model.decoder_norm, "decoder.norm")
    logits = b.one("MatMul", [x, b.constant("output.weight", model.output.weight.detach().float().numpy().T)])
    if c.final_logits_bias:
        logits = b.one("Add", [logits, b.constant("output.bias", model.final_logits_bias.detach().float().numpy())])
    # LogSoftmax runs on vectorized exp (ReduceLogSumExp, which would leave the logits to TopK, does not).
    logits = b.one("Cast", [b.one("Squeeze", [logits, "axis_1"])], to=TensorProto.FLOAT)  # (R, V)
    log_probs = b.one("LogSoftmax", [logits], axis=-1)
    b.op("TopK", [log_probs, "top_k"], STEP_OUTPUTS[:2], axis=-1, largest=1, sorted=1)
    b.op("Gather", [log_probs, b.constant("eos_id", np.array([c.eos_id], np.int64))], STEP_OUTPUTS[2:], axis=1)
    return _model(b, c.n_decoder_layers, heads, d_head, d_cache)


def _model(b: _Builder, layers: int, heads: int, d_head: int, d_cache: int) -> onnx.ModelProto:
    f = helper.np_dtype_to_tensor_dtype(np.dtype(b.dtype))
    i32, i64 = TensorProto.INT32, TensorProto.INT64
    value = helper.make_tensor_value_info
    inputs = [
        value("tokens", i64, ["rows"]),
        value("lengths", i32, ["rows"]),
        value("total_length", i32, []),
        value("source_index", i64, ["rows"]),
        value("src_mask", i32, ["sources", "src_len"]),
        value("top_k", i64, [1]),
    ]
    inputs += [value(n, f, ["rows", heads, "cache_len", d_cache]) for n in layer_names("past", layers)]
    inputs += [value(n, f, ["sources", heads, "src_len", d_head]) for n in layer_names("cross", layers)]
    top_log_probs, top_ids, eos_log_probs = STEP_OUTPUTS
    outputs = [
        value(top_log_probs, TensorProto.FLOAT, ["rows", "k"]),
        value(top_ids, i64, ["rows", "k"]),
        value(eos_log_probs, TensorProto.FLOAT, ["rows", 1]),
    ]
    outputs += [value(n, f, ["rows", heads, "cache_len", d_cache]) for n in layer_names("present", layers)]
    graph = helper.make_graph(b.nodes, "decoder_step", inputs, outputs, b.initializers)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, producer_name="translation-service")
