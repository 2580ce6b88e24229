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
  source: a source's rows (its beams) are one block of queries against them (``groups``),
  so its keys are read once per step, not once per row, and never gathered to rows;
- positions are a table lookup; embeddings are pre-scaled;
- only the best ``top_k`` log-probabilities of each row leave the graph (and the log-probability
  of eos, which beam search needs when a hypothesis reaches its length limit), not the
  whole vocabulary; and each source's best extensions over all its rows, ranked in the graph.

Its inputs and outputs are runtime/contract.py's table: the tokens, each row's length (position and mask), the
sources' groups of rows and masks, the search head's running scores and limits, and per layer the cache buffers
(past in, present out, the same memory) and the sources' cross-attention keys and values; out come each row's
best candidates and eos log-probability, and each source's best extensions over all its rows (``search_head``):
the search reads these and never ranks a row's candidates itself.

``GroupQueryAttention`` needs a head size that is a multiple of 8: other sizes are padded with
zero columns (d_cache), which changes no result.
"""

from __future__ import annotations

import math

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
from runtime.contract import (
    CACHE_SHAPE,
    CANDIDATE_OUTPUTS,
    CROSS_SHAPE,
    ROW_OUTPUTS,
    SOURCE_OUTPUTS,
    STEP_FEEDS,
    STEP_OUTPUTS,
    layer_names,
)

HEAD_MULTIPLE = 8  # GroupQueryAttention's CPU kernel requires head_size % 8 == 0


def cache_head_size(d_head: int) -> int:
    return -(-d_head // HEAD_MULTIPLE) * HEAD_MULTIPLE


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


def build_decoder_step(model: Transformer, dtype: type[np.floating] = np.float32) -> onnx.ModelProto:
    """The decoder-step graph of ``model``, equivalent to ``Transformer.decode_step``: float32, or float16
    weights, caches and states (for CUDA) with the log-softmax in float32."""
    model = model.eval().float()
    c = model.config
    heads, d_head, d_model = c.n_heads, c.d_head, c.d_model
    d_cache = cache_head_size(d_head)
    padded = _padded_order(heads, d_head, d_cache) if d_cache != d_head else None
    b = GraphBuilder(dtype)
    embed = model.embedding.weight.detach().float().numpy() * model.embed_scale
    token_embedding = b.one("Gather", [b.constant("embedding", embed), "tokens"])
    x = b.one(
        "Add", [token_embedding, b.one("Gather", [b.constant("positions", position_table(c)), "lengths"])]
    )  # (R, D)
    x = b.one("Unsqueeze", [x, b.constant("axis_1", np.array([1], np.int64))])  # (R, 1, D): what attention takes
    b.constant("axis_2", np.array([2], np.int64))
    b.constant("flat_rows", np.array([-1, 1, d_model], np.int64))
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
            q = b.linear(h, layer.cross_attn.q_proj, f"{name}.cross_q")  # (R, 1, D)
            grouped = b.one("Squeeze", [b.one("Gather", [q, "groups"], axis=0), "axis_2"])  # (N, G, D)
            cross = [f"cross_key_{i}", f"cross_value_{i}", "", "src_mask"]
            attended = b.one("MultiHeadAttention", [grouped, *cross], domain=MS_DOMAIN, num_heads=heads)
            flat = b.one("Reshape", [attended, "flat_rows"])  # (N·G, 1, D)
            rows = b.one("Gather", [flat, "row_position"], axis=0)  # (R, 1, D)
            return b.linear(rows, layer.cross_attn.out_proj, f"{name}.cross_out")

        x = residual(b, x, layer.self_block, f"{name}.self", self_attention)
        x = residual(b, x, layer.cross_block, f"{name}.cross", cross_attention)
        x = residual(
            b,
            x,
            layer.ffn_block,
            f"{name}.ffn",
            lambda h, layer=layer, name=name: feed_forward(b, h, layer.ffn, c.activation, name),
        )
    if c.norm == "pre":
        x = layer_norm(b, x, model.decoder_norm, "decoder.norm")
    logits = b.one("MatMul", [x, b.constant("output.weight", model.output.weight.detach().float().numpy().T)])
    if c.final_logits_bias:
        logits = b.one("Add", [logits, b.constant("output.bias", model.final_logits_bias.detach().float().numpy())])
    # LogSoftmax runs on vectorized exp (ReduceLogSumExp, which would leave the logits to TopK, does not).
    logits = b.one("Cast", [b.one("Squeeze", [logits, "axis_1"])], to=TensorProto.FLOAT)  # (R, V)
    log_probs = b.one("LogSoftmax", [logits], axis=-1)
    b.op("TopK", [log_probs, "top_k"], STEP_OUTPUTS[:2], axis=-1, largest=1, sorted=1)
    b.op("Gather", [log_probs, b.constant("eos_id", np.array([c.eos_id], np.int64))], STEP_OUTPUTS[2:], axis=1)
    search_head(b, *STEP_OUTPUTS[:2])
    return _model(b, c.n_decoder_layers, heads, d_head, d_cache)


def search_head(b: GraphBuilder, top_log_probs: str, top_ids: str) -> None:
    """Each source's best K extensions over all its rows, best first (ties to the lower row, then the lower
    token, as runtime.search.BeamSearch ranks them): a row's candidates scored by its running score (float64,
    as the host keeps it, so the sums and their order are the host's), the rows of each source gathered into
    its group, ``candidate_bias`` added (-inf on the group's repeats and on ranks past the source's limit) and
    one TopK over the group's G·K. Returns nothing; writes CANDIDATE_OUTPUTS: the scores, each candidate's row
    within its source (its origin) and its token."""
    scored = b.one("Add", [b.one("Cast", [top_log_probs], to=TensorProto.DOUBLE), "row_scores"])  # (R, K)
    grouped = b.one("Add", [b.one("Gather", [scored, "groups"], axis=0), "candidate_bias"])  # (N, G, K)
    flat = b.one("Reshape", [grouped, b.constant("sources_by_any", np.array([0, -1], np.int64))])  # (N, G·K)
    best, index = b.op("TopK", [flat, "top_k"], [CANDIDATE_OUTPUTS[0], "best_index"], axis=-1, largest=1, sorted=1)
    within = b.op("Div", [index, "top_k"], [CANDIDATE_OUTPUTS[1]])[0]  # (N, K): the row within the source
    rows = b.one("GatherElements", ["groups", within], axis=1)  # (N, K): the row in the batch
    flat_index = b.one("Add", [b.one("Mul", [rows, "top_k"]), b.one("Mod", [index, "top_k"])])
    flat_ids = b.one("Reshape", [top_ids, b.constant("any", np.array([-1], np.int64))])
    b.op("Gather", [flat_ids, flat_index], [CANDIDATE_OUTPUTS[2]], axis=0)


def _model(b: GraphBuilder, layers: int, heads: int, d_head: int, d_cache: int) -> onnx.ModelProto:
    sizes = {"heads": heads, "d_cache": d_cache, "d_head": d_head}

    def value(name: str, dtype: type | None, shape: tuple[str | int, ...]) -> onnx.ValueInfoProto:
        element = helper.np_dtype_to_tensor_dtype(np.dtype(dtype or b.dtype))
        return helper.make_tensor_value_info(name, element, [sizes.get(axis, axis) for axis in shape])

    inputs = [value(t.name, t.dtype, t.shape) for t in STEP_FEEDS]
    inputs += [value(n, None, CACHE_SHAPE) for n in layer_names("past", layers)]
    inputs += [value(n, None, CROSS_SHAPE) for n in layer_names("cross", layers)]
    outputs = [value(t.name, t.dtype, t.shape) for t in ROW_OUTPUTS + SOURCE_OUTPUTS]
    outputs += [value(n, None, CACHE_SHAPE) for n in layer_names("present", layers)]
    graph = helper.make_graph(b.nodes, "decoder_step", inputs, outputs, b.initializers)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name="translation-service")
