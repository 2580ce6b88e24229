"""A bucketed batch's steps on a device (``DeviceSteps``), each bucket's step one CUDA graph when asked
(``graphs``): what ONNX Runtime's CUDA graphs need (docs/export.md, "Fixed shapes for CUDA graphs").

Per buffer set (runtime/bucket_buffers.py; the set's key is StepInputs.feeds_key[0]) the step is bound once: the
caches as their own present outputs and the sources' keys, by address, where they live; the small feeds in
device buffers of their own, into which the host's arrays (tokens, lengths, scores, masks) are copied before
each run; the outputs in device buffers, of which the host reads back what the search needs. With ``graphs``,
every run passes ``gpu_graph_id`` = the set's key, so ONNX Runtime captures each bucket's step once (after its
warm-up runs, on the same inputs: the step is a pure function of them, its cache entry written at the same slot)
and replays it from then on. The feeds that kernels read on the host (``HOST_FEEDS``: GroupQueryAttention's
total length, TopK's k) stay on the host and are fixed per bucket; where the graph also computes with one on
the device, ``runtime.step_graphs.split_host_feeds`` gives those nodes a device copy, so no Memcpy node stops
the capture.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from runtime.batch import StepInputs
from runtime.bucket_buffers import DeviceBuffers
from runtime.contract import HOST_FEEDS, ON_DEVICE

EVERY_STEP = ("tokens", "lengths")  # copied before every run
AFTER_JOINS = ("row_scores", "candidate_bias", "src_mask")  # copied when they changed (beams, joins, departures)


def host_feed(feeds: dict, name: str) -> np.ndarray:
    """A host feed's value: ``total_length@j`` (a k-step graph's copy j) is total_length + j."""
    base, _, step = name.partition("@")
    value = np.ascontiguousarray(feeds[base])
    return value + value.dtype.type(step) if step else value


class _Bound:
    """One buffer set's binding: the device copies of the small feeds and the device outputs."""

    def __init__(self, binding: ort.IOBinding, copies, outputs, host, options, keep) -> None:
        self.binding, self.copies, self.outputs, self.host, self.options = binding, copies, outputs, host, options
        self.keep = keep  # values the binding refers to
        self.sent: dict[str, np.ndarray] = {}  # AFTER_JOINS feeds as last copied


class Outputs(Sequence):
    """A run's outputs, each copied to the host when first read (a greedy batch reads two of six)."""

    def __init__(self, values: list[ort.OrtValue]) -> None:
        self.values, self.read = values, {}

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index):  # noqa: ANN001, ANN204 (an int or a slice, as a tuple's)
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        if index not in self.read:
            self.read[index] = self.values[index].numpy()
        return self.read[index]


class DeviceSteps:
    """Runs a step graph (the decoder step, or runtime/step_graphs.py's k steps) over bucketed batches' device
    buffers (see the module's doc), which it owns: ``buffers`` gives a batch's rows their buffer sets
    (runtime/slotted_rows.py takes them from here). ``outputs``: the graph's outputs to read back, in the order the
    batch takes them; ``graphs``: one captured CUDA graph per buffer set."""

    def __init__(self, session: ort.InferenceSession, buffers: DeviceBuffers, outputs: list[str], graphs: bool) -> None:
        self.session, self.buffers, self.output_names, self.graphs = session, buffers, outputs, graphs
        self.device = buffers.ops.device
        self.inputs = {value.name: value for value in session.get_inputs()}
        self.presents: dict[str, list[str]] = {}
        for value in session.get_outputs():
            if value.name.startswith("present_"):
                past = value.name.split("@")[0].replace("present_", "past_")
                self.presents.setdefault(past, []).append(value.name)
        self._bound: dict[int, _Bound] = {}
        self._lock = threading.Lock()  # one run at a time: a captured graph is replayed from one thread
        self.runs = 0

    def __call__(self, inputs: StepInputs) -> Outputs:
        feeds = inputs.feeds
        with self._lock:
            bound = self._bound.get(inputs.feeds_key[0])
            if bound is None:
                bound = self._bound[inputs.feeds_key[0]] = self._bind(inputs)
            for name, value in bound.copies:
                array = feeds[name]
                if name in AFTER_JOINS:
                    sent = bound.sent.get(name)
                    if sent is not None and np.array_equal(sent, array):
                        continue
                    bound.sent[name] = array.copy()
                value.update_inplace(np.ascontiguousarray(array))
            for name, value in bound.host:
                value.update_inplace(host_feed(feeds, name))
                bound.binding.bind_ortvalue_input(name, value)
            self.session.run_with_iobinding(bound.binding, bound.options)
            self.runs += 1
            return Outputs(bound.outputs)

    def _bind(self, inputs: StepInputs) -> _Bound:
        feeds, binding, keep = inputs.feeds, self.session.io_binding(), []
        copies, host = [], []
        for name in self.inputs:
            source = name.removesuffix(ON_DEVICE).split("@")[0]
            value = host_feed(feeds, name) if "@" in name else feeds[source]
            if isinstance(value, ort.OrtValue):  # a cache or a source's keys: bound where it lives
                binding.bind_ortvalue_input(name, value)
                for present in self.presents.get(name, ()):
                    binding.bind_ortvalue_output(present, value)
                keep.append(value)
                continue
            array = np.ascontiguousarray(value)  # the contract's dtypes, as the copies before each run need
            on_host = source in HOST_FEEDS and not name.endswith(ON_DEVICE)
            value = ort.OrtValue.ortvalue_from_numpy(array, "cpu" if on_host else self.device, 0)
            binding.bind_ortvalue_input(name, value)
            keep.append(value)
            if on_host:
                host.append((name, value))
            elif source in EVERY_STEP + AFTER_JOINS:
                copies.append((name, value))
        for name in self.output_names:
            binding.bind_output(name, self.device)
        # Outputs bound by device only are made by the first run: run once (the step is a pure function of its
        # feeds, so this run's writes are the ones the batch's next step makes), then fix them at their buffers.
        self.session.run_with_iobinding(binding, self._graph(-1))
        outputs = list(binding.get_outputs()[-len(self.output_names) :])  # bound after the presents
        for name, value in zip(self.output_names, outputs, strict=True):
            binding.bind_ortvalue_output(name, value)
        keep.extend(outputs)
        return _Bound(binding, copies, outputs, host, self._graph(inputs.feeds_key[0]), keep)

    def _graph(self, graph_id: int) -> ort.RunOptions | None:
        """Run options naming a captured graph (-1: run without one), where graphs are on."""
        if not self.graphs:
            return None
        options = ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", str(graph_id))
        return options
