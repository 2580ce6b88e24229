"""Engine benchmark report (part of ``make bench``; not a test).

    python benchmarks/engine_report.py --model exported/default --out benchmarks

For input lengths 16..1024: encoder time, decoder-step time with the KV cache
(ONNX Runtime and PyTorch) and without it (PyTorch re-running the prefix), the
share of attention in the step, and peak memory measured in a fresh process
next to the server's own estimate; plus a batch-size sweep. Writes
engine_report.md and PNG plots.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from common.corpus import MULTI30K
from runtime import offline
from runtime.backend import OrtBackend
from runtime.cpu import describe_cpu
from runtime.engine import Engine
from runtime.options import EngineSettings, RuntimeOptions

ROOT = Path(__file__).resolve().parents[1]

LENGTHS = (16, 64, 256, 512, 1024)
SWEEP_SENTENCES = 128  # test_2016_flickr sentences of the batch-size sweep


def median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_seconds(model: OrtBackend, length: int, repeats: int) -> float:
    """Median time of one decoder step of one row with ``length`` cached tokens and a source of ``length``
    tokens (a search without eos decodes up to there, then steps are timed in place)."""
    from runtime.search import Decoding

    src = np.random.default_rng(1).integers(4, model.config.vocab_size, length).tolist()
    batch = model.new_batch(Decoding(eos_id=-1))
    batch.add([0], model.encode_sources([src]), [1], [length + repeats + 3])
    for _ in range(max(0, length - 1)):
        batch.step()
    return median_time(batch.step, repeats)


def timing_rows(model_dir: Path, repeats: int) -> list[dict]:
    import torch

    from export.parity import example_inputs
    from model.checkpoint import load_checkpoint

    torch_model, _ = load_checkpoint()
    ort_model = OrtBackend(
        model_dir, RuntimeOptions(settings=EngineSettings(provider="cpu"), spinning=False, small_batch_threads=1)
    )
    c = ort_model.config
    rows = []
    for length in LENGTHS:
        src = np.random.default_rng(1).integers(4, c.vocab_size, (1, length))
        mask = np.ones_like(src, dtype=bool)
        encoder = median_time(lambda: ort_model.encode(src, mask), repeats)
        ort_step = step_seconds(ort_model, length, repeats)
        inputs = example_inputs(torch_model, 1, 1, length, length)
        with torch.inference_mode():
            torch_step = median_time(lambda: torch_model.decode_step(**inputs), repeats)
            memory = torch_model.encode(torch.from_numpy(src), torch.from_numpy(mask))
            prefix = torch.from_numpy(np.random.default_rng(2).integers(4, c.vocab_size, (1, length + 1)))
            no_cache = median_time(lambda: torch_model.decode(prefix, memory, torch.from_numpy(mask)), repeats)
        rows.append(
            {
                "length": length,
                "encoder_s": encoder,
                "ort_step_s": ort_step,
                "torch_step_s": torch_step,
                "torch_no_cache_step_s": no_cache,
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    # The step with almost nothing to attend to: what is left is projections, FFN and the output layer.
    floor = step_seconds(ort_model, 1, repeats)
    for row in rows:
        row["attention_share"] = max(0.0, 1 - floor / row["ort_step_s"])
    return rows


def batch_sweep(model_dir: Path, data: Path, repeats: int) -> list[dict]:
    from common.corpus import corpus_path, read_lines

    ort_model = OrtBackend(
        model_dir, RuntimeOptions(settings=EngineSettings(provider="cpu"), spinning=False, small_batch_threads=1)
    )
    texts = read_lines(corpus_path(data, "test_2016_flickr", "en"))[:SWEEP_SENTENCES]
    ids = ort_model.tokenizer.encode_source(texts)
    result = []
    for batch in (1, 4, 16, 64):
        outputs: list[int] = []

        def run():
            outputs.clear()
            for i in range(0, len(ids), batch):
                outputs.extend(len(o) + 1 for o in offline.translate_ids(ort_model, ids[i : i + batch]))

        seconds = median_time(run, repeats)
        result.append(
            {
                "batch": batch,
                "sentences": len(ids),
                "tokens_per_s": sum(outputs) / seconds,
                "sentences_per_s": len(ids) / seconds,
            }
        )
        print(json.dumps(result[-1]), file=sys.stderr, flush=True)
    return result


def measure_memory(model_dir: Path, length: int, beam: int) -> None:
    """In a fresh process: peak RSS growth while encoding one source of ``length`` tokens and decoding
    ``length`` steps with ``beam`` rows (a search that never meets eos), next to the server's estimate."""
    import psutil

    from runtime.search import Decoding

    engine = Engine(model_dir, RuntimeOptions(settings=EngineSettings(provider="cpu")))
    engine.warmup(lengths=(8,), beams=(beam,))
    process = psutil.Process()
    baseline, peak, running = process.memory_info().rss, [0], [True]

    def sample():
        while running[0]:
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.0005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    src = np.random.default_rng(0).integers(4, engine.config.vocab_size, length).tolist()
    batch = engine.backend.new_batch(Decoding(eos_id=-1))  # the engine's batch, with a search without eos
    batch.add([0], engine.encode([src]), [beam], [length + 1])
    cache_bytes = 0
    while len(batch):
        cache_bytes = max(cache_bytes, batch.cache_bytes + batch.cross_bytes)
        batch.step()
    running[0] = False
    thread.join()
    estimate = engine.memory.sequence_bytes(length, length, beam) + engine.memory.encoder_scores_bytes(1, length)
    print(
        json.dumps(
            {
                "length": length,
                "beam": beam,
                "measured_bytes": peak[0] - baseline,
                "estimate_bytes": estimate,
                "cache_bytes": cache_bytes,
            }
        )
    )


def memory_rows(model_dir: Path, beam: int) -> list[dict]:
    rows = []
    for length in LENGTHS:
        out = subprocess.run(
            [sys.executable, __file__, "--model", str(model_dir), "--measure-memory", str(length), "--beam", str(beam)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def plots(timings: list[dict], memory: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [r["length"] for r in timings]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (
        ("encoder_s", "encoder (ORT)"),
        ("ort_step_s", "decoder step, KV cache (ORT)"),
        ("torch_step_s", "decoder step, KV cache (PyTorch)"),
        ("torch_no_cache_step_s", "decoder step, no cache (PyTorch)"),
    ):
        ax.plot(lengths, [r[key] * 1000 for r in timings], marker="o", label=label)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="input length = cache length (tokens)",
        ylabel="ms",
        title="Latency vs sequence length",
    )
    ax.legend()
    fig.savefig(out / "latency_vs_length.png", dpi=110, bbox_inches="tight")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for beam in sorted({r["beam"] for r in memory}):
        rows = [r for r in memory if r["beam"] == beam]
        lengths = [r["length"] for r in rows]
        ax.plot(lengths, [r["measured_bytes"] / 2**20 for r in rows], marker="o", label=f"measured, beam {beam}")
        ax.plot(
            lengths, [r["estimate_bytes"] / 2**20 for r in rows], marker="s", ls="--", label=f"estimate, beam {beam}"
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="input length = output length (tokens)",
        ylabel="MiB",
        title="Memory vs sequence length",
    )
    ax.legend()
    fig.savefig(out / "memory_vs_length.png", dpi=110, bbox_inches="tight")
    plt.close("all")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "exported/default")
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--beam", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--measure-memory", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_memory:
        measure_memory(args.model, args.measure_memory, args.beam)
        return 0
    timings = timing_rows(args.model, args.repeats)
    memory = [row for beam in (1, 4) for row in memory_rows(args.model, beam)]
    sweep = batch_sweep(args.model, args.data, max(1, args.repeats // 2))
    args.out.mkdir(parents=True, exist_ok=True)
    lines = [
        f"command: `python benchmarks/engine_report.py --model {args.model} --repeats {args.repeats}`",
        f"machine: {describe_cpu()}; medians of {args.repeats} runs",
        "",
        "| length | encoder ms | step ms, cache (ORT) | step ms, cache (PyTorch) | step ms, no cache (PyTorch) "
        "| attention share of ORT step |",
        "|---|---|---|---|---|---|",
    ]
    for r in timings:
        lines.append(
            f"| {r['length']} | {r['encoder_s'] * 1e3:.2f} | {r['ort_step_s'] * 1e3:.2f} | "
            f"{r['torch_step_s'] * 1e3:.2f} | "
            f"{r['torch_no_cache_step_s'] * 1e3:.2f} | {r['attention_share']:.0%} |"
        )
    lines += [
        "",
        "Peak memory, one source decoded for as many steps as it has tokens (fresh process each):",
        "",
        "| length | beam | measured peak RSS growth MiB | server estimate MiB | ratio | cache buffers allocated MiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in memory:
        ratio = r["measured_bytes"] / r["estimate_bytes"]
        lines.append(
            f"| {r['length']} | {r['beam']} | {r['measured_bytes'] / 2**20:.1f} | {r['estimate_bytes'] / 2**20:.1f} | "
            f"{ratio:.2f} | {r['cache_bytes'] / 2**20:.1f} |"
        )
    lines += [
        "",
        f"Batch-size sweep (ONNX Runtime fp32, greedy, {sweep[0]['sentences']} test_2016_flickr sentences):",
        "",
        "| batch | output tokens/s | sentences/s |",
        "|---|---|---|",
    ]
    lines += [f"| {r['batch']} | {r['tokens_per_s']:.0f} | {r['sentences_per_s']:.1f} |" for r in sweep]
    (args.out / "engine_report.md").write_text("\n".join(lines) + "\n")
    plots(timings, memory, args.out)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
