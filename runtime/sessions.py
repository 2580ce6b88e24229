"""Runtime-side decoding over an exported model folder: numpy + ONNX Runtime, no torch.

The server's engine is built on ``OrtModel``. On CUDA the cross-attention
keys/values stay on the device between steps (IOBinding): they are copied
there once each time sources join the batch, not at every step; on CPU plain
numpy arrays are passed without copies. The same IOBinding path runs on the CPU
provider too (``io_binding=True``), which is how it is tested without a GPU.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from model.config import ModelConfig
from runtime.contract import CANDIDATE_OUTPUTS, ORT_DTYPES, STEP_INPUTS, STEP_OUTPUTS, output_arrays
from runtime.cpu import describe_cpu, int8_products_saturate
from runtime.manifest import ModelFolderError, Provider, Variant, read_manifest
from runtime.search import (
    LENGTH_PENALTY,
    CachePool,
    DecodeBatch,
    Hypothesis,
    KVCache,
    pad_sources,
    source_searches,
    translate_in_batches,
)
from runtime.tokenizer import Tokenizer, TokenizerError

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
# Allocations over this get their own mapping, returned on free: long inputs' encoder states and the
# caches. Below it, a decoder step's many allocations reuse the heap: a lower threshold (128 KiB) cost
# 40% of batch-32 throughput in mmap/munmap page faults (2-core x86-64, int8, one run, alternating).
MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 64 << 20  # heap kept before it is given back: trimming every step costs as much
ALIGN_GROUP = 16  # pairs per aligner call
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
# ONNX Runtime fusions that make our graphs slower on the CPU, disabled in every session: fused
# SkipLayerNormalization is 3-4x slower than Add + LayerNormalization (see export/builder.py).
NO_FUSIONS = ["SkipLayerNormFusion"]
CACHE_OPS = Path(__file__).resolve().parent / "cache_ops"  # built by export/cache_ops.py


def cache_op_path(op: str, dtype: type) -> Path:
    """A one-node graph over cache buffers (``gather`` or ``pad``) for this dtype."""
    return CACHE_OPS / f"{op}.{np.dtype(dtype).name}.onnx"


def _host_float32(value: Any) -> np.ndarray:
    """An encoder output (numpy, or an OrtValue on any device) as a float32 host array."""
    array = value.numpy() if isinstance(value, ort.OrtValue) else value
    return np.asarray(array, np.float32)


class ProviderUnavailable(ValueError):
    """The execution provider asked for cannot run here: this onnxruntime build lacks it, or it could not load
    (ONNX Runtime would otherwise fall back to the CPU without a word)."""


def resolve_provider(requested: str) -> str:
    """'cpu', 'cuda' or 'auto' (CUDA when this onnxruntime build can use it, else CPU)."""
    available = ort.get_available_providers()
    if requested == "auto":
        return "cuda" if PROVIDERS["cuda"] in available else "cpu"
    if requested not in PROVIDERS:
        raise ValueError(f"provider {requested!r}: use cpu, cuda or auto")
    if PROVIDERS[requested] not in available:
        raise ProviderUnavailable(
            f"provider {requested!r} is not available in this onnxruntime build (has {available})"
        )
    return requested


@dataclass(frozen=True)
class RuntimeOptions:
    variant: Variant = "fp32"
    provider: Provider = "auto"
    intra_op_threads: int = 0  # 0: ONNX Runtime's default (one per physical core)
    # Intra-op threads spin between a run's tasks instead of sleeping, and stop when the run returns
    # (session.force_spinning_stop), so they never steal a core from the numpy work between decoder steps or
    # from the other session. Spinning this way in both sessions against the decoder's alone spinning for
    # good: fp32 batch 32 greedy 1.06x, beam 4 1.04x (2-core x86-64, medians of 7, alternating in one
    # process); a spinning encoder beside a decoder that never stops spinning was 0.95x. The server keeps it
    # off: its lanes share the cores, and a spinning run steals from the other lanes' runs.
    spinning: bool = True
    io_binding: bool | None = None  # None: on for CUDA, off for CPU
    # The self-attention cache on the step's device for the whole decode (DeviceKVCache; implies
    # io_binding). None: on for CUDA with an fp16 variant (device_cache_for says why not fp32); on the CPU
    # provider it runs the same code, for tests.
    device_cache: bool | None = None
    verify_files: bool = True
    # CPU: batches under SMALL_BATCH_ROWS rows run on sessions with this many threads (None: the same ones).
    small_batch_threads: int | None = None
    # CPU: a batch marked ``narrow`` (it shares the cores with other batches running at once: the server's
    # longer lanes while a shorter one decodes) runs on sessions with this many threads (None: the same ones).
    # Two sessions' runs whose threads together outnumber the cores waste CPU: a run waits for its
    # parallel section's share on a thread that the other run's threads hold off the core.
    narrow_threads: int | None = None
    # ONNX Runtime's CPU arena keeps the largest intermediates a session ever made (an encoder call over a
    # long input) for good, rounded up to powers of two; without it they go back to the allocator (see
    # bound_process_memory). No measurable speed difference (2-core x86-64, int8, batch 1 and 32).
    memory_arena: bool = False
    # Offline decoding (``OrtModel.hypotheses``) makes a self-attention cache per batch; with this, each takes
    # the buffers of the last one that emptied when they fit (CachePool) instead of fresh pages. The server
    # leaves it off: its batches live on, and an idle cache would be memory its budget does not count.
    reuse_cache_buffers: bool = False


# Below this many rows a step is too small to share between threads: waking a second intra-op thread
# costs more than it saves (one-row step 1.10 ms on one thread vs 1.53 ms on two; 8 rows 2.34 vs 2.90;
# 32 rows 8.29 vs 7.45: 2-core x86-64, see benchmarks/threads.md).
SMALL_BATCH_ROWS = 16
# Sources encoded together by OrtModel.translate_ids, sorted by length: a batch of 32 test_2016_flickr
# sentences pads less in two groups (the encoder's work is its padded tokens): beam 4 +3-8%, greedy even.
ENCODER_GROUP = 16


def _session_for(rows: int, narrow: bool, session, small, narrow_session):
    """Which of a graph's sessions a run of ``rows`` rows takes: the narrow one for a narrow batch, the
    small-batch one under SMALL_BATCH_ROWS rows, else the session on every intra-op thread."""
    if narrow:
        return narrow_session
    return small if rows < SMALL_BATCH_ROWS else session


def bound_process_memory() -> None:
    """Make the process's resident memory follow what it holds, so a memory budget can be kept: numpy no
    longer asks for transparent huge pages (a lazily zeroed cache buffer would be paged in 2 MiB at a
    time as slots are written: 2.5x the estimate at 256 tokens), and glibc serves allocations over
    MMAP_THRESHOLD with their own mappings, returned on free (by default it raises that threshold after
    large frees, and then keeps freed encoder intermediates). Process-wide; the engine calls it."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    if hasattr(multiarray, "_set_madvise_hugepage"):
        multiarray._set_madvise_hugepage(False)
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    except OSError:  # not glibc
        pass


@dataclass(frozen=True)
class BufferView:
    """The first rows of a device buffer, bound to the step by address (ONNX Runtime values cannot be sliced)."""

    value: ort.OrtValue
    shape: tuple[int, ...]


class CacheOps:
    """Row gathers and zero-padded copies of cache buffers, run where the buffers live (one-node graphs on
    the step's execution provider), so a device-resident cache never visits the host."""

    def __init__(self, provider: str, device: str, dtype: type) -> None:
        self.device, self.dtype = device, dtype
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        graph = lambda op: str(cache_op_path(op, dtype))  # noqa: E731
        self.gather = ort.InferenceSession(graph("gather"), options, providers=[provider])
        self.pad = ort.InferenceSession(graph("pad"), options, providers=[provider])

    def empty(self, shape: tuple[int, ...]) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), self.dtype, self.device, 0)

    def run(self, session: ort.InferenceSession, source: BufferView, index: np.ndarray, target: BufferView) -> None:
        binding = session.io_binding()
        binding.bind_input("x", self.device, 0, self.dtype, list(source.shape), source.value.data_ptr())
        binding.bind_cpu_input(session.get_inputs()[1].name, index)
        binding.bind_output("y", self.device, 0, self.dtype, list(target.shape), target.value.data_ptr())
        session.run_with_iobinding(binding)


class DeviceKVCache(KVCache):
    """The self-attention cache on the step's device for the whole decode (CUDA; tested on the CPU provider):
    buffers are ONNX Runtime values, bound to the step by address; reordering rows gathers into the spare
    buffers and growing copies with zero padding, both by ``CacheOps`` on the device. Rows are always
    gathered (no in-place moves on a device)."""

    moves_in_place = False

    def __init__(self, layers: int, heads: int, d_cache: int, dtype, ops: CacheOps) -> None:
        self.ops = ops
        super().__init__(layers, heads, d_cache, dtype)

    def _buffer(self, rows: int, capacity: int) -> ort.OrtValue:
        return self.ops.empty((rows, self.heads, capacity, self.d_cache))

    @staticmethod
    def _shape(buffer: ort.OrtValue) -> tuple[int, ...]:
        return tuple(buffer.shape())

    def _copy_live(self, old: ort.OrtValue, new: ort.OrtValue, longest: int) -> None:
        """All rows of old, zero-padded to new's shape (whole rows: padding needs no strides)."""
        shape, target = self._shape(old), self._shape(new)
        if 0 in shape:
            return
        pads = np.array([0, 0, 0, 0, target[0] - shape[0], 0, target[2] - shape[2], 0], np.int64)
        self.ops.run(self.ops.pad, BufferView(old, shape), pads, BufferView(new, target))

    def _gather(self, old: ort.OrtValue, new: ort.OrtValue, rows: np.ndarray, longest: int) -> None:
        _, heads, capacity, d = self._shape(old)
        source = BufferView(old, (self.rows, heads, capacity, d))
        self.ops.run(self.ops.gather, source, rows.astype(np.int64), BufferView(new, (len(rows), heads, capacity, d)))

    def view(self, buffer: ort.OrtValue) -> BufferView:
        _, heads, capacity, d = self._shape(buffer)
        return BufferView(buffer, (self.rows, heads, capacity, d))


@dataclass
class _Binding:
    """A decoder session's binding to one layout of one batch, and the values it needs kept alive."""

    version: Any  # the batch layout it was made for
    binding: ort.IOBinding
    outputs: tuple[np.ndarray, ...]  # STEP_OUTPUTS, then CANDIDATE_OUTPUTS
    values: list[ort.OrtValue]
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
    version: Any = None,
    device: str = "cpu",
    feeds_on: str = "cpu",
) -> _Binding:
    """Bind a decoder step's feeds by reference, each past buffer as its present output too, so the step
    writes the new entries in place. A device cache's buffers (``BufferView``) are bound on ``device``, where
    they live. Numpy feeds become values on ``feeds_on``: on the host (the default), the same memory, which the
    caller may update between steps (for a session on another device, ``_Binding.run`` binds them again before
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
    return _Binding(version, binding, outputs, values, host_inputs)


def run_in_place(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One step as the engine runs it (``bind_step``), on the session's device, float feeds cast to the
    graph's float type. Returns every output by name, the caches as they are after the step."""
    types = {i.name: ORT_DTYPES.get(i.type) for i in session.get_inputs()}
    device = "cuda" if "CUDAExecutionProvider" in session.get_providers() else "cpu"
    feeds = {name: value.astype(types[name]) if types[name] else value for name, value in feeds.items()}
    bound = bind_step(session, feeds, device=device, feeds_on=device)
    session.run_with_iobinding(bound.binding)
    inputs = zip(feeds, bound.values[: len(feeds)], strict=True)  # the bound feeds, then the outputs
    caches = {name.replace("past_", "present_"): value for name, value in inputs if name.startswith("past_")}
    outputs = dict(zip(STEP_OUTPUTS + CANDIDATE_OUTPUTS, bound.outputs, strict=True))
    return outputs | {name: value.numpy().copy() for name, value in caches.items()}  # before the values go


def device_cache_for(provider: str, cache_dtype: type, requested: bool | None) -> bool:
    """Whether the self-attention cache lives on the step's device (``RuntimeOptions.device_cache``; None: the
    default). ONNX Runtime's CUDA ``GroupQueryAttention`` has float16 and bfloat16 kernels only, so an fp32 step
    on CUDA runs its self-attention on the CPU and copies the cache across at every step. With the cache bound
    on the device that decoded wrongly (13.7-21.7% of test_2016_flickr identical to the CPU provider, against
    100% with the cache on the host; NVIDIA H200, ONNX Runtime 1.30, benchmarks/gpu_check.md): on CUDA only
    an fp16 cache lives on the device, and asking for an fp32 one there is refused. The CPU provider runs the
    device cache's code for tests."""
    if requested is None:
        return provider == "cuda" and cache_dtype == np.float16
    if requested and provider == "cuda" and cache_dtype != np.float16:
        raise ValueError(
            "device_cache: an fp32 cache cannot live on CUDA (ONNX Runtime's CUDA GroupQueryAttention has no "
            "float32 kernel, so the step's self-attention runs on the CPU): use the fp16 variant, or leave "
            "device_cache unset for a host cache"
        )
    return requested


class OrtModel:
    """An exported model folder loaded into two ONNX Runtime sessions."""

    def __init__(self, folder: str | Path, options: RuntimeOptions = RuntimeOptions()) -> None:
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder, verify=options.verify_files)
        variants = self.manifest["variants"]
        if options.variant not in variants:
            raise ModelFolderError(f"{self.folder} has no {options.variant!r} variant (has {sorted(variants)})")
        self.variant = options.variant
        self.config = ModelConfig.from_dict(self.manifest["model_config"])
        self.length_penalty = float(self.manifest.get("decoding", {}).get("length_penalty", LENGTH_PENALTY))
        try:  # a file name (older manifests) or {"kind", "files"}
            self.tokenizer = Tokenizer.load(self.folder, self.manifest["tokenizer"])
        except TokenizerError as e:
            raise ModelFolderError(str(e)) from e
        self.provider = resolve_provider(options.provider)
        self.device = "cuda" if self.provider == "cuda" else "cpu"
        try:
            self.encoder, self.decoder = self._sessions(options, options.intra_op_threads)
        except ProviderUnavailable as error:
            if options.provider != "auto":
                raise
            log.warning("provider auto: %s; using the CPU", error)
            self.provider = self.device = "cpu"
            self.encoder, self.decoder = self._sessions(options, options.intra_op_threads)
        if self.variant == "int8" and not variants["int8"].get("quantization", {}).get("reduce_range"):
            self._warn_if_int8_saturates()  # on the provider the sessions took
        self.small_encoder, self.small_decoder = self.encoder, self.decoder
        small = options.small_batch_threads
        if self.provider == "cpu" and small is not None and small != options.intra_op_threads:
            self.small_encoder, self.small_decoder = self._sessions(options, small)
        self.narrow_encoder, self.narrow_decoder = self.encoder, self.decoder
        narrow = options.narrow_threads
        if self.provider == "cpu" and narrow is not None and narrow != options.intra_op_threads:
            self.narrow_encoder, self.narrow_decoder = self._sessions(options, narrow)
        missing = sorted(STEP_INPUTS - {i.name for i in self.decoder.get_inputs()})
        if missing:
            raise ModelFolderError(
                f"{self.folder} was exported by an older version (its decoder step lacks {', '.join(missing)}); "
                f"export it again: python -m export --out {self.folder} --force"
            )
        past = next(i for i in self.decoder.get_inputs() if i.name == "past_key_0")
        self.cache_dtype = ORT_DTYPES[past.type]
        self.d_cache = past.shape[3]
        self.device_cache = device_cache_for(self.provider, self.cache_dtype, options.device_cache)
        self.io_binding = self.provider == "cuda" if options.io_binding is None else options.io_binding
        self.io_binding = self.io_binding or self.device_cache
        self._aligner: tuple[ort.InferenceSession, list[tuple[int, int]]] | None = None  # made on first use
        self._aligner_lock = threading.Lock()
        self._cache_ops = (
            CacheOps(PROVIDERS[self.provider], self.device, self.cache_dtype) if self.device_cache else None
        )
        self.cache_pool: CachePool | None = CachePool() if options.reuse_cache_buffers else None

    def _warn_if_int8_saturates(self) -> None:
        """An int8 export from before 7-bit weights loses BLEU on CPUs without VNNI (export/optimize.py)."""
        if self.provider == "cpu" and int8_products_saturate():
            log.warning(
                "%s: its int8 weights use 8 bits, which this CPU's int8 products saturate (%s): translations "
                "lose quality; export it again (python -m export --int8 --force) or serve --variant fp32",
                self.folder,
                describe_cpu(),
            )

    def _sessions(self, options: RuntimeOptions, threads: int) -> tuple[ort.InferenceSession, ort.InferenceSession]:
        files = self.manifest["variants"][self.variant]
        sessions = []
        for part in ("encoder", "decoder"):
            session_options = ort.SessionOptions()
            session_options.intra_op_num_threads = threads
            session_options.add_session_config_entry("session.intra_op.allow_spinning", str(int(options.spinning)))
            session_options.add_session_config_entry("session.force_spinning_stop", str(int(options.spinning)))
            session_options.inter_op_num_threads = 1
            session_options.enable_cpu_mem_arena = options.memory_arena
            path, providers = str(self.folder / files[part]), [PROVIDERS[self.provider]]
            session = ort.InferenceSession(path, session_options, providers, disabled_optimizers=NO_FUSIONS)
            if session.get_providers()[0] != providers[0]:  # ONNX Runtime fell back to another provider
                raise ProviderUnavailable(
                    f"provider {self.provider!r}: ONNX Runtime could not use {providers[0]} for {path} and fell "
                    f"back to {session.get_providers()[0]}; on CUDA, onnxruntime-gpu must be built for this "
                    "machine's CUDA (PyPI's: CUDA 12 up to 1.26, CUDA 13 from 1.27, both with cuDNN 9)"
                )
            sessions.append(session)
        return sessions[0], sessions[1]

    # --- graphs ------------------------------------------------------------------

    def encode(self, src_tokens: np.ndarray, src_mask: np.ndarray, narrow: bool = False) -> tuple[Any, Any]:
        """Cross-attention keys/values (L, B, H, S, d_k): numpy, or OrtValues on the device with IOBinding.
        ``narrow``: on the narrow sessions (RuntimeOptions.narrow_threads)."""
        encoder = _session_for(len(src_tokens), narrow, self.encoder, self.small_encoder, self.narrow_encoder)
        if not self.io_binding:
            _, cross_k, cross_v = encoder.run(None, {"src_tokens": src_tokens, "src_mask": src_mask})
            return cross_k, cross_v
        binding = encoder.io_binding()
        binding.bind_cpu_input("src_tokens", src_tokens)
        binding.bind_cpu_input("src_mask", src_mask)
        for name in ("memory", "cross_k", "cross_v"):
            binding.bind_output(name, self.device)
        encoder.run_with_iobinding(binding)
        _, cross_k, cross_v = binding.get_outputs()
        return cross_k, cross_v

    def step(self, batch: DecodeBatch) -> tuple[np.ndarray, ...]:
        """One decoder step over the batch: the cache is written in place; returns STEP_OUTPUTS and
        CANDIDATE_OUTPUTS (runtime.search). The binding is kept while the batch's feeds keep their shapes and
        memory (a greedy batch between joins and departures), so a step costs one ``run_with_iobinding`` call.
        A ``narrow`` batch steps on the narrow sessions (RuntimeOptions.narrow_threads)."""
        decoder = _session_for(batch.rows, batch.narrow, self.decoder, self.small_decoder, self.narrow_decoder)
        version = batch.version
        # The batch keeps its bindings, by decoder session (so batches decoding at once on these sessions,
        # translate-file's workers, keep theirs), and they go with it.
        kept = batch.step_state.setdefault(id(decoder), {})
        bound = kept.get(version)
        if bound is None:  # keep the bindings that differ only in which cache buffer set is live
            kept = batch.step_state[id(decoder)] = {v: b for v, b in kept.items() if v[:-1] == version[:-1]}
            bound = kept[version] = bind_step(decoder, batch.step_feeds(), version, self.device)
        bound.run(decoder)
        return bound.outputs

    # --- alignment -----------------------------------------------------------------

    def align(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[np.ndarray]:
        """Where each output token looked in its source: for each (source ids, output ids) pair, the
        cross-attention probabilities (len(output), len(source)) the export chose (the mean of its
        manifest's readings, export/aligner.py), eos's column dropped. Runs the aligner graph, on the CPU, in groups of
        ALIGN_GROUP pairs by length; raises ModelFolderError for a folder exported without it."""
        _, readings = self._aligner_session()
        return [
            np.mean([every[layer, offset : offset + len(output), : len(source)] for layer, offset in readings], axis=0)
            for every, (source, output) in zip(self.alignments(pairs), pairs, strict=True)
        ]

    def alignments(
        self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], session: ort.InferenceSession | None = None
    ) -> list[np.ndarray]:
        """For each (source ids, output ids) pair, the aligner's layers' cross-attention probabilities
        (L', len(output) + 1, len(source) + 1): ``align`` before choosing layers and rows. ``session``: another
        aligner graph than the folder's (benchmarks/alignment.py compares every layer)."""
        session = session or self._aligner_session()[0]
        c, results = self.config, [np.zeros((0, 0, 0), np.float32)] * len(pairs)
        order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
        for start in range(0, len(order), ALIGN_GROUP):
            group = order[start : start + ALIGN_GROUP]
            src_tokens, src_mask = pad_sources([pairs[i][0] for i in group], c.pad_id, c.eos_id)
            outputs = [list(pairs[i][1]) for i in group]
            tgt = np.full((len(group), max(map(len, outputs)) + 1), c.pad_id, np.int64)
            for row, output in enumerate(outputs):
                tgt[row, : len(output) + 1] = [c.decoder_start_id, *output]
            cross_k, cross_v = self.encode(src_tokens, src_mask)
            feeds = {
                "tgt_tokens": tgt,
                "src_mask": src_mask.astype(np.int32),
                "cross_k": _host_float32(cross_k),
                "cross_v": _host_float32(cross_v),
            }
            alignment = session.run(None, feeds)[0]  # (L, B, T, S)
            for row, i in enumerate(group):
                source, output = pairs[i]
                results[i] = alignment[:, row, : len(output) + 1, : len(source) + 1]
        return results

    def _aligner_session(self) -> tuple[ort.InferenceSession, list[tuple[int, int]]]:
        with self._aligner_lock:
            if self._aligner is None:
                spec = self.manifest.get("aligner")
                if spec is None:
                    raise ModelFolderError(
                        f"{self.folder} was exported without an aligner (markup needs it); export it again: "
                        f"python -m export --out {self.folder} --force"
                    )
                options = ort.SessionOptions()
                options.intra_op_num_threads = 1  # beside the decoding lanes, which own the cores
                options.enable_cpu_mem_arena = False
                path = str(self.folder / spec["file"])
                session = ort.InferenceSession(path, options, [PROVIDERS["cpu"]], disabled_optimizers=NO_FUSIONS)
                self._aligner = (session, [(int(layer), int(offset)) for layer, offset in spec["readings"]])
            return self._aligner

    # --- decoding ----------------------------------------------------------------

    def new_batch(self, pool: CachePool | None = None) -> DecodeBatch:
        """An empty running batch over this model's decoder step; ``pool``: where its host cache takes its
        buffers from and gives them back to (offline decoding's ``self.cache_pool``)."""
        c = self.config
        place = self._on_device if self.io_binding else None
        cache_type = (
            partial(KVCache, pool=pool) if self._cache_ops is None else partial(DeviceKVCache, ops=self._cache_ops)
        )
        layout = (c.n_decoder_layers, c.n_heads, self.d_cache, c.decoder_start_id, self.cache_dtype)
        return DecodeBatch(self.step, *layout, place, cache_type)

    def _on_device(self, array: np.ndarray) -> ort.OrtValue:
        """A host array copied to the session's device, to be bound to the decoder step without further copies."""
        return ort.OrtValue.ortvalue_from_numpy(array, self.device, 0)

    def translate_ids(
        self,
        sources: Sequence[Sequence[int]],
        beam: int = 1,
        max_output_tokens: int = 256,
        max_repeats: int | None = None,
    ) -> list[list[int]]:
        """Decode sources together to completion: token ids without start and eos."""
        hypotheses = self.hypotheses(sources, beam, max_output_tokens, max_repeats)
        return [hypothesis.tokens for hypothesis in hypotheses]

    def hypotheses(
        self,
        sources: Sequence[Sequence[int]],
        beam: int = 1,
        max_output_tokens: int = 256,
        max_repeats: int | None = None,
    ) -> list[Hypothesis]:
        """Decode sources together to completion (``max_repeats``: the runaway-output guard, see
        runtime.search). They are encoded in groups of ENCODER_GROUP by length (padding is encoder work) and
        all decode in one batch."""
        c, batch = self.config, self.new_batch(self.cache_pool)
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        for start in range(0, len(order), ENCODER_GROUP):
            group = order[start : start + ENCODER_GROUP]
            group_sources = [sources[i] for i in group]
            src_tokens, src_mask = pad_sources(group_sources, c.pad_id, c.eos_id)
            searches = source_searches(
                group_sources, beam, c.eos_id, max_output_tokens, self.length_penalty, max_repeats
            )
            batch.add(group, searches, *self.encode(src_tokens, src_mask), src_mask)
        results = batch.drain()
        return [results[i] for i in range(len(sources))]

    def translate(
        self,
        texts: Sequence[str],
        beam: int = 1,
        batch_size: int = 64,
        max_output_tokens: int = 256,
        max_repeats: int | None = None,
    ) -> list[str]:
        translate_ids = lambda ids: self.translate_ids(ids, beam, max_output_tokens, max_repeats)  # noqa: E731
        return translate_in_batches(self.tokenizer, texts, translate_ids, batch_size)
