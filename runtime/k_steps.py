"""Several greedy decoder steps per call (``k_step_graph``): the exported one-step graph (any variant) copied k
times into one graph, so a greedy batch goes to ONNX Runtime and back once per k tokens.

Copy j reads the tokens copy j-1 chose (its best candidate, as the greedy search takes it), each row's length
+ j, and the cache buffers the first read: each copy's ``GroupQueryAttention`` writes its entry in place at the
row's length + j, because every copy's present output is bound to the same buffer as the past input (the step's
own contract, runtime/contract.py), and ONNX Runtime runs copy j+1's attention of a layer only after copy j's
whole step (it needs copy j's token). Out come each row's k tokens and their log-probabilities; a row that ends
mid-way (eos, its length limit, the runaway guard) is cut there by its search and leaves the batch, so what it
wrote after is never read. The graph is made from the loaded one-step graph when a session is opened, so every
exported folder and variant has it without exporting again. The host must leave room for k more entries per
row (``DecodeBatch`` reserves it); positions past the model's table are clamped (only rows that ended read
them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from runtime.binding import StepBinding
from runtime.contract import STEP_OUTPUTS

PER_STEP = ("tokens", "lengths", "total_length")  # the feeds each copy reads its own of
CHUNK_OUTPUTS = ("chunk_tokens", "chunk_log_probs")  # (R, k) int64 and float32: each row's k best tokens


def present_names(layers: int, k: int) -> list[list[str]]:
    """Per copy j, its present outputs (present_key_0, present_value_0, ...): the last copy's are the step's
    names, the others' carry ``@j``; all are bound to the past buffer of the same name."""
    base = [f"present_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    return [[name if j == k - 1 else f"{name}@{j}" for name in base] for j in range(k)]


def k_step_graph(step: onnx.ModelProto, k: int, host_totals: bool = False) -> onnx.ModelProto:
    """The graph of k greedy steps made from ``step`` (see the module's doc). With ``host_totals``, copy j's
    total length is an input of its own, ``total_length@j`` (the caller feeds total_length + j), instead of an
    Add in the graph: GroupQueryAttention reads it from host memory, and on CUDA an Add there would run on the
    device and need a Memcpy back, which a captured graph cannot hold."""
    graph = step.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    present = [output for output in graph.output if output.name.startswith("present_")]
    nodes = _needed(graph, {STEP_OUTPUTS[0], STEP_OUTPUTS[1], *(output.name for output in present)})
    used = {name for node in nodes for name in node.input}
    inputs = [value for value in graph.input if value.name in used]
    limit = _positions(nodes, initializers) - 1
    extra = [
        numpy_helper.from_array(np.array(0, np.int64), "k_steps.first"),
        numpy_helper.from_array(np.array([0], np.int64), "k_steps.first_column"),
        numpy_helper.from_array(np.array([1], np.int64), "k_steps.one_column"),
        numpy_helper.from_array(np.array(limit, np.int32), "k_steps.last_position"),
    ]
    new_nodes: list[onnx.NodeProto] = []
    outputs: list[onnx.ValueInfoProto] = []
    extra_inputs: list[onnx.ValueInfoProto] = []
    names = present_names(len(present) // 2, k)
    tokens_out, log_probs_out = [], []
    for j in range(k):
        feeds = {name: name for name in PER_STEP}
        if j:
            extra.append(numpy_helper.from_array(np.array(j, np.int32), f"k_steps.plus_{j}"))
            feeds["tokens"] = _node(new_nodes, "Gather", [f"top_ids@{j - 1}", "k_steps.first"], f"tokens@{j}", axis=1)
            ahead = _node(new_nodes, "Add", ["lengths", f"k_steps.plus_{j}"], f"lengths_ahead@{j}")
            feeds["lengths"] = _node(new_nodes, "Min", [ahead, "k_steps.last_position"], f"lengths@{j}")
            if host_totals:
                feeds["total_length"] = f"total_length@{j}"
                extra_inputs.append(onnx.ValueInfoProto())
                extra_inputs[-1].CopyFrom(next(value for value in inputs if value.name == "total_length"))
                extra_inputs[-1].name = feeds["total_length"]
            else:
                feeds["total_length"] = _node(new_nodes, "Add", ["total_length", f"k_steps.plus_{j}"], f"total@{j}")
        renamed = dict(zip((output.name for output in present), names[j], strict=True))
        for node in nodes:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{node.name}@{j}"
            copy.input[:] = [_input(name, j, feeds, graph, initializers) for name in node.input]
            copy.output[:] = [renamed.get(name, name if name == "" else f"{name}@{j}") for name in node.output]
            new_nodes.append(copy)
        for output in present:
            value = onnx.ValueInfoProto()
            value.CopyFrom(output)
            value.name = renamed[output.name]
            outputs.append(value)
        ends = ["k_steps.first_column", "k_steps.one_column"]
        tokens_out.append(_node(new_nodes, "Slice", [f"top_ids@{j}", *ends, "k_steps.one_column"], f"best@{j}"))
        log_probs_out.append(
            _node(new_nodes, "Slice", [f"top_log_probs@{j}", *ends, "k_steps.one_column"], f"best_log_prob@{j}")
        )
    _node(new_nodes, "Concat", tokens_out, CHUNK_OUTPUTS[0], axis=1)
    _node(new_nodes, "Concat", log_probs_out, CHUNK_OUTPUTS[1], axis=1)
    outputs = [
        helper.make_tensor_value_info(CHUNK_OUTPUTS[0], TensorProto.INT64, ["rows", k]),
        helper.make_tensor_value_info(CHUNK_OUTPUTS[1], TensorProto.FLOAT, ["rows", k]),
        *outputs,
    ]
    read = {name for node in new_nodes for name in node.input}
    weights = [tensor for tensor in [*graph.initializer, *extra] if tensor.name in read]
    made = helper.make_graph(new_nodes, f"{graph.name}_k{k}", inputs + extra_inputs, outputs, weights)
    model = helper.make_model(made, opset_imports=step.opset_import, ir_version=step.ir_version)
    model.producer_name = step.producer_name
    return model


def _needed(graph: onnx.GraphProto, outputs: set[str]) -> list[onnx.NodeProto]:
    """The nodes the outputs need, in the graph's order (the search head, which greedy does not read, goes)."""
    wanted, keep = set(outputs), []
    for node in reversed(graph.node):
        if wanted.intersection(node.output):
            keep.append(node)
            wanted.update(node.input)
    return keep[::-1]


def _positions(nodes: list[onnx.NodeProto], initializers: dict[str, onnx.TensorProto]) -> int:
    """Rows of the position table (the Gather by ``lengths``)."""
    table = next(node.input[0] for node in nodes if node.op_type == "Gather" and node.input[1] == "lengths")
    return int(initializers[table].dims[0])


def _input(name: str, j: int, feeds: dict[str, str], graph: onnx.GraphProto, initializers: dict) -> str:
    if name in feeds:
        return feeds[name]
    if name == "" or name in initializers or any(value.name == name for value in graph.input):
        return name  # the weights, and the feeds every copy shares (the caches, the sources' keys and mask)
    return f"{name}@{j}"


def _node(nodes: list[onnx.NodeProto], op: str, inputs: list[str], output: str, **attributes) -> str:
    nodes.append(helper.make_node(op, inputs, [output], name=f"k_steps.{output}", **attributes))
    return output


def bind_k_steps(session: ort.InferenceSession, feeds: dict[str, Any], device: str, k: int) -> StepBinding:
    """A k-step graph bound as ``bind_step`` binds a step (host feeds by reference; ``StepBindings`` keeps it
    per batch layout), with each past buffer bound as every copy's present output too, and the chunk's tokens
    and log-probabilities written into arrays that ``StepBindings.run`` returns."""
    assert device == "cpu", device  # host buffers only, for now
    declared = {value.name for value in session.get_inputs()}
    pasts = [name for name in feeds if name.startswith("past_")]
    presents = present_names(len(pasts) // 2, k)
    binding, values = session.io_binding(), []
    for name, array in feeds.items():
        if name not in declared:
            continue
        assert array.flags.c_contiguous, name  # a copy would not see the batch's updates
        value = ort.OrtValue.ortvalue_from_numpy(array)  # the same memory
        values.append(value)
        binding.bind_ortvalue_input(name, value)
        if name in pasts:
            for names in presents:
                binding.bind_ortvalue_output(names[pasts.index(name)], value)
    rows = len(feeds["tokens"])
    outputs = (np.empty((rows, k), np.int64), np.empty((rows, k), np.float32))
    for name, array in zip(CHUNK_OUTPUTS, outputs, strict=True):
        values.append(ort.OrtValue.ortvalue_from_numpy(array))
        binding.bind_ortvalue_output(name, values[-1])
    return StepBinding(binding, outputs, values)
