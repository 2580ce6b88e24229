"""A decoder step's bindings: its feeds bound by reference and its caches as its outputs too, so a step writes
the new entries in place and costs one ``run_with_iobinding`` call; ``StepBindings`` keeps a session's bindings
for each batch while its feeds keep their shapes and memory (``StepInputs.feeds_key``)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from runtime.batch import StepInputs, StepOutputs
from runtime.contract import CANDIDATE_OUTPUTS, K_STEP_OUTPUTS, ORT_DTYPES, STEP_OUTPUTS, output_arrays, present_names
from runtime.device_cache import BufferView


@dataclass
class StepBinding:
    """A decoder session's binding to one batch's feeds (one ``feeds_key``), and the values it needs kept alive."""

    binding: ort.IOBinding
    outputs: tuple[np.ndarray, ...]  # STEP_OUTPUTS, then CANDIDATE_OUTPUTS
    values: list[ort.OrtValue | np.ndarray]  # what the binding reads or writes, kept alive
    # For a session on another device, the inputs bound from host memory the caller updates between steps:
    # ONNX Runtime copies a host input when it is bound, not when it runs, so these are bound again before
    # each run (on the CPU the bound memory is the feed itself, and there are none).
    host_inputs: list[tuple[str, ort.OrtValue]] = field(default_factory=list)

    def run(self, session: ort.InferenceSession) -> None:
        for name, value in self.host_inputs:
            self.binding.bind_ortvalue_input(name, value)
        session.run_with_iobinding(self.binding)


def bind_step(
    decoder: ort.InferenceSession,
    feeds: dict[str, Any],
    device: str = "cpu",
    feeds_on: str = "cpu",
) -> StepBinding:
    """Bind a decoder step's feeds by reference, each past buffer as its present output too, so the step
    writes the new entries in place. A device cache's buffers (``BufferView``) are bound on ``device``, where
    they live. Numpy feeds become values on ``feeds_on``: on the host (the default), the same memory, which the
    caller may update between steps (for a session on another device, ``StepBinding.run`` binds them again before
    each run); on the device, a copy made once, for a single step or a replay of fixed feeds. A binding does
    not keep what it binds alive, so the values are kept with it."""
    binding, values, host_inputs = decoder.io_binding(), [], []
    for name, value in feeds.items():
        if isinstance(value, BufferView):  # a device cache buffer's live rows, in place
            args = (device, 0, ORT_DTYPES[value.value.data_type()], list(value.shape), value.value.data_ptr())
            binding.bind_input(name, *args)
            binding.bind_output(name.replace("past_", "present_"), *args)
            values.append(value.value)
            continue
        if device == feeds_on == "cpu" and isinstance(value, np.ndarray) and not name.startswith("past_"):
            bind_host_input(binding, name, value, values)
            continue
        if not isinstance(value, ort.OrtValue):
            assert value.flags.c_contiguous, name  # a copy would not see the caller's updates
            value = ort.OrtValue.ortvalue_from_numpy(value, feeds_on)
            if feeds_on == "cpu" and device != "cpu":
                host_inputs.append((name, value))
        values.append(value)
        binding.bind_ortvalue_input(name, value)
        if name.startswith("past_"):
            binding.bind_ortvalue_output(name.replace("past_", "present_"), value)
    outputs = tuple(output_arrays(len(feeds["tokens"]), len(feeds["groups"]), int(feeds["top_k"][0])))
    for name, array in zip(STEP_OUTPUTS + CANDIDATE_OUTPUTS, outputs, strict=True):
        values.append(ort.OrtValue.ortvalue_from_numpy(array))
        binding.bind_ortvalue_output(name, values[-1])
    return StepBinding(binding, outputs, values, host_inputs)


def bind_host_input(binding: ort.IOBinding, name: str, array: np.ndarray, kept: list) -> None:
    """Bind a host array as a CPU session's input by reference, the array kept alive in ``kept``: without the
    value ``ortvalue_from_numpy`` makes (0.7 against 2.8 µs a feed, and a batch binds ~20 at every join and
    departure). A past buffer, which is also bound as its present output, needs that value."""
    assert array.flags.c_contiguous, name  # a copy would not see the caller's updates
    binding.bind_cpu_input(name, array)
    kept.append(array)


def run_in_place(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One step as the engine runs it (``bind_step``), on the session's device, float feeds cast to the
    graph's float type. Returns every output by name, the caches as they are after the step."""
    types = {i.name: ORT_DTYPES.get(i.type) for i in session.get_inputs()}
    device = "cuda" if "CUDAExecutionProvider" in session.get_providers() else "cpu"
    feeds = {name: value.astype(types[name]) if types[name] else value for name, value in feeds.items()}
    bound = bind_step(session, feeds, device, feeds_on=device)
    session.run_with_iobinding(bound.binding)
    inputs = zip(feeds, bound.values[: len(feeds)], strict=True)  # the bound feeds, then the outputs
    caches = {name.replace("past_", "present_"): value for name, value in inputs if name.startswith("past_")}
    outputs = dict(zip(STEP_OUTPUTS + CANDIDATE_OUTPUTS, bound.outputs, strict=True))
    return outputs | {name: value.numpy().copy() for name, value in caches.items()}  # before the values go


class StepBindings:
    """A decoder session's step, run over bindings it keeps for each batch (weakly, by the batch's key: they go
    with the batch) while its feeds' key holds: a greedy batch between joins and departures binds once.
    When the key changes, the bindings that differ from it only in which of a device cache's two buffer sets
    is live are kept (beam search alternates between them)."""

    def __init__(
        self, session: ort.InferenceSession, device: str, bind: Callable[..., StepBinding] | None = None
    ) -> None:
        """``bind(session, feeds, device)``: how a key's feeds are bound (``bind_step``; the k-step graph's
        ``bind_k_steps``)."""
        self.session, self.device, self.bind = session, device, bind or bind_step
        self._kept: weakref.WeakKeyDictionary[Any, dict[tuple, StepBinding]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # translate-file's workers step their batches on one session at once

    def run(self, inputs: StepInputs) -> StepOutputs:
        kept = self._kept.get(inputs.batch)
        bound = None if kept is None else kept.get(inputs.feeds_key)
        if bound is None:
            bound = self._bind(inputs)
        bound.run(self.session)
        return bound.outputs

    def _bind(self, inputs: StepInputs) -> StepBinding:
        bound = self.bind(self.session, inputs.feeds, self.device)
        family = inputs.feeds_key[:-1]
        with self._lock:
            kept = self._kept.get(inputs.batch, {})
            kept = {key: b for key, b in kept.items() if key[:-1] == family}
            kept[inputs.feeds_key] = bound
            self._kept[inputs.batch] = kept
        return bound


def bind_k_steps(session: ort.InferenceSession, feeds: dict[str, Any], device: str, k: int) -> StepBinding:
    """A k-step graph (runtime/step_graphs.py) bound as ``bind_step`` binds a step (host feeds by reference;
    ``StepBindings`` keeps it per feeds' key), with each past buffer bound as every copy's present output too,
    and the run's tokens and log-probabilities written into arrays that ``StepBindings.run`` returns."""
    assert device == "cpu", device  # host buffers only, for now
    declared = {value.name for value in session.get_inputs()}
    pasts = [name for name in feeds if name.startswith("past_")]
    presents = present_names(len(pasts) // 2, k)
    binding, values = session.io_binding(), []
    for name, array in feeds.items():
        if name not in declared:
            continue
        if name not in pasts:
            bind_host_input(binding, name, array, values)
            continue
        assert array.flags.c_contiguous, name  # a copy would not see the batch's updates
        value = ort.OrtValue.ortvalue_from_numpy(array)  # the same memory
        values.append(value)
        binding.bind_ortvalue_input(name, value)
        for names in presents:
            binding.bind_ortvalue_output(names[pasts.index(name)], value)
    rows = len(feeds["tokens"])
    outputs = (np.empty((rows, k), np.int64), np.empty((rows, k), np.float32))
    for name, array in zip(K_STEP_OUTPUTS, outputs, strict=True):
        values.append(ort.OrtValue.ortvalue_from_numpy(array))
        binding.bind_ortvalue_output(name, values[-1])
    return StepBinding(binding, outputs, values)
