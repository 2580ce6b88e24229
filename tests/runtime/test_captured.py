"""A bucketed batch's steps on a device (runtime/captured.py), run here on the CPU provider as on CUDA: each
bucket's step is bound once, its buffers, binding and graph serve the next batch in the same bucket, copy j of a
k-step graph is fed total_length + j, and outputs are copied to the host only when read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from runtime.captured import Outputs, host_feed
from tests.conftest import own_sentences
from tests.runtime.slotted import address, backend, shape


@pytest.mark.parametrize("steps_per_run", [1, 3])
def test_on_a_device_a_bucket_is_bound_once_and_its_buffers_and_graph_serve_the_next_batch(
    tiny_export: Path, steps_per_run: int
):
    engine = backend(tiny_export, "buckets", io_binding=True, cuda_graphs=True, steps_per_run=steps_per_run)
    steps = engine.device_k_steps or engine.device_steps
    sources = engine.tokenizer.encode_source(own_sentences(6))
    batch = engine.new_batch()
    assert batch.layout.buffers is steps.buffers is engine.device_steps.buffers  # the steps' own, shared
    batch.add([0, 1, 2], engine.encode_sources(sources[:3]), [1, 1, 1], [40, 40, 30])  # 4 slots, greedy
    inputs = batch.step_inputs()
    key = inputs.feeds_key[0]
    fed = {name: (address(value), shape(value)) for name, value in inputs.feeds.items()}
    batch.step()
    held = steps._bound[key]
    on_device = [(address(value), shape(value)) for _, value in held.copies] + [
        (address(value), shape(value)) for value in held.outputs
    ]
    batch.add([3], engine.encode_sources(sources[3:4]), [1], [30])
    batch.step()
    batch.remove(0)
    batch.add([4], engine.encode_sources(sources[4:5]), [1], [20])
    batch.step()
    assert {name: (address(value), shape(value)) for name, value in inputs.feeds.items()} == fed
    assert list(steps._bound) == [key] and steps._bound[key] is held  # one binding: one captured graph
    assert on_device == [(address(value), shape(value)) for _, value in held.copies] + [
        (address(value), shape(value)) for value in held.outputs
    ]
    assert held.options.get_run_config_entry("gpu_graph_id") == str(key)  # the bucket's own graph
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
