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

A greedy bucket's step on a device is ``runtime.step_graphs.device_greedy_graph``'s, which writes the next
step's tokens and lengths on the device itself, into the other of two state sets (the runs alternate between
them, each parity its own binding and captured graph): a steady step sends nothing from the host and reads one
packed output back; the host's tokens and lengths are sent only where a join or a departure made them differ
from what the device holds.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from runtime.batch import StepInputs
from runtime.bucket_buffers import DeviceBuffers
from runtime.contract import GREEDY_PACKED, HOST_FEEDS, LIVE, NEXT_STATE, ON_DEVICE

EVERY_STEP = ("tokens", "lengths")  # copied before every run (a state graph's: only when the device's differ)
# copied when they changed (beams, joins, departures)
AFTER_JOINS = ("row_scores", "candidate_bias", "src_mask", LIVE)


def host_feed(feeds: dict, name: str) -> np.ndarray:
    """A host feed's value: ``total_length@j`` (a k-step graph's copy j) is total_length + j."""
    base, _, step = name.partition("@")
    value = np.ascontiguousarray(feeds[base])
    return value + value.dtype.type(step) if step else value


class _Bound:
    """One buffer set's binding: the device copies of the small feeds and the device outputs. A state graph's
    (one that writes the next step's tokens and lengths: ``NEXT_STATE``) has two, one per parity: the run of
    parity p reads state set p and writes set 1 - p, each its own captured graph."""

    def __init__(self, bindings, copies, outputs, host, options, keep, state) -> None:
        self.bindings, self.copies, self.outputs, self.host, self.options = bindings, copies, outputs, host, options
        self.keep = keep  # values the binding refers to
        self.sent: dict[str, np.ndarray] = {}  # AFTER_JOINS feeds as last copied
        self.state: dict[str, list[ort.OrtValue]] = state  # each state feed's two device buffers
        self.holds: dict[str, np.ndarray] = {}  # what the state set the next run reads holds, as the host knows
        self.parity = 0

    @property
    def binding(self) -> ort.IOBinding:
        return self.bindings[self.parity]


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
    """Runs a step graph (the decoder step, runtime/step_graphs.py's k steps or its device greedy step) over
    bucketed batches' device buffers (see the module's doc), which it owns: ``buffers`` gives a batch's rows their
    buffer sets (runtime/slotted_rows.py takes them from here). ``outputs``: the graph's outputs to read back, in
    the order the batch takes them; ``graphs``: one captured CUDA graph per buffer set (and parity)."""

    def __init__(self, session: ort.InferenceSession, buffers: DeviceBuffers, outputs: list[str], graphs: bool) -> None:
        self.session, self.buffers, self.output_names, self.graphs = session, buffers, outputs, graphs
        self.device = buffers.ops.device
        self.inputs = {value.name: value for value in session.get_inputs()}
        self.presents: dict[str, list[str]] = {}
        self.state: dict[str, str] = {}  # a state graph's: each state feed's next value, by the feed's name
        for value in session.get_outputs():
            if value.name.startswith("present_"):
                past = value.name.split("@")[0].replace("present_", "past_")
                self.presents.setdefault(past, []).append(value.name)
            elif value.name in NEXT_STATE:
                self.state[NEXT_STATE[value.name]] = value.name
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
            for name, values in bound.state.items():  # sent only where the device's differ (joins, departures)
                if not np.array_equal(bound.holds[name], feeds[name]):
                    values[bound.parity].update_inplace(np.ascontiguousarray(feeds[name]))
            for name, value in bound.host:
                value.update_inplace(host_feed(feeds, name))
                bound.binding.bind_ortvalue_input(name, value)
            self.session.run_with_iobinding(bound.binding, bound.options[bound.parity])
            self.runs += 1
            outputs = Outputs(bound.outputs)
            if bound.state:
                self._written(bound, feeds, outputs)
            return outputs

    def greedy(self, inputs: StepInputs) -> tuple[np.ndarray, np.ndarray]:
        """A greedy bucket's run (a batch's ``k_steps_fn``): each row's tokens and log-probabilities (rows, k),
        a k-step graph's two outputs, or the device greedy step's one packed output (GREEDY_PACKED) unpacked."""
        outputs = self(inputs)
        if self.output_names != [GREEDY_PACKED]:
            return outputs[0], outputs[1]
        packed = outputs[0]
        return packed[:, :1].astype(np.int64), packed[:, 1:]

    @staticmethod
    def _written(bound: _Bound, feeds: dict, outputs: Outputs) -> None:
        """After a state graph's run: what it wrote into the other state set (its tokens, read back with the
        packed output the host reads anyway, as floats that hold them exactly; lengths + live), which the next run
        reads."""
        bound.holds = {"tokens": outputs[0][:, 0], "lengths": feeds["lengths"] + feeds[LIVE]}
        bound.parity ^= 1

    def _bind(self, inputs: StepInputs) -> _Bound:
        feeds, binding, keep = inputs.feeds, self.session.io_binding(), []
        copies, host, state, bound_inputs = [], [], {}, {}
        for name in self.inputs:
            source = name.removesuffix(ON_DEVICE).split("@")[0]
            value = host_feed(feeds, name) if "@" in name else feeds[source]
            if isinstance(value, ort.OrtValue):  # a cache or a source's keys: bound where it lives
                bound_inputs[name] = value
                self._bind_input(binding, name, value)
                keep.append(value)
                continue
            # the contract's dtypes, as the copies before each run need; a device's own memory (the CPU provider
            # would share the host's array, which the device's own state writes must not touch)
            on_host = source in HOST_FEEDS and not name.endswith(ON_DEVICE)
            array = np.ascontiguousarray(value) if on_host else np.array(value, order="C")
            value = bound_inputs[name] = ort.OrtValue.ortvalue_from_numpy(array, "cpu" if on_host else self.device, 0)
            binding.bind_ortvalue_input(name, value)
            keep.append(value)
            if on_host:
                host.append((name, value))
            elif name in self.state:  # and its other set, which the run writes
                state[name] = [value, ort.OrtValue.ortvalue_from_numpy(array.copy(), self.device, 0)]
                binding.bind_ortvalue_output(self.state[name], state[name][1])
                keep.append(state[name][1])
            elif source in EVERY_STEP + AFTER_JOINS:
                copies.append((name, value))
        for name in self.output_names:
            binding.bind_output(name, self.device)
        # Outputs bound by device only are made by the first run: run once (the step is a pure function of its
        # feeds, so this run's writes are the ones the batch's next step makes), then fix them at their buffers.
        self.session.run_with_iobinding(binding, self._graph(-1))
        outputs = list(binding.get_outputs()[-len(self.output_names) :])  # bound after the rest
        for name, value in zip(self.output_names, outputs, strict=True):
            binding.bind_ortvalue_output(name, value)
        keep.extend(outputs)
        key = inputs.feeds_key[0]
        bindings, options = [binding], [self._graph(key)]
        if state:
            bindings.append(self._other_parity(bound_inputs, state, outputs))
            options = [self._graph(2 * key), self._graph(2 * key + 1)]
        bound = _Bound(bindings, copies, outputs, host, options, keep, state)
        bound.holds = {name: feeds[name].copy() for name in state}
        return bound

    def _other_parity(self, inputs: dict, state: dict, outputs: list[ort.OrtValue]) -> ort.IOBinding:
        """The binding of parity 1: parity 0's values (``inputs``, by name), its state sets the other way round."""
        binding = self.session.io_binding()
        for name, value in inputs.items():
            if name in state:
                binding.bind_ortvalue_input(name, state[name][1])
                binding.bind_ortvalue_output(self.state[name], state[name][0])
            else:
                self._bind_input(binding, name, value)
        for name, value in zip(self.output_names, outputs, strict=True):
            binding.bind_ortvalue_output(name, value)
        return binding

    def _bind_input(self, binding: ort.IOBinding, name: str, value: ort.OrtValue) -> None:
        """An input, and where it is a cache, its present outputs (written in place)."""
        binding.bind_ortvalue_input(name, value)
        for present in self.presents.get(name, ()):
            binding.bind_ortvalue_output(present, value)

    def _graph(self, graph_id: int) -> ort.RunOptions | None:
        """Run options naming a captured graph (-1: run without one), where graphs are on."""
        if not self.graphs:
            return None
        options = ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", str(graph_id))
        return options
