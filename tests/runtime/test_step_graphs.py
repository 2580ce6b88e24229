"""Several greedy steps per run (runtime/step_graphs.py): the same tokens and the same cache as one step per run,
with rows ending mid-way and sources joining between runs; beam search still steps one at a time."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from runtime.backend import OrtBackend
from runtime.contract import (
    CANDIDATE_OUTPUTS,
    GREEDY_PACKED,
    HOST_INPUTS,
    K_STEP_OUTPUTS,
    LIVE,
    NEXT_STATE,
    ON_DEVICE,
    STEP_OUTPUTS,
)
from runtime.offline import translate_ids
from runtime.options import EngineSettings, RuntimeOptions
from runtime.search import default_max_output
from runtime.step_graphs import device_greedy_graph, greedy_step_graph, k_step_graph, split_host_feeds
from testkit.arrivals import decode_arriving, full_step_batch
from tests.conftest import own_sentences
from tests.runtime.spies import counted
from tests.runtime.step_feeds import greedy_step_feeds


def backend(folder: Path, k: int, batch_layout: str = "compact", **options) -> OrtBackend:
    settings = EngineSettings(provider="cpu", intra_op_threads=1, batch_layout=batch_layout)
    return OrtBackend(folder, RuntimeOptions(settings=settings, steps_per_run=k, **options))


def test_the_greedy_step_graph_has_no_search_head_and_no_group_gathers(tiny_export: Path):
    step = onnx.load(str(tiny_export / "decoder.onnx"))
    greedy = greedy_step_graph(step).graph
    inputs = {value.name for value in greedy.input}
    assert not {"groups", "row_position", "top_k", "row_scores", "candidate_bias"} & inputs
    assert inputs < {value.name for value in step.graph.input}
    ops = Counter(node.op_type for node in greedy.node)
    assert ops["GatherElements"] == ops["Squeeze"] - 1 == 0 and ops["TopK"] == 1  # one Squeeze: the logits'
    attention = [node for node in greedy.node if node.op_type == "MultiHeadAttention"]
    made_by = {output: node.op_type for node in greedy.node for output in node.output}
    assert attention and all(made_by[node.input[0]] == "Add" for node in attention)  # the rows' own queries
    layers = sum(node.op_type == "GroupQueryAttention" for node in step.graph.node)
    assert len(step.graph.node) - len(greedy.node) == 13 + 1 + 4 * layers  # the head, its TopK, 4 per layer
    assert [output.name for output in greedy.output][:2] == ["top_log_probs", "top_ids"]
    one = k_step_graph(step, 1, rows_are_sources=True).graph
    assert len(one.node) == len(greedy.node) and [o.name for o in one.output][:2] == list(K_STEP_OUTPUTS)


def test_greedy_batches_run_the_greedy_graph_with_the_full_steps_tokens(tiny_export: Path):
    """Sources joining at every step, one leaving mid-way, a beam source making the batch step on the full
    graph for a while: the greedy graph's runs decode what the full step decodes, in fewer full-step runs."""
    engine = backend(tiny_export, 1)
    sources = engine.tokenizer.encode_source(own_sentences(8))
    arrivals = {key: [(key, 2 if key == 3 else 1)] for key in range(len(sources))}
    runs = Counter()
    for name, session in (("greedy", engine.k_steps.session), ("full", engine.decoder)):
        session.run_with_iobinding = counted(runs, name, session.run_with_iobinding)
    decoded = []
    for batch in (engine.new_batch(), full_step_batch(engine)):
        before = runs.copy()
        decoded.append(
            decode_arriving(
                batch,
                arrivals,
                lambda keys: engine.encode_sources([sources[key] for key in keys]),
                lambda key: default_max_output(len(sources[key]), 24),
                removed={5: 1},
            )
        )
        runs_now = runs - before
        assert runs_now["full"] + runs_now["greedy"] == decoded[-1].steps
    kept = [key for key in range(len(sources)) if key != 1]
    assert decoded[0].tokens(kept) == decoded[1].tokens(kept)
    assert 0 < runs["full"] - decoded[1].steps < decoded[0].steps  # the greedy graph ran the greedy-only steps


def test_the_k_step_graph_is_k_copies_of_the_step_without_its_search_head(tiny_export: Path):
    step = onnx.load(str(tiny_export / "decoder.onnx"))
    graph = k_step_graph(step, 3).graph
    ops, one = Counter(node.op_type for node in graph.node), Counter(node.op_type for node in step.graph.node)
    assert ops["GroupQueryAttention"] == 3 * one["GroupQueryAttention"]
    assert ops["GatherElements"] == 0  # the search head is gone: greedy takes each row's best token
    outputs = [output.name for output in graph.output]
    assert outputs[:2] == list(K_STEP_OUTPUTS) and not set(CANDIDATE_OUTPUTS) & set(outputs)
    presents = [name for name in outputs if name.startswith("present_key_0")]
    assert presents == ["present_key_0@0", "present_key_0@1", "present_key_0"]
    assert {value.name for value in graph.input} <= {value.name for value in step.graph.input}
    read = {name for node in graph.node for name in node.input}
    assert all(tensor.name in read for tensor in graph.initializer)


@pytest.mark.parametrize("k", [2, 3, 8])
def test_k_steps_per_run_decode_the_tokens_of_one_step_per_run(tiny_export: Path, k: int):
    one, chunked = backend(tiny_export, 1), backend(tiny_export, k)
    sources = [ids[: 2 + 3 * i] for i, ids in enumerate(one.tokenizer.encode_source(own_sentences(6)))]
    for cap in (7, 30):  # rows end at their length limit mid-run, or at eos
        alone = [translate_ids(one, [source], max_output_tokens=cap)[0] for source in sources]
        assert [translate_ids(chunked, [source], max_output_tokens=cap)[0] for source in sources] == alone
        assert translate_ids(chunked, sources, max_output_tokens=cap) == translate_ids(
            one, sources, max_output_tokens=cap
        )


def test_a_k_step_run_writes_the_cache_that_k_single_steps_write(tiny_export: Path):
    one, chunked = backend(tiny_export, 1), backend(tiny_export, 4)
    sources = one.tokenizer.encode_source(own_sentences(3))
    batches = []
    for engine, steps in ((one, 4), (chunked, 1)):
        batch = engine.new_batch()
        batch.add([0, 1, 2], engine.encode_sources(sources), [1, 1, 1], [64, 64, 64])
        for _ in range(steps):
            assert batch.step() == []
        batches.append(batch)
    single, k_steps = (batch.layout for batch in batches)
    assert k_steps.cache.live_lengths.tolist() == single.cache.live_lengths.tolist() == [4, 4, 4]
    assert k_steps.tokens.tolist() == single.tokens.tolist()
    for a, b in zip(single.cache.views(), k_steps.cache.views(), strict=True):
        np.testing.assert_array_equal(a[:, :, :4], b[:, :, :4])


def test_sources_join_between_k_step_runs_and_beam_search_steps_one_at_a_time(tiny_export: Path):
    one, chunked = backend(tiny_export, 1), backend(tiny_export, 3)
    sources = one.tokenizer.encode_source(own_sentences(5))
    results = []
    arrivals = {key: [(key, beam)] for key, beam in enumerate([1, 1, 2, 1, 1])}  # one a step
    for engine in (one, chunked):
        decoded = decode_arriving(
            engine.new_batch(),
            arrivals,
            lambda keys, engine=engine: engine.encode_sources([sources[key] for key in keys]),
            lambda key: default_max_output(len(sources[key]), 20),
        )
        results.append((decoded.tokens(range(len(sources))), decoded.steps))
    assert results[1][0] == results[0][0]
    assert results[1][1] < results[0][1]  # greedy-only runs went three steps at a time


def test_k_steps_on_a_device_run_in_buckets(tiny_export: Path):
    with pytest.raises(ValueError, match="runs in batch_layout buckets only"):
        backend(tiny_export, 2, io_binding=True)
    assert backend(tiny_export, 2, io_binding=True, batch_layout="buckets").device_k_steps is not None


def test_a_device_k_step_graph_reads_each_copys_total_length_from_the_host(tiny_export: Path):
    import onnx

    from runtime.step_graphs import k_step_graph

    graph = k_step_graph(onnx.load(str(tiny_export / "decoder.onnx")), 3, host_totals=True).graph
    assert {"total_length", "total_length@1", "total_length@2"} <= {value.name for value in graph.input}
    # Only GroupQueryAttention reads them: no node computes with them on the device, so no Memcpy on CUDA.
    assert {node.op_type for node in graph.node if any(i.startswith("total_length") for i in node.input)} == {
        "GroupQueryAttention"
    }


def test_without_the_onnx_package_an_engine_is_refused_with_what_to_install(tiny_export: Path, monkeypatch):
    """Greedy batches' graph is made when the engine loads, with the onnx package (a dependency): where it was
    removed, loading says what to install rather than failing mid-request."""
    monkeypatch.setitem(sys.modules, "onnx", None)
    for k in (1, 2):
        with pytest.raises(ValueError, match="pip install onnx"):
            backend(tiny_export, k)


def test_the_captured_step_reads_host_feeds_where_their_kernels_want_them(tiny_export: Path):
    model = onnx.load(str(tiny_export / "decoder.onnx"))
    split = split_host_feeds(onnx.load(str(tiny_export / "decoder.onnx")))
    readers = {(node.op_type, i): name for node in split.graph.node for i, name in enumerate(node.input)}
    for (op, i), name in readers.items():
        if name in ("top_k", "total_length"):
            assert (op, i) in HOST_INPUTS, (op, i)  # only kernels that read host memory read the host feed
    assert any(name == "top_k" + ON_DEVICE for name in readers.values())  # the search head's arithmetic
    # The same step either way, on a beam batch's feeds.
    engine = backend(tiny_export, 1)
    sources = engine.tokenizer.encode_source(own_sentences(3))
    batch = engine.new_batch()
    batch.add([0, 1, 2], engine.encode_sources(sources), [2, 2, 2], [30, 30, 30])
    batch.step()
    feeds = {name: np.array(value) for name, value in batch.step_inputs().feeds.items()}
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = ort.InferenceSession(split.SerializeToString()).run(None, feeds | {"top_k" + ON_DEVICE: feeds["top_k"]})
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def default_depth_step(tmp_path_factory) -> onnx.ModelProto:
    """The decoder step of a tiny model as deep as the default one (3 decoder layers): node counts grow by layer."""
    from export.__main__ import main
    from tests.conftest import make_tiny_checkpoint

    folder = tmp_path_factory.mktemp("three_layers")
    make_tiny_checkpoint(folder / "checkpoint", 0, {"name": "three-layers"}, decoder_layers=3)
    assert main(["--checkpoint", str(folder / "checkpoint"), "--out", str(folder / "model")]) == 0
    return onnx.load(str(folder / "model" / "decoder.onnx"))


def test_the_device_greedy_step_runs_at_most_60_nodes_at_the_default_depth(default_depth_step, tmp_path: Path):
    """As ONNX Runtime runs it on the CPU, after its own optimizations (the engine's: runtime/providers.py)."""
    from runtime.providers import disabled_optimizers

    device = device_greedy_graph(default_depth_step)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(
        device.SerializeToString(), options, ["CPUExecutionProvider"], disabled_optimizers=disabled_optimizers("cpu")
    )
    runs = Counter(node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node)
    assert sum(runs.values()) <= 60, runs
    assert runs["SkipLayerNormalization"] == 9 and not runs["LayerNormalization"] and not runs["Memcpy"]
    assert len(default_depth_step.graph.node) == 97  # the full step it comes from, as the default model's
    assert [value.name for value in device.graph.output][:3] == [GREEDY_PACKED, *NEXT_STATE]
    assert LIVE in {value.name for value in device.graph.input}


def test_the_device_greedy_steps_state_is_its_token_and_each_live_rows_next_length(tiny_export: Path):
    step = onnx.load(str(tiny_export / "decoder.onnx"))
    session = ort.InferenceSession(device_greedy_graph(step).SerializeToString(), providers=["CPUExecutionProvider"])
    greedy = ort.InferenceSession(greedy_step_graph(step).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = greedy_step_feeds(greedy, [5, 17, 9], [4, 0, 6], cache_len=8, src_len=5)
    log_p, ids = greedy.run(STEP_OUTPUTS[:2], feeds)
    live = np.array([1, 0, 1], np.int32)  # the second row a free slot's
    packed, next_tokens, next_lengths = session.run(None, feeds | {LIVE: live})[:3]
    assert packed.dtype == np.float32 and packed.shape == (3, 2)
    np.testing.assert_array_equal(packed[:, 0].astype(np.int64), ids[:, 0])
    np.testing.assert_allclose(packed[:, 1], log_p[:, 0], atol=1e-5)
    assert next_tokens.tolist() == ids[:, 0].tolist() and next_lengths.tolist() == [5, 0, 7]
