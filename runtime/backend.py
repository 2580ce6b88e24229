"""An exported model folder on ONNX Runtime sessions (``OrtBackend``): it encodes sources, makes running
batches over its decoder step and runs each step it is handed, over bindings it keeps itself.

On CUDA the cross-attention keys/values stay on the device between steps (IOBinding): they are copied there
once each time sources join the batch, not at every step; on CPU plain numpy arrays are passed without copies.
The same IOBinding path runs on the CPU provider too (``io_binding=True``), which is how it is tested without a
GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from runtime.aligner import Aligner
from runtime.batch import DecodeBatch, EncodedSources, RowShape, StepInputs, StepOutputs, pad_sources
from runtime.binding import StepBindings, bind_k_steps
from runtime.bucket_buffers import DeviceBuffers
from runtime.caches import CachePool, KVCache
from runtime.captured import DeviceSteps
from runtime.compact_rows import CompactRows
from runtime.contract import CANDIDATE_OUTPUTS, GREEDY_PACKED, K_STEP_OUTPUTS, STEP_INPUTS, STEP_OUTPUTS
from runtime.cpu import describe_cpu, int8_products_saturate
from runtime.device_cache import CacheOps, DeviceKVCache
from runtime.manifest import ModelFolderError, read_manifest
from runtime.model_config import ModelConfig
from runtime.options import RuntimeOptions
from runtime.plan import plan_engine
from runtime.providers import PROVIDERS, ProviderUnavailable, open_session, resolve_provider
from runtime.search import LENGTH_PENALTY, Decoding
from runtime.slotted_rows import SlottedRows
from runtime.stops import StopRules
from runtime.tokenizer import Tokenizer, TokenizerError

log = logging.getLogger(__name__)

# Below this many rows a step is too small to share between threads: waking a second intra-op thread
# costs more than it saves (one-row step 1.10 ms on one thread vs 1.53 ms on two; 8 rows 2.34 vs 2.90;
# 32 rows 8.29 vs 7.45: 2-core x86-64, see benchmarks/threads.md).
SMALL_BATCH_ROWS = 16


# variant "auto": the first of these that a folder has, by provider (int8 decodes 1.5-1.9x faster than fp32 on
# the CPU at the same BLEU, 2-core AMD EPYC with VNNI: benchmarks/defaults_quality.md and defaults_throughput.md)
AUTO_VARIANTS = {"cpu": ("int8", "fp32"), "cuda": ("fp16", "fp32")}


def chosen_variant(folder: Path, asked: str, variants: Mapping[str, Any], provider: str) -> str:
    """The variant to load: ``asked``, which the folder must have, or for "auto" the first of AUTO_VARIANTS
    that it has."""
    if asked == "auto":
        return next((v for v in AUTO_VARIANTS[provider] if v in variants), next(iter(variants)))
    if asked not in variants:
        raise ModelFolderError(f"{folder} has no {asked!r} variant (has {sorted(variants)})")
    return asked


class OrtBackend:
    """An exported model folder loaded into ONNX Runtime sessions: an encoder and a decoder step on the options'
    threads, and on the CPU, with ``small_batch_threads``, another pair for runs under SMALL_BATCH_ROWS rows."""

    def __init__(self, folder: str | Path, options: RuntimeOptions | None = None) -> None:
        options = options or RuntimeOptions()
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder, verify=options.verify_files)
        self.config = ModelConfig.from_dict(self.manifest["model_config"])
        self.length_penalty = float(self.manifest.get("decoding", {}).get("length_penalty", LENGTH_PENALTY))
        self.tokenizer = self._tokenizer()
        self.encoder, self.decoder = self._open(options)
        self.small_encoder, self.small_decoder = self._small_sessions(options)
        self.plan = plan_engine(options, self.provider, self.variant, self.decoder)
        ops = CacheOps(PROVIDERS[self.provider], self.device, self.cache_dtype) if self.device_cache else None
        self._cache_ops = ops
        self.cache_pool: CachePool | None = CachePool() if options.reuse_cache_buffers else None
        self.step_bindings = StepBindings(self.decoder, self.device)
        small_steps = self.small_decoder is not self.decoder
        self.small_step_bindings = StepBindings(self.small_decoder, self.device) if small_steps else self.step_bindings
        self.aligner = Aligner(self.folder, self.manifest, self.config, self.encode, self.variant)
        # Buckets on a device (io_binding): their steps (DeviceSteps) own the buffers there that they run over
        self.device_steps: DeviceSteps | None = None
        self.device_k_steps: DeviceSteps | None = None  # greedy buckets' runs: k steps, or the device greedy step
        if self.plan.device_buckets:
            self._device_buckets(options)
        self.k_steps, self.small_k_steps = self._k_steps(options) if self.plan.host_greedy_runs else (None, None)

    # --- the plan's choices, by the names the engine's callers read ---------------

    provider = property(lambda self: self._provider)
    variant = property(lambda self: self._variant)
    device = property(lambda self: "cuda" if self._provider == "cuda" else "cpu")
    cache_dtype = property(lambda self: self.plan.cache_dtype)
    d_cache = property(lambda self: self.plan.d_cache)
    device_cache = property(lambda self: self.plan.device_cache)
    io_binding = property(lambda self: self.plan.io_binding)
    batch_layout = property(lambda self: self.plan.batch_layout)
    steps_per_run = property(lambda self: self.plan.steps_per_run)

    # --- loading -----------------------------------------------------------------

    def _tokenizer(self) -> Tokenizer:
        try:  # a file name (older manifests) or {"kind", "files"}
            return Tokenizer.load(self.folder, self.manifest["tokenizer"])
        except TokenizerError as e:
            raise ModelFolderError(str(e)) from e

    def _open(self, options: RuntimeOptions) -> tuple[ort.InferenceSession, ort.InferenceSession]:
        """The encoder and decoder sessions on the provider asked for ("auto": CUDA where it loads, else the
        CPU), in the variant asked for (or the provider's best); a decoder the engine cannot step is refused."""
        variants = self.manifest["variants"]
        self._provider = resolve_provider(options.settings.provider)
        self._variant = chosen_variant(self.folder, options.settings.variant, variants, self._provider)
        try:
            sessions = self._sessions(options, options.settings.intra_op_threads)
        except ProviderUnavailable as error:
            if options.settings.provider != "auto":
                raise
            log.warning("provider auto: %s; using the CPU", error)
            self._provider = "cpu"
            self._variant = chosen_variant(self.folder, options.settings.variant, variants, self._provider)
            sessions = self._sessions(options, options.settings.intra_op_threads)
        if self._variant == "int8" and not variants["int8"].get("quantization", {}).get("reduce_range"):
            self._warn_if_int8_saturates()  # on the provider the sessions took
        missing = sorted(STEP_INPUTS - {i.name for i in sessions[1].get_inputs()})
        if missing:
            raise ModelFolderError(
                f"{self.folder} was exported by an older version (its decoder step lacks {', '.join(missing)}); "
                f"export it again: python -m export --out {self.folder} --force"
            )
        return sessions

    def _small_sessions(self, options: RuntimeOptions) -> tuple[ort.InferenceSession, ort.InferenceSession]:
        """On the CPU, with ``small_batch_threads``, another pair for runs under SMALL_BATCH_ROWS rows; else the
        same pair."""
        small = options.small_batch_threads
        if self._provider == "cpu" and small is not None and small != options.settings.intra_op_threads:
            return self._sessions(options, small)
        return self.encoder, self.decoder

    @staticmethod
    def _onnx(what: str) -> Any:
        """The onnx package, for ``what``'s graphs (a dependency of the package, so absent only where someone
        removed it): imported only here, and its absence is said when a model loads, not mid-request."""
        try:
            import onnx
        except ImportError as e:
            raise ValueError(f"{what} makes its graphs with the onnx package: {e}; pip install onnx") from e
        return onnx

    def _graph(self, what: str) -> Any:
        """The decoder's graph as an onnx.ModelProto, for the graphs made from it."""
        return self._onnx(what).load(str(self.folder / self.manifest["variants"][self.variant]["decoder"]))

    def _k_steps(self, options: RuntimeOptions) -> tuple[StepBindings, StepBindings]:
        """The session that greedy batches run, ``steps_per_run`` steps per run (runtime/step_graphs.py), with its
        bindings on host buffers, in the compact layout over the greedy step (``EnginePlan.greedy_graph``); and
        the one for runs under SMALL_BATCH_ROWS rows (the same one without ``small_batch_threads``)."""
        graph = self._graph("greedy batches' graph")
        from runtime.step_graphs import k_step_graph

        k = options.steps_per_run
        model = k_step_graph(graph, k, rows_are_sources=self.plan.greedy_graph).SerializeToString()

        def bindings(threads: int) -> StepBindings:
            session = open_session(model, self.provider, threads, options.spinning, options.memory_arena)
            return StepBindings(session, self.device, partial(bind_k_steps, k=k))

        steps = bindings(options.settings.intra_op_threads)
        small = self.small_decoder is not self.decoder and options.small_batch_threads
        return steps, bindings(small) if small else steps

    def _greedy_runs(self, inputs: StepInputs) -> tuple[np.ndarray, np.ndarray]:
        """A greedy batch's run (``k_steps``), on the small-batch session under SMALL_BATCH_ROWS rows."""
        return (self.small_k_steps if inputs.rows < SMALL_BATCH_ROWS else self.k_steps).run(inputs)

    def _device_buckets(self, options: RuntimeOptions) -> None:
        """Buckets whose buffers live on the device, their steps (and runs of ``steps_per_run`` greedy steps)
        run over them by DeviceSteps, each bucket's captured as a CUDA graph with ``cuda_graphs``."""
        self._onnx("batch_layout buckets on a device")  # its beam reorder's graph is made on first use
        ops = self._cache_ops or CacheOps(PROVIDERS[self.provider], self.device, self.cache_dtype)
        buffers = DeviceBuffers(ops)  # one set per bucket, which single steps and k-step runs share
        graphs = self.plan.cuda_graphs

        def opened(model: Any) -> ort.InferenceSession:
            extra = {"enable_cuda_graph": "1"} if graphs and self.provider == "cuda" else None
            threads, arena = options.settings.intra_op_threads, options.memory_arena
            return open_session(model.SerializeToString(), self.provider, threads, options.spinning, arena, extra)

        from runtime.step_graphs import device_greedy_graph, k_step_graph, split_host_feeds

        session = opened(split_host_feeds(self._graph("cuda_graphs"))) if graphs else self.decoder
        self.device_steps = DeviceSteps(session, buffers, STEP_OUTPUTS + CANDIDATE_OUTPUTS, graphs)
        if self.steps_per_run > 1:  # greedy buckets run k steps at a time
            model = k_step_graph(self._graph("steps_per_run > 1"), self.steps_per_run, host_totals=True)
            self.device_k_steps = DeviceSteps(opened(model), buffers, list(K_STEP_OUTPUTS), graphs)
        else:  # greedy buckets run the device greedy step
            model = split_host_feeds(device_greedy_graph(self._graph("greedy buckets on a device")))
            self.device_k_steps = DeviceSteps(opened(model), buffers, [GREEDY_PACKED], graphs)

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
        encoder, decoder = (
            open_session(str(self.folder / files[part]), self.provider, threads, options.spinning, options.memory_arena)
            for part in ("encoder", "decoder")
        )
        return encoder, decoder

    # --- graphs ------------------------------------------------------------------

    def encode(self, src_tokens: np.ndarray, src_mask: np.ndarray) -> tuple[Any, Any]:
        """Cross-attention keys/values (L, B, H, S, d_k): numpy, or OrtValues on the device with IOBinding."""
        encoder = self.small_encoder if len(src_tokens) < SMALL_BATCH_ROWS else self.encoder
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

    def encode_sources(self, sources: Sequence[Sequence[int]]) -> EncodedSources:
        """Sources (ids without eos) encoded together, for a batch's ``add``; ONNX Runtime's sessions take
        concurrent runs, so this may run on another thread while a batch steps."""
        start, c = time.perf_counter(), self.config
        src_tokens, src_mask = pad_sources(sources, c.pad_id, c.eos_id)
        cross_k, cross_v = self.encode(src_tokens, src_mask)
        return EncodedSources(cross_k, cross_v, src_mask, time.perf_counter() - start)

    def step(self, inputs: StepInputs) -> StepOutputs:
        """One decoder step over ``inputs``: the cache is written in place; returns STEP_OUTPUTS and
        CANDIDATE_OUTPUTS (runtime/contract.py). Runs under SMALL_BATCH_ROWS rows take the small-batch session."""
        steps = self.small_step_bindings if inputs.rows < SMALL_BATCH_ROWS else self.step_bindings
        return steps.run(inputs)

    # --- decoding ----------------------------------------------------------------

    def decoding(self, stop_rules: StopRules = ()) -> Decoding:
        """How this model's searches end: its eos, its length penalty, and ``stop_rules``."""
        return Decoding(self.config.eos_id, self.length_penalty, stop_rules)

    def new_batch(self, decoding: Decoding | None = None) -> DecodeBatch:
        """An empty running batch over this model's decoder step (``decoding``: how its searches are made; None:
        ``self.decoding()``), its rows in ``batch_layout``. A compact batch's host cache takes its buffers from
        ``cache_pool`` (RuntimeOptions.reuse_cache_buffers) and gives them back."""
        c = self.config
        shape = RowShape(c.n_decoder_layers, c.n_heads, self.d_cache, c.decoder_start_id, self.cache_dtype)
        step, k_steps = self.step, self._greedy_runs if self.k_steps else None
        if self.batch_layout == "buckets":
            if self.device_steps is None:
                rows = SlottedRows(shape)  # on host buffers, which the CPU provider steps on in place
            else:  # on the device buffers that its steps own and bind
                step, k_steps = self.device_steps, self.device_k_steps.greedy
                rows = SlottedRows(shape, self.device_steps.buffers)
        else:
            place = self._on_device if self.io_binding else None
            if self._cache_ops is None:
                cache_type = partial(KVCache, pool=self.cache_pool)
            else:
                cache_type = partial(DeviceKVCache, ops=self._cache_ops)
            rows = CompactRows(shape, place, cache_type)
        return DecodeBatch(step, decoding or self.decoding(), rows, k_steps, self.steps_per_run)

    def _on_device(self, array: np.ndarray) -> ort.OrtValue:
        """A host array copied to the session's device, to be bound to the decoder step without further copies."""
        return ort.OrtValue.ortvalue_from_numpy(array, self.device, 0)
