"""Where beam search's cache reordering should run: on the host, moving the rows whose parent changed in
place (what the engine does), or inside the step graph, gathering every row by its parent into a second
buffer set (ping-pong) so that the host never touches a cache row:
``python benchmarks/cache_reorder.py --model DIR [--variant fp32] [--repeats 7] [--steps 20]``.

One decoder step of the exported folder at 4 rows (one source, beam 4) and 128 rows (32 sources, beam 4),
its cache holding 16 and 1,000 tokens per row; each source's four rows continue from parents (0, 1, 2, 0),
beam search's usual step after ``in_place_order`` (one row in four moves; 31% on test_2016_flickr):

- ``host``: the step graph as exported, then ``KVCache._move`` of the changed rows (their live slots);
- ``graph``: the same graph with a ``parents`` input and a Gather of every past buffer by it before each
  layer's attention, its present bound to the other buffer set (the next step reads that one).

Times are per step (the run, plus the host's moves), medians over repeats of ``--steps`` steps, the two
variants alternating in each repeat, on 2 intra-op threads.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from runtime.backend import OrtBackend
from runtime.batch import DecodeBatch
from runtime.binding import bind_step
from runtime.caches import KVCache
from runtime.contract import layer_names
from runtime.cpu import describe_cpu
from runtime.options import EngineSettings, RuntimeOptions
from runtime.providers import NO_FUSIONS

CASES = [(4, 16), (4, 1000), (128, 16), (128, 1000)]  # (rows, cached tokens per row)
BEAM = 4
PARENTS = (0, 1, 2, 0)  # each source's rows after a usual beam step: row 3 continues row 0


def gathering_step(path: Path) -> bytes:
    """The step graph with a ``parents`` input (R,) and each layer's past key and value gathered by it."""
    model = onnx.load(str(path))
    graph = model.graph
    graph.input.append(helper.make_tensor_value_info("parents", TensorProto.INT64, ["rows"]))
    pasts = {i.name for i in graph.input if i.name.startswith("past_")}
    gathers = [helper.make_node("Gather", [p, "parents"], [f"{p}_by_parent"], axis=0) for p in sorted(pasts)]
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in pasts:
                node.input[index] = f"{name}_by_parent"
    nodes = gathers + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model.SerializeToString()


def session(model_bytes: bytes | str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = False
    return ort.InferenceSession(model_bytes, options, ["CPUExecutionProvider"], disabled_optimizers=NO_FUSIONS)


def filled_batch(model: OrtBackend, rows: int, cached: int) -> DecodeBatch:
    """A batch of rows / BEAM sources with BEAM rows each, every row's cache holding ``cached`` tokens."""
    c, sources = model.config, rows // BEAM
    rng = np.random.default_rng(0)
    ids = [rng.integers(4, c.vocab_size, 20).tolist() for _ in range(sources)]
    batch = model.new_batch()
    batch.add(list(range(sources)), model.encode_sources(ids), [BEAM] * sources, [cached + 2] * sources)
    layout = batch.layout  # compact rows: runtime/compact_rows.py
    searches = list(layout.searches.values())
    layout.cache.select(np.repeat(np.arange(sources), BEAM))  # each source's BEAM rows
    layout.cache.reserve(rows, cached + 1)
    for buffer in layout.cache.keys + layout.cache.values:
        buffer[:rows, :, :cached] = rng.standard_normal(buffer[:rows, :, :cached].shape, np.float32)
    layout.cache.lengths[:rows], layout.cache.longest = cached, cached
    for search in searches:
        search.rows, search.scores = BEAM, np.zeros(BEAM)
    layout.tokens = rng.integers(4, c.vocab_size, rows).astype(np.int64)
    layout._changed(layout.tokens)
    layout.total_length[()] = cached + 1
    return batch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--variant", default="fp32")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    model = OrtBackend(
        args.model, RuntimeOptions(settings=EngineSettings(variant=args.variant, provider="cpu", intra_op_threads=2))
    )
    decoder_path = args.model / model.manifest["variants"][args.variant]["decoder"]
    host_step, graph_step = session(str(decoder_path)), session(gathering_step(decoder_path))
    print(f"command: python benchmarks/cache_reorder.py {shlex.join(sys.argv[1:])}")
    print(f"machine: {describe_cpu()}; onnxruntime {ort.__version__}; {args.variant}")
    print(f"medians of {args.repeats} repeats of {args.steps} steps, alternating\n")
    print(
        "| rows | cached tokens | host: run + moves (ms) | of which moves | graph: gather in the step (ms) "
        "| graph / host |"
    )
    print("|---|---|---|---|---|---|")
    for rows, cached in CASES:
        batch = filled_batch(model, rows, cached)
        cache: KVCache = batch.layout.cache
        parents = (np.arange(rows) // BEAM * BEAM + np.tile(PARENTS, rows // BEAM)).astype(np.int64)
        changed = np.flatnonzero(parents != np.arange(rows))
        feeds = batch.step_inputs().feeds
        host = bind_step(host_step, feeds)
        # Ping-pong: the spare set takes the gathered rows and the step's new entries; the next step reads it.
        spare = [np.empty_like(buffer) for buffer in cache.keys + cache.values]
        sets = []
        for source, target in ((cache.keys + cache.values, spare), (spare, cache.keys + cache.values)):
            names = layer_names("past", len(cache.keys))
            order = [b for pair in zip(source[: len(cache.keys)], source[len(cache.keys) :], strict=True) for b in pair]
            outputs = [
                b for pair in zip(target[: len(cache.keys)], target[len(cache.keys) :], strict=True) for b in pair
            ]
            binding = graph_step.io_binding()
            values = []
            for name, value in feeds.items():
                if name.startswith("past_"):
                    continue
                values.append(ort.OrtValue.ortvalue_from_numpy(value))
                binding.bind_ortvalue_input(name, values[-1])
            values.append(ort.OrtValue.ortvalue_from_numpy(parents))
            binding.bind_ortvalue_input("parents", values[-1])
            for name, past, present in zip(names, [b[:rows] for b in order], [b[:rows] for b in outputs], strict=True):
                values.append(ort.OrtValue.ortvalue_from_numpy(past))
                binding.bind_ortvalue_input(name, values[-1])
                values.append(ort.OrtValue.ortvalue_from_numpy(present))
                binding.bind_ortvalue_output(name.replace("past_", "present_"), values[-1])
            for name in graph_step.get_outputs():
                if not name.name.startswith("present_"):
                    binding.bind_output(name.name)
            sets.append((binding, values))
        host_times, move_times, graph_times = [], [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            moving = 0.0
            for _ in range(args.steps):
                host_step.run_with_iobinding(host.binding)
                moved = time.perf_counter()
                cache._move(parents[changed], changed, cached)
                moving += time.perf_counter() - moved
            host_times.append((time.perf_counter() - start) / args.steps)
            move_times.append(moving / args.steps)
            start = time.perf_counter()
            for step in range(args.steps):
                graph_step.run_with_iobinding(sets[step % 2][0])
            graph_times.append((time.perf_counter() - start) / args.steps)
        h, m, g = (statistics.median(t) * 1e3 for t in (host_times, move_times, graph_times))
        print(f"| {rows} | {cached:,} | {h:.3f} | {m:.3f} | {g:.3f} | {g / h:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
