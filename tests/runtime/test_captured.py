"""A bucketed batch's steps on a device (runtime/captured.py), run here on the CPU provider as on CUDA: each
bucket's step is bound once, its buffers, binding and graph serve the next batch in the same bucket, copy j of a
k-step graph is fed total_length + j, outputs are copied to the host only when read, and a greedy bucket's steady
step sends nothing from the host."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from runtime.captured import Outputs, host_feed
from runtime.contract import GREEDY_PACKED
from runtime.search import Decoding
from tests.conftest import own_sentences
from tests.runtime.slotted import address, backend, shape


@pytest.mark.parametrize("steps_per_run", [1, 3])
def test_on_a_device_a_bucket_is_bound_once_and_its_buffers_and_graph_serve_the_next_batch(
    tiny_export: Path, steps_per_run: int
):
    engine = backend(tiny_export, "buckets", io_binding=True, cuda_graphs=True, steps_per_run=steps_per_run)
    steps = engine.device_k_steps  # a greedy bucket's runs: the device greedy step, or k steps
    sources = engine.tokenizer.encode_source(own_sentences(6))
    batch = engine.new_batch()
    assert batch.layout.buffers is steps.buffers is engine.device_steps.buffers  # the steps' own, shared
    batch.add([0, 1, 2], engine.encode_sources(sources[:3]), [1, 1, 1], [40, 40, 30])  # 4 slots, greedy
    inputs = batch.step_inputs()
    key = inputs.feeds_key[0]
    fed = {name: (address(value), shape(value)) for name, value in inputs.feeds.items()}
    batch.step()
    held = steps._bound[key]

    def bound_values() -> list:
        state = [value for pair in held.state.values() for value in pair]
        values = [value for _, value in held.copies] + list(held.outputs) + state
        return [(address(value), shape(value)) for value in values]

    on_device = bound_values()
    batch.add([3], engine.encode_sources(sources[3:4]), [1], [30])
    batch.step()
    batch.remove(0)
    batch.add([4], engine.encode_sources(sources[4:5]), [1], [20])
    batch.step()
    assert {name: (address(value), shape(value)) for name, value in inputs.feeds.items()} == fed
    assert list(steps._bound) == [key] and steps._bound[key] is held  # one binding: one captured graph
    assert on_device == bound_values()
    graphs = [options.get_run_config_entry("gpu_graph_id") for options in held.options]
    # the bucket's own graph; the device greedy step's, one per parity of its state sets
    assert graphs == ([str(key)] if steps_per_run > 1 else [str(2 * key), str(2 * key + 1)])
    batch.drain()
    assert engine.device_steps.buffers.made == 1
    # A new batch in the same bucket takes the same buffers, binding and graph: nothing is made again.
    again = engine.new_batch()
    again.add([0, 1, 2], engine.encode_sources(sources[:3]), [1, 1, 1], [40, 40, 30])
    assert again.step_inputs().feeds_key[0] == key
    again.drain()
    assert engine.device_steps.buffers.made == 1 and list(steps._bound) == [key]


def test_a_k_step_graphs_copy_j_reads_total_length_plus_j():
    feeds = {"total_length": np.array(7, np.int32), "top_k": np.array([4], np.int64)}
    later = host_feed(feeds, "total_length@2")
    assert later == 9 and later.dtype == np.int32
    assert host_feed(feeds, "total_length") == 7 and host_feed(feeds, "top_k").tolist() == [4]
    assert feeds["total_length"] == 7  # the batch's own feed is left as it was


def test_outputs_are_copied_to_the_host_once_and_only_when_read():
    arrays = [np.full((2, 3), i, np.float32) for i in range(4)]
    outputs = Outputs([ort.OrtValue.ortvalue_from_numpy(array, "cpu", 0) for array in arrays])
    assert len(outputs) == 4 and outputs.read == {}
    first = outputs[1]
    np.testing.assert_array_equal(first, arrays[1])
    assert outputs[1] is first and set(outputs.read) == {1}  # read back once
    sliced = outputs[:2]
    assert isinstance(sliced, tuple) and len(sliced) == 2 and sliced[1] is first
    np.testing.assert_array_equal(sliced[0], arrays[0])
    assert set(outputs.read) == {0, 1}  # the other two never left the device


def test_a_steady_greedy_step_sends_nothing_from_the_host_and_reads_one_output(tiny_export: Path, monkeypatch):
    """The device greedy step writes the next run's tokens and lengths into the other state set: a step with no
    join or departure updates no device value and reads one back (GREEDY_PACKED); a join sends the state once."""
    engine = backend(tiny_export, "buckets", io_binding=True, cuda_graphs=True)
    steps = engine.device_k_steps
    assert steps.output_names == [GREEDY_PACKED] and set(steps.state) == {"tokens", "lengths"}
    sources = engine.tokenizer.encode_source(own_sentences(4))
    batch = engine.new_batch(Decoding(eos_id=-1))  # no eos: every row decodes for every step
    batch.add([0, 1, 2], engine.encode_sources(sources[:3]), [1, 1, 1], [30, 30, 30])  # 4 slots
    batch.step()
    held = steps._bound[batch.step_inputs().feeds_key[0]]
    host = {id(value) for _, value in held.host}  # total_length: read by its kernel in host memory
    calls = Counter()
    for owner, name, kind in ((ort.OrtValue, "update_inplace", "up"), (ort.OrtValue, "numpy", "down")):
        original = getattr(owner, name)

        def spy(value, *args, _original=original, _kind=kind):
            calls[_kind] += id(value) not in host
            return _original(value, *args)

        monkeypatch.setattr(owner, name, spy)
    for _ in range(5):
        batch.step()
    assert calls == {"up": 0, "down": 5}
    parity = held.parity
    for p, binding in enumerate(held.bindings):  # parity p reads set p and writes set 1 - p
        written = {address(value) for value in binding.get_outputs()}
        assert {address(pair[1 - p]) for pair in held.state.values()} <= written
    batch.add([3], engine.encode_sources(sources[3:4]), [1], [30])  # into the free slot: the same bucket
    calls.clear()
    batch.step()
    assert steps._bound[batch.step_inputs().feeds_key[0]] is held and held.parity != parity
    assert calls == {"up": 3, "down": 1}  # tokens (its start), live, the source mask: a free slot's length was 0
    calls.clear()
    batch.step()
    assert calls == {"up": 0, "down": 1}
