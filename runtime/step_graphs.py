"""The graphs made at load time from the loaded decoder step, so that every exported folder and variant has them
without exporting again (export/ builds the rest, cache_ops included); each is opened only where its option is on,
and this module, with the onnx package it needs, is imported only then:

- ``k_step_graph``: several greedy steps per call (RuntimeOptions.steps_per_run), below; with
  ``rows_are_sources``, over ``greedy_step_graph``: the step of a compact batch whose sources are all greedy (one
  row each, in order), which a host batch runs at any steps_per_run;
- ``device_greedy_graph``: the greedy step of a bucket on a device (runtime/captured.py), with SkipLayerNormalization
  written in (runtime/fusions.py), which also writes the next step's tokens and lengths on the device;
- ``split_host_feeds``: the step a CUDA graph captures, where no Memcpy node may stand (runtime/captured.py);
- ``reorder_graph``: beam search's cache reorder over a bucket's device buffers, one run for all of them
  (runtime/bucket_buffers.py).

Several greedy decoder steps per call (``k_step_graph``): the exported one-step graph (any variant) copied k
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

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runtime.contract import (
    GREEDY_PACKED,
    HOST_FEEDS,
    HOST_INPUTS,
    K_STEP_OUTPUTS,
    LIVE,
    NEXT_STATE,
    ON_DEVICE,
    STEP_OUTPUTS,
    present_names,
)
from runtime.fusions import fuse_skip_layer_norm

PER_STEP = ("tokens", "lengths", "total_length")  # the feeds each copy reads its own of


def greedy_step_graph(step: onnx.ModelProto) -> onnx.ModelProto:
    """The step of a batch whose rows are their sources' only rows, in the sources' order (a compact batch whose
    sources are all greedy): a source's group is its row, so the Gather by ``groups`` before each cross-attention
    and the Reshape and Gather by ``row_position`` after it are identities and go, the cross-attention taking the
    rows themselves as its batch; the search head, which greedy does not read, goes; and TopK keeps one
    candidate, a constant, not the ``top_k`` feed. Out come top_log_probs and top_ids (rows, 1) and the presents,
    each row's exactly as the step's (the same kernels on the same numbers): 71 nodes against the step's 97 on
    the default model."""
    model = onnx.ModelProto()
    model.CopyFrom(step)
    graph = model.graph
    made_by = {output: node for node in graph.node for output in node.output}
    read_by: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            read_by.setdefault(name, []).append(node)
    for node in graph.node:
        if node.op_type != "MultiHeadAttention":
            continue
        squeeze = made_by[node.input[0]]
        gather = made_by[squeeze.input[0]]
        (reshape,) = read_by[node.output[0]]
        (placed,) = read_by[reshape.output[0]]
        if (squeeze.op_type, gather.op_type, gather.input[1], reshape.op_type, placed.op_type, placed.input[1]) != (
            "Squeeze", "Gather", "groups", "Reshape", "Gather", "row_position"
        ):  # fmt: skip
            raise ValueError(f"{graph.name}: the cross-attention {node.name} is not read and placed by groups")
        node.input[0] = gather.input[0]
        for reader in read_by[placed.output[0]]:
            reader.input[:] = [node.output[0] if name == placed.output[0] else name for name in reader.input]
    present = [output.name for output in graph.output if output.name.startswith("present_")]
    wanted = [STEP_OUTPUTS[0], STEP_OUTPUTS[1], *present]
    nodes = _needed(graph, set(wanted))
    one = numpy_helper.from_array(np.array([1], np.int64), "greedy.one_candidate")
    for node in nodes:
        if node.op_type == "TopK":
            node.input[1] = one.name
    read = {name for node in nodes for name in node.input}
    inputs = [value for value in graph.input if value.name in read]
    outputs = [next(output for output in graph.output if output.name == name) for name in wanted]
    weights = [tensor for tensor in graph.initializer if tensor.name in read] + [one]
    made = helper.make_graph(nodes, f"{graph.name}_greedy", inputs, outputs, weights)
    greedy = helper.make_model(made, opset_imports=step.opset_import, ir_version=step.ir_version)
    greedy.producer_name = step.producer_name
    return greedy


def device_greedy_graph(step: onnx.ModelProto) -> onnx.ModelProto:
    """``greedy_step_graph`` with each residual's bias, Add and LayerNorm one SkipLayerNormalization
    (``fuse_skip_layer_norm``), that writes the next step's state where it runs: ``next_tokens``, each row's token,
    and ``next_lengths``, its length + ``live`` (1 on a live row, 0 on a free slot's, whose length stays 0), which a
    device's step binds as the next run's tokens and lengths (runtime/captured.py); and the one output the host
    reads, GREEDY_PACKED, each row's token and log-probability side by side. 57 nodes on the default model
    (the greedy step's 71 less 18, and 4 for the state)."""
    model = fuse_skip_layer_norm(greedy_step_graph(step))
    graph = model.graph
    log_probs, ids = STEP_OUTPUTS[0], STEP_OUTPUTS[1]
    (next_tokens, _), (next_lengths, _) = NEXT_STATE.items()
    graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "greedy.row_axis"))
    _node(graph.node, "Cast", [ids], "greedy.ids_as_float", to=TensorProto.FLOAT)
    _node(graph.node, "Concat", ["greedy.ids_as_float", log_probs], GREEDY_PACKED, axis=1)
    _node(graph.node, "Squeeze", [ids, "greedy.row_axis"], next_tokens)
    _node(graph.node, "Add", ["lengths", LIVE], next_lengths)
    graph.input.append(helper.make_tensor_value_info(LIVE, TensorProto.INT32, ["rows"]))
    presents = [output for output in graph.output if output.name.startswith("present_")]
    del graph.output[:]
    graph.output.extend(
        [
            helper.make_tensor_value_info(GREEDY_PACKED, TensorProto.FLOAT, ["rows", 2]),
            helper.make_tensor_value_info(next_tokens, TensorProto.INT64, ["rows"]),
            helper.make_tensor_value_info(next_lengths, TensorProto.INT32, ["rows"]),
            *presents,
        ]
    )
    graph.name = f"{graph.name}_device"
    return model


def k_step_graph(
    step: onnx.ModelProto, k: int, host_totals: bool = False, rows_are_sources: bool = False
) -> onnx.ModelProto:
    """The graph of k greedy steps made from ``step`` (see the module's doc). With ``host_totals``, copy j's
    total length is an input of its own, ``total_length@j`` (the caller feeds total_length + j), instead of an
    Add in the graph: GroupQueryAttention reads it from host memory, and on CUDA an Add there would run on the
    device and need a Memcpy back, which a captured graph cannot hold. With ``rows_are_sources`` (a compact
    batch: each greedy source's row is its group), each copy is ``greedy_step_graph``'s, and one copy's tokens
    and log-probabilities are the outputs themselves."""
    if rows_are_sources:
        step = greedy_step_graph(step)
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
    # One run of the greedy step: its TopK's (rows, 1) outputs are the run's, with no Slice and no Concat
    direct = k == 1 and rows_are_sources
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
        if direct:
            renamed |= {STEP_OUTPUTS[1]: K_STEP_OUTPUTS[0], STEP_OUTPUTS[0]: K_STEP_OUTPUTS[1]}
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
        if direct:
            break
        ends = ["k_steps.first_column", "k_steps.one_column"]
        tokens_out.append(_node(new_nodes, "Slice", [f"top_ids@{j}", *ends, "k_steps.one_column"], f"best@{j}"))
        log_probs_out.append(
            _node(new_nodes, "Slice", [f"top_log_probs@{j}", *ends, "k_steps.one_column"], f"best_log_prob@{j}")
        )
    if not direct:
        _node(new_nodes, "Concat", tokens_out, K_STEP_OUTPUTS[0], axis=1)
        _node(new_nodes, "Concat", log_probs_out, K_STEP_OUTPUTS[1], axis=1)
    outputs = [
        helper.make_tensor_value_info(K_STEP_OUTPUTS[0], TensorProto.INT64, ["rows", k]),
        helper.make_tensor_value_info(K_STEP_OUTPUTS[1], TensorProto.FLOAT, ["rows", k]),
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
    nodes.append(helper.make_node(op, inputs, [output], name=f"made.{output}", **attributes))
    return output


def split_host_feeds(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (changed in place and returned) where a HOST_FEEDS input is also read by nodes computing on the
    device: those read a new input, its name + ON_DEVICE, bound on the device."""
    graph = model.graph
    declared = {value.name: value for value in graph.input}
    for name in HOST_FEEDS:
        if name not in declared:
            continue
        others = [
            (node, i)
            for node in graph.node
            for i, read in enumerate(node.input)
            if read == name and (node.op_type, i) not in HOST_INPUTS
        ]
        if not others:
            continue
        copy = graph.input.add()
        copy.CopyFrom(declared[name])
        copy.name = name + ON_DEVICE
        for node, i in others:
            node.input[i] = name + ON_DEVICE
    return model


def reorder_graph(count: int, dtype: np.dtype) -> onnx.ModelProto:
    """y_i = ScatterND(x_i, targets, Gather(x_i, rows)) for ``count`` buffers of ``dtype``: bound with each y_i on
    its x_i, one run moves beam search's reordered rows in every buffer."""
    f = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes, inputs, outputs = [], [], []
    for i in range(count):
        nodes.append(helper.make_node("Gather", [f"x{i}", "rows"], [f"taken{i}"], axis=0))
        nodes.append(helper.make_node("ScatterND", [f"x{i}", "targets", f"taken{i}"], [f"y{i}"]))
        inputs.append(helper.make_tensor_value_info(f"x{i}", f, None))
        outputs.append(helper.make_tensor_value_info(f"y{i}", f, None))
    inputs.append(helper.make_tensor_value_info("rows", TensorProto.INT64, ["n"]))
    inputs.append(helper.make_tensor_value_info("targets", TensorProto.INT64, ["n", 1]))
    graph = helper.make_graph(nodes, "reorder", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
