"""The model as one ONNX Runtime ``com.microsoft.BeamSearch`` node: ONNX Runtime's own generation loop over the
same weights, a reference that the CTranslate2 benchmark times beside our engine (it is not served).

The node runs the whole search inside one ``run`` (encoder-decoder ``model_type`` 1, the T5 layout of
onnxruntime.transformers.convert_generation): an ``encoder`` subgraph (encoder_input_ids and
encoder_attention_mask, int32, to each decoder layer's cross-attention keys and values, present_key_cross_i /
present_value_cross_i, (B, H, S, d_k)) and a ``decoder`` subgraph called once per step (input_ids (B, 1) and the
mask, past_key_self_i / past_value_self_i (B, H, T, d_k) and the cross keys and values, to logits (B, 1, V) and
present_key_self_i / present_value_self_i (B, H, T+1, d_k), the cache concatenated by MultiHeadAttention). Its
limits, which is why it is a reference and not the engine: the batch is static (every source decodes until the
last is done), one beam size, output length and length penalty for the batch, the length penalty is
Hugging Face's (score / length^lp, not GNMT's), no runaway guard, fp32 only on the CPU.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
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
from export.encoder import build_encoder
from model.transformer import Transformer
from runtime.batch import pad_sources
from runtime.search import default_max_output


def _encoder_subgraph(model: Transformer) -> onnx.GraphProto:
    """Our encoder graph with the node's names: int32 inputs cast to its own, and one output per layer."""
    encoder = build_encoder(model).graph
    layers, c = model.config.n_decoder_layers, model.config
    nodes = [
        helper.make_node("Cast", ["encoder_input_ids"], ["src_tokens"], to=TensorProto.INT64),
        helper.make_node("Cast", ["encoder_attention_mask"], ["src_mask"], to=TensorProto.BOOL),
        *encoder.node,
    ]
    initializers = list(encoder.initializer)
    outputs = []
    for i in range(layers):
        index = f"layer_{i}"
        initializers.append(onnx.numpy_helper.from_array(np.array(i, np.int64), index))
        for kind, stacked in (("key", "cross_k"), ("value", "cross_v")):
            name = f"present_{kind}_cross_{i}"
            nodes.append(helper.make_node("Gather", [stacked, index], [name], axis=0))
            shape = ["batch", c.n_heads, "src_len", c.d_head]
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", "src_len"])
        for name in ("encoder_input_ids", "encoder_attention_mask")
    ]
    return helper.make_graph(nodes, "encoder", inputs, outputs, initializers)


def _decoder_subgraph(model: Transformer) -> onnx.GraphProto:
    """One decoder step over a concatenated cache, every row at the same position (the past's length)."""
    c = model.config
    heads, d_model = c.n_heads, c.d_model
    b = GraphBuilder(np.float32)
    embed = model.embedding.weight.detach().float().numpy() * model.embed_scale
    tokens = b.one("Cast", ["input_ids"], to=TensorProto.INT64)  # (B, 1)
    position = b.one("Shape", ["past_key_self_0"], start=2, end=3)  # (1,): the cached tokens
    x = b.one(
        "Add",
        [
            b.one("Gather", [b.constant("embedding", embed), tokens]),  # (B, 1, D)
            b.one("Gather", [b.constant("positions", position_table(c)), position]),  # (1, D)
        ],
    )
    thirds = b.constant("thirds", np.array([d_model] * 3, np.int64))
    for i, layer in enumerate(model.decoder_layers):
        name = f"decoder.{i}"

        def self_attention(h: str, layer=layer, i=i, name=name) -> str:
            q, k, v = b.op("Split", [b.linear(h, layer.self_attn.qkv_proj, f"{name}.qkv"), thirds], 3, axis=-1)
            past = [f"past_key_self_{i}", f"past_value_self_{i}"]
            outputs = [f"self_{i}", f"present_key_self_{i}", f"present_value_self_{i}"]
            b.op("MultiHeadAttention", [q, k, v, "", "", "", *past], outputs, MS_DOMAIN, num_heads=heads)
            return b.linear(outputs[0], layer.self_attn.out_proj, f"{name}.self_out")

        def cross_attention(h: str, layer=layer, i=i, name=name) -> str:
            q = b.linear(h, layer.cross_attn.q_proj, f"{name}.cross_q")
            cross = [f"past_key_cross_{i}", f"past_value_cross_{i}", "", "encoder_attention_mask"]
            attended = b.one("MultiHeadAttention", [q, *cross], domain=MS_DOMAIN, num_heads=heads)
            return b.linear(attended, layer.cross_attn.out_proj, f"{name}.cross_out")

        x = residual(b, x, layer.self_block, f"{name}.self", self_attention)
        x = residual(b, x, layer.cross_block, f"{name}.cross", cross_attention)
        x = residual(
            b, x, layer.ffn_block, f"{name}.ffn", lambda h, f=layer.ffn, n=name: feed_forward(b, h, f, c.activation, n)
        )
    if c.norm == "pre":
        x = layer_norm(b, x, model.decoder_norm, "decoder.norm")
    logits = b.one("MatMul", [x, b.constant("output.weight", model.output.weight.detach().float().numpy().T)])
    if c.final_logits_bias:
        logits = b.one("Add", [logits, b.constant("output.bias", model.final_logits_bias.detach().float().numpy())])
    b.op("Identity", [logits], ["logits"])
    value = helper.make_tensor_value_info
    cache, cross = ["batch", heads, "past_len", c.d_head], ["batch", heads, "src_len", c.d_head]
    inputs = [value("input_ids", TensorProto.INT32, ["batch", 1])]
    inputs += [value("encoder_attention_mask", TensorProto.INT32, ["batch", "src_len"])]
    inputs += [
        value(f"past_{kind}_self_{i}", TensorProto.FLOAT, cache)
        for i in range(len(model.decoder_layers))
        for kind in ("key", "value")
    ]
    inputs += [
        value(f"past_{kind}_cross_{i}", TensorProto.FLOAT, cross)
        for i in range(len(model.decoder_layers))
        for kind in ("key", "value")
    ]
    present = ["batch", heads, "total_len", c.d_head]
    outputs = [value("logits", TensorProto.FLOAT, ["batch", 1, c.vocab_size])]
    outputs += [
        value(f"present_{kind}_self_{i}", TensorProto.FLOAT, present)
        for i in range(len(model.decoder_layers))
        for kind in ("key", "value")
    ]
    return helper.make_graph(b.nodes, "decoder", inputs, outputs, b.initializers)


def build_beam_search(model: Transformer) -> onnx.ModelProto:
    """One BeamSearch node over the model (fp32): inputs input_ids and attention_mask (B, S) int32 with eos,
    max_length, min_length, num_beams, num_return_sequences (int32, (1,)), length_penalty and
    repetition_penalty (float, (1,)); output sequences (B, 1, max_length) int32, the start token first."""
    model = model.eval().float()
    c = model.config
    scalars = {
        "max_length": TensorProto.INT32,
        "min_length": TensorProto.INT32,
        "num_beams": TensorProto.INT32,
        "num_return_sequences": TensorProto.INT32,
        "length_penalty": TensorProto.FLOAT,
        "repetition_penalty": TensorProto.FLOAT,
    }
    node = helper.make_node(
        "BeamSearch",
        ["input_ids", *scalars, "", "", "attention_mask"],
        ["sequences"],
        domain=MS_DOMAIN,
        eos_token_id=c.eos_id,
        pad_token_id=c.pad_id,
        decoder_start_token_id=c.decoder_start_id,
        no_repeat_ngram_size=0,
        early_stopping=1,
        model_type=1,
        encoder=_encoder_subgraph(model),
        decoder=_decoder_subgraph(model),
    )
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "src_len"])]
    inputs += [helper.make_tensor_value_info(name, kind, [1]) for name, kind in scalars.items()]
    inputs += [helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["batch", "src_len"])]
    outputs = [helper.make_tensor_value_info("sequences", TensorProto.INT32, ["batch", 1, "max_length"])]
    graph = helper.make_graph([node], "beam_search", inputs, outputs)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name="translation-service")


class BeamSearchOp:
    """The BeamSearch node in a session: ``translate_ids`` as the engine's (ids without start and eos)."""

    def __init__(self, model: Transformer, threads: int = 2) -> None:
        self.session = self.open(build_beam_search(model).SerializeToString(), threads)
        self.pad_id, self.eos_id = model.config.pad_id, model.config.eos_id

    @staticmethod
    def open(graph: bytes | str, threads: int = 2, provider: str = "CPUExecutionProvider") -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        return ort.InferenceSession(graph, options, [provider])

    @classmethod
    def from_graph(cls, graph: bytes | str, pad_id: int, eos_id: int, provider: str) -> BeamSearchOp:
        """The node of a graph made before (``build_beam_search``, then perhaps ``float16``) on ``provider``:
        how the GPU check carries it to a device without PyTorch's export."""
        op = cls.__new__(cls)
        op.session, op.pad_id, op.eos_id = cls.open(graph, 1, provider), pad_id, eos_id
        return op

    @staticmethod
    def float16(model: onnx.ModelProto) -> onnx.ModelProto:
        """The node's graph with float16 weights and subgraphs (its inputs and outputs kept), by ONNX Runtime's
        own converter: the reference beside our fp16 engine on CUDA, where the node runs float16."""
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = onnx.ModelProto.FromString(model.SerializeToString())
        for attribute in model.graph.node[0].attribute:  # the converter wants each weight's name once in all
            if attribute.type == onnx.AttributeProto.GRAPH:
                names = {tensor.name: f"{attribute.name}/{tensor.name}" for tensor in attribute.g.initializer}
                for tensor in attribute.g.initializer:
                    tensor.name = names[tensor.name]
                for node in attribute.g.node:
                    node.input[:] = [names.get(name, name) for name in node.input]
        return convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=True)

    def translate_ids(self, sources: list[list[int]], beam: int = 1, max_output_tokens: int = 256) -> list[list[int]]:
        tokens, mask = pad_sources(sources, self.pad_id, self.eos_id)
        longest = max(default_max_output(len(s), max_output_tokens) for s in sources)
        feeds = {
            "input_ids": tokens.astype(np.int32),
            "attention_mask": mask.astype(np.int32),
            "max_length": np.array([longest], np.int32),  # the start token and longest - 1: ours counts eos
            "min_length": np.array([1], np.int32),
            "num_beams": np.array([beam], np.int32),
            "num_return_sequences": np.array([1], np.int32),
            "length_penalty": np.array([1.0], np.float32),
            "repetition_penalty": np.array([1.0], np.float32),
        }
        sequences = self.session.run(None, feeds)[0][:, 0, 1:]
        outputs = []
        for row in sequences.tolist():
            ends = [i for i, t in enumerate(row) if t in (self.eos_id, self.pad_id)]
            outputs.append(row[: ends[0]] if ends else row)
        return outputs
