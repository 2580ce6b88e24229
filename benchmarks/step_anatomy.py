"""Where a decoder step's time goes (a step anatomy): for each engine and batch size, the full step's time, the
time inside ONNX Runtime's runs alone, the host's share (full - run), the host's time with every run replayed
instead of run (greedy sizes: its first outputs again, or what its binding holds), the copies between host and
device a step makes (counted by a spy on ONNX Runtime's Python API), the nodes of the graph ONNX Runtime actually
runs, and on CUDA the kernels each step launches (the torch profiler's CUDA activity, which sees every library's
kernels).

``python benchmarks/step_anatomy.py --model DIR [--provider cuda --variant fp16] [--engines ...] [--sizes ...]``

Engines (``ENGINES``): ``host`` (the CPU's serving path: sources packed row by row, numpy feeds, greedy rows on
their own step graph), ``compact`` (packed, bound with IOBinding as on a device), ``buckets`` (fixed buffers per
bucket), ``captured`` (each bucket's step a CUDA graph), ``captured-k8`` (8 greedy steps per run),
``captured-fused`` (ONNX Runtime's fusions on, which the engine turns off on the CPU: runtime/providers.py),
``captured-unfused`` (off on CUDA too). Sizes: ``N`` sources greedy, ``NxB`` N sources at beam B.
Every row decodes for every timed step (no eos), in a fresh batch per repeat whose bucket holds a test sentence
(``--max-length``). On the CPU provider it runs the same path (buckets on the host's device path), which is how
the suite keeps it working where no GPU is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnxruntime as ort

from runtime import backend as backend_module
from runtime import providers
from runtime.backend import OrtBackend
from runtime.captured import HOST_FEEDS
from runtime.options import EngineSettings, RuntimeOptions
from runtime.search import Decoding

ENGINES = {
    "host": {"layout": "compact", "io_binding": False},
    "compact": {"layout": "compact"},
    "buckets": {"layout": "buckets"},
    "captured": {"layout": "buckets", "graphs": True},
    "captured-k8": {"layout": "buckets", "graphs": True, "steps_per_run": 8},
    "captured-fused": {"layout": "buckets", "graphs": True, "fusions": True},
    "captured-unfused": {"layout": "buckets", "graphs": True, "fusions": False},
}
DEFAULT_SIZES = "1,32,128,32x4"
DRAIN_TOP = 12  # functions listed by a drain profile
TOP_KERNELS = 6  # the kernels that take most of a run, by name, in the JSON and after each beam row


class Spy:
    """Counts, while ``on``, what a step asks of ONNX Runtime: runs and the seconds inside them, copies from the
    host (a value updated in place, a host value bound to a device session's input, a host input bound by copy)
    and reads to the host (a value read as numpy, a device session's output bound in host memory). On the CPU
    provider the same calls are counted: they are the copies the same path makes on a device."""

    def __init__(self) -> None:
        self.on = False
        self.timing = False
        self.counts: Counter[str] = Counter()
        self.run_seconds = 0.0
        self.host_feeds: set[int] = set()  # values kernels read in host memory: updating one copies nothing
        self.stubbed = False  # runs replayed: a binding's run skipped, a plain run's first outputs returned again
        self._replays: dict[tuple, Any] = {}
        self._undo: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        spy = self

        def patch(owner: Any, name: str, wrapper: Any) -> None:
            original = getattr(owner, name)
            self._undo.append((owner, name, owner.__dict__.get(name)))
            setattr(owner, name, wrapper(original))

        def run_with_iobinding(original):
            def run(session, binding, run_options=None):
                if spy.on:
                    spy.counts["runs"] += 1
                    if getattr(binding, "_device_session", False):
                        outputs = binding.get_outputs()
                        spy.counts["down"] += sum(value.device_name() == "cpu" for value in outputs)
                # stubbed: its outputs stay bound as the first run left them
                return spy.run(lambda: original(session, binding, run_options), lambda: (id(session), id(binding)))

            return run

        def plain_run(original):  # the host path's runs: numpy feeds, numpy outputs
            def run(session, *args, **kwargs):
                if spy.on:
                    spy.counts["runs"] += 1

                def key() -> tuple:  # stubbed: the first outputs for these feeds' shapes, again
                    feeds = args[1] if len(args) > 1 else kwargs["input_feed"]
                    return (id(session), *(getattr(value, "shape", None) for value in feeds.values()))

                return spy.run(lambda: original(session, *args, **kwargs), key)

            return run

        def io_binding(original):
            def make(session):
                binding = original(session)
                binding._device_session = session.get_providers()[0] != providers.PROVIDERS["cpu"]
                return binding

            return make

        def counting(kind, when=None):
            def wrap(original):
                def call(*args, **kwargs):
                    if spy.on and (when is None or when(*args, **kwargs)):
                        spy.counts[kind] += 1
                    return original(*args, **kwargs)

                return call

            return wrap

        def host_value_on_device(binding, name, value):
            base = name.split("@")[0].removesuffix(".device")
            return binding._device_session and value.device_name() == "cpu" and base not in HOST_FEEDS

        patch(ort.InferenceSession, "run_with_iobinding", run_with_iobinding)
        patch(ort.InferenceSession, "run", plain_run)
        patch(ort.InferenceSession, "io_binding", io_binding)
        patch(ort.OrtValue, "update_inplace", counting("up", lambda value, *_: id(value) not in spy.host_feeds))
        patch(ort.OrtValue, "numpy", counting("down"))
        patch(ort.IOBinding, "bind_cpu_input", counting("up", lambda binding, *_: binding._device_session))
        patch(ort.IOBinding, "bind_ortvalue_input", counting("up", host_value_on_device))

    def run(self, call: Callable[[], Any], key: Callable[[], tuple]) -> Any:
        """One of ONNX Runtime's runs, ``call()``: while stubbed, the outputs of the first run with its ``key()``
        again, not run; else run, and timed while timing."""
        if self.stubbed:
            replay = key()
            if replay not in self._replays:
                self._replays[replay] = call()
            return self._replays[replay]
        if not self.timing:
            return call()
        start = time.perf_counter()
        try:
            return call()
        finally:
            self.run_seconds += time.perf_counter() - start

    def uninstall(self) -> None:
        for owner, name, own in reversed(self._undo):
            if own is None:
                delattr(owner, name)  # inherited: the base class's is found again
            else:
                setattr(owner, name, own)
        self._undo.clear()

    @contextmanager
    def counting(self):
        self.counts.clear()
        self.on = True
        try:
            yield self.counts
        finally:
            self.on = False


class SessionLog:
    """The sessions an engine opens (``runtime.backend.open_session``), with what they were opened from, so the
    graph ONNX Runtime runs for a step can be written out and counted."""

    def __init__(self) -> None:
        self.opened: dict[int, tuple[Any, str]] = {}
        self._original = backend_module.open_session

    def __enter__(self) -> SessionLog:
        def opening(path, provider, *args, **kwargs):
            session = self._original(path, provider, *args, **kwargs)
            self.opened[id(session)] = (path, provider)
            return session

        backend_module.open_session = opening
        return self

    def __exit__(self, *_: object) -> None:
        backend_module.open_session = self._original


def optimized_nodes(model: Any, provider: str) -> Counter[str]:
    """Op types of the graph ONNX Runtime runs for ``model`` (a path or a serialized model) on ``provider``, as
    it writes it out after its optimizations (``optimized_model_filepath``)."""
    import onnx

    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        disabled = providers.disabled_optimizers(provider)  # the engine's rule, as the anatomy's engine set it
        ort.InferenceSession(model, options, [providers.PROVIDERS[provider]], disabled_optimizers=disabled)
        graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    return Counter(node.op_type for node in graph.node)


def step_session(engine: OrtBackend, k_steps: bool) -> ort.InferenceSession:
    """The session a greedy step runs (``k_steps``: the k-step one)."""
    if engine.device_steps is not None:
        return (engine.device_k_steps if k_steps and engine.device_k_steps else engine.device_steps).session
    if k_steps and engine.k_steps is not None:
        return engine.k_steps.session
    return engine.decoder


class Kernels:
    """The CUDA kernels and copies launched while a block runs, by the torch profiler (CUPTI), where torch and
    a GPU are; ``None`` elsewhere."""

    def __init__(self, wanted: bool) -> None:
        self.available = False
        if not wanted:
            return
        try:
            import torch
            from torch.autograd import DeviceType
            from torch.profiler import ProfilerActivity, profile
        except ImportError:
            return
        self.available = torch.cuda.is_available()
        self._profile, self._activity, self._cuda = profile, ProfilerActivity, DeviceType.CUDA

    def measure(self, block: Callable[[], object], repeat: int) -> dict[str, float] | None:
        if not self.available:
            return None
        with self._profile(activities=[self._activity.CUDA]) as profiler:
            block()
        kernels, copies, busy, by_name = 0, 0, 0.0, Counter()
        for event in profiler.events():
            if event.device_type != self._cuda:
                continue
            name = event.name.lower()
            if "memcpy" in name or "memset" in name:
                copies += "memcpy" in name
                continue
            kernels += 1
            busy += event.time_range.elapsed_us()
            by_name[event.name[:80]] += event.time_range.elapsed_us() / repeat
        return {
            "kernels": kernels / repeat,
            "us_per_kernel": busy / kernels if kernels else 0.0,
            "gpu_ms": busy / repeat / 1e3,
            "memcpy": copies / repeat,
            "top": [(name, round(us, 1)) for name, us in by_name.most_common(TOP_KERNELS)],
        }


def parse_size(text: str) -> tuple[int, int]:
    rows, _, beam = text.partition("x")
    return int(rows), int(beam or 1)


def engine_options(name: str, provider: str, variant: str) -> tuple[RuntimeOptions, bool]:
    spec = ENGINES[name]
    settings = EngineSettings(variant=variant, provider=provider, batch_layout=spec["layout"])
    options = RuntimeOptions(
        settings=settings,
        io_binding=spec.get("io_binding", True),
        cuda_graphs=spec.get("graphs", False),
        steps_per_run=spec.get("steps_per_run", 1),
    )
    return options, spec.get("fusions")


def anatomy(engine: OrtBackend, sources: int, beam: int, args, kernels: Kernels) -> dict[str, Any]:
    """One engine at one size: medians over ``--repeats`` fresh batches of the mean per run."""
    spy = args.spy
    k = engine.steps_per_run if beam == 1 else 1
    runs = max(1, (args.max_length - 2) // k - args.warmup)
    prompts = [[10 + (7 * i + j) % 500 for j in range(12)] for i in range(sources)]

    def fresh():
        batch = engine.new_batch(Decoding(eos_id=-1))  # no eos: every row decodes for every step
        batch.add(list(range(sources)), engine.encode_sources(prompts), [beam] * sources, [args.max_length] * sources)
        for _ in range(args.warmup):
            batch.step()
        return batch

    full, inside = [], []
    for _ in range(args.repeats):
        batch = fresh()
        spy.run_seconds, spy.timing = 0.0, True
        start = time.perf_counter()
        for _ in range(runs):
            batch.step()
        full.append((time.perf_counter() - start) / runs)
        spy.timing = False
        inside.append(spy.run_seconds / runs)
    rows = batch.rows
    batch = fresh()  # its warm-up bound its buffer set
    for steps in (engine.device_steps, engine.device_k_steps):
        for bound in getattr(steps, "_bound", {}).values():
            spy.host_feeds.update(id(value) for _, value in bound.host)
    with spy.counting() as counts:
        for _ in range(runs):
            batch.step()
        counted = {kind: counts[kind] / runs for kind in ("runs", "up", "down")}
    batch = fresh()
    profiled = kernels.measure(lambda: [batch.step() for _ in range(runs)], runs)
    stubbed = []  # the host alone: every run replayed (its first outputs for those shapes), not run
    spy.stubbed = True
    try:
        for _ in range(args.repeats):
            batch = fresh()
            start = time.perf_counter()
            for _ in range(runs):
                batch.step()
            stubbed.append((time.perf_counter() - start) / runs)
    finally:
        spy.stubbed = False
        spy._replays.clear()
    step_ms, run_ms = statistics.median(full) * 1e3, statistics.median(inside) * 1e3
    return {
        "sources": sources,
        "beam": beam,
        "rows": rows,
        "steps_per_run": k,
        "step_ms": step_ms,
        "run_ms": run_ms,
        "host_ms": step_ms - run_ms,
        "stubbed_ms": statistics.median(stubbed) * 1e3,
        **counted,
        "kernels": profiled,
    }


def drain(engine: OrtBackend, batch: int, beam: int, args) -> dict[str, Any]:
    """Test sentences translated in groups of ``batch`` (similar lengths together), timed, then again under
    cProfile: the functions that hold the host's time, by their own time."""
    import cProfile
    import pstats

    from common.corpus import corpus_path, read_lines
    from runtime import offline

    texts = read_lines(corpus_path(args.drain, "test_2016_flickr", "en"))[: args.drain_sentences]
    sources = sorted(engine.tokenizer.encode_source(texts), key=len)
    groups = [sources[i : i + batch] for i in range(0, len(sources), batch)]

    def translate() -> int:
        return sum(len(out) + 1 for group in groups for out in offline.translate_ids(engine, group, beam))

    translate()  # warm: each bucket's buffers and captured graphs
    start = time.perf_counter()
    tokens = translate()
    seconds = time.perf_counter() - start
    profiler = cProfile.Profile()
    profiler.enable()
    translate()
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = sum(row[2] for row in stats.stats.values())
    top = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:DRAIN_TOP]
    where = [
        (f"{Path(f).name}:{line}:{function}", round(own / total, 3)) for (f, line, function), (_, _, own, *_) in top
    ]
    size = f"{batch}" + (f" x beam {beam}" if beam > 1 else "")
    print(f"drain, batch {size}: {tokens / seconds:,.0f} tokens/s; own time (profiled): {where}", flush=True)
    return {"drain": size, "tokens_per_s": tokens / seconds, "own_time": where}


def row_text(name: str, nodes: Counter[str], per: int, result: dict[str, Any]) -> str:
    profiled = result["kernels"] or {}
    size = f"{result['sources']}" + (f" x beam {result['beam']}" if result["beam"] > 1 else "")
    # Replayed candidates make a degenerate beam search (every step the same): only greedy steps' host time counts.
    stubbed = f"{result['stubbed_ms'] * 1e3:.0f}" if result["beam"] == 1 else "-"
    kernels = (
        f"{profiled['kernels']:.0f} | {profiled['us_per_kernel']:.1f} | {profiled['gpu_ms']:.3f} | "
        f"{profiled['memcpy']:.1f}"
        if profiled
        else "- | - | - | -"
    )
    return (
        f"| {name} | {size} ({result['rows']} rows) | {result['steps_per_run']} | {result['step_ms']:.3f} | "
        f"{result['run_ms']:.3f} | {result['host_ms']:.3f} | {stubbed} | {result['runs']:.1f} | {result['up']:.1f} | "
        f"{result['down']:.1f} | {sum(nodes.values()) / per:.0f} ({nodes['MemcpyToHost'] + nodes['MemcpyFromHost']}) | "
        f"{kernels} |"
    )


HEADER = (
    "| engine | size | steps per run | full ms per run | run ms | host ms | host µs, runs stubbed | runs | "
    "host → device | device → host | nodes per step (Memcpy) | kernels per run | µs per kernel | GPU busy ms per run | "
    "memcpy per run |\n" + "|---" * 15 + "|"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--variant", default="fp16")
    parser.add_argument(
        "--engines", help=f"of {', '.join(ENGINES)} (default: all; on CUDA all but host, the CPU's own path)"
    )
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="N sources greedy or NxB at beam B, comma-separated")
    parser.add_argument("--max-length", type=int, default=60, help="each row's longest output (its bucket: 64)")
    parser.add_argument("--warmup", type=int, default=3, help="runs before the timed ones, in each batch")
    parser.add_argument("--repeats", type=int, default=3, help="fresh batches timed (the median is reported)")
    parser.add_argument("--kernels", action="store_true", help="count each step's CUDA kernels (needs torch)")
    parser.add_argument("--top", action="store_true", help="print each size's costliest kernels under its row")
    parser.add_argument(
        "--drain",
        type=Path,
        help="also translate test_2016_flickr from this corpus folder through each engine at --drain-sizes, and "
        "profile where the host's time goes (cProfile, top functions by own time)",
    )
    parser.add_argument("--drain-sizes", default="1,128,32x4")
    parser.add_argument("--drain-sentences", type=int, default=256)
    parser.add_argument("--json", type=Path, help="also write every result here")
    args = parser.parse_args(argv)
    args.spy = Spy()
    kernels = Kernels(args.kernels)
    print(f"onnxruntime {ort.__version__} on {args.provider}, {args.variant}; kernels: {kernels.available}")
    print(HEADER, flush=True)
    results = []
    args.spy.install()
    try:
        default = [name for name in ENGINES if args.provider == "cpu" or name != "host"]
        for name in args.engines.split(",") if args.engines else default:
            options, fusions = engine_options(name, args.provider, args.variant)
            kept, providers.NO_FUSIONS = providers.NO_FUSIONS, [] if fusions else providers.NO_FUSIONS
            off = {"cpu", "cuda"} if fusions is False else providers.FUSIONS_OFF  # captured-unfused: as before
            kept_off, providers.FUSIONS_OFF = providers.FUSIONS_OFF, off
            try:
                with SessionLog() as log:
                    engine = OrtBackend(args.model, options)
                counted: dict[bool, Counter[str]] = {}
                for size in args.sizes.split(","):
                    sources, beam = parse_size(size)
                    # greedy rows' own graph: k steps, the host's greedy step or a device's
                    own = engine.steps_per_run > 1 or engine.k_steps is not None or engine.device_k_steps is not None
                    k_steps = beam == 1 and own
                    if k_steps not in counted:
                        model, provider = log.opened.get(id(step_session(engine, k_steps)), (None, None))
                        counted[k_steps] = optimized_nodes(model, provider) if model else Counter()
                    result = anatomy(engine, sources, beam, args, kernels)
                    result |= {"engine": name, "nodes": dict(counted[k_steps])}
                    results.append(result)
                    print(row_text(name, counted[k_steps], result["steps_per_run"], result), flush=True)
                    if result["kernels"] and args.top:
                        print(f"  <!-- top kernels, µs per run: {result['kernels']['top']} -->", flush=True)
                if args.drain:
                    for size in args.drain_sizes.split(","):
                        results.append({"engine": name, **drain(engine, *parse_size(size), args)})
            finally:
                providers.NO_FUSIONS, providers.FUSIONS_OFF = kept, kept_off
    finally:
        args.spy.uninstall()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
