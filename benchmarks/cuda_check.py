"""The CUDA path on a GPU, checked and timed:
``python benchmarks/cuda_check.py --model DIR [--data DIR] [--repeats 3]`` (onnxruntime-gpu, a folder
exported with ``--fp16``).

Checks, on test_2016_flickr: the CUDA provider's fp32 translations against the CPU provider's (share
identical, greedy and beam 4) and BLEU of fp32 and fp16 on CUDA. Times (output tokens per second,
medians of repeats, variants alternating within each repeat): fp32 and fp16, each with the
self-attention cache on the device for the whole decode (``DeviceKVCache``, the default on CUDA)
against the cache on the host re-bound every step (IOBinding alone, the engine before the device
cache), at batch 1 and 32, greedy and beam 4.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import onnxruntime as ort
import sacrebleu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.corpus import corpus_path, read_lines  # noqa: E402
from runtime.cpu import describe_cpu  # noqa: E402
from runtime.sessions import OrtModel, RuntimeOptions  # noqa: E402

CASES = [(1, 1), (32, 1), (1, 4), (32, 4)]  # (batch size, beam)
BATCH_1_SENTENCES = 150


def gpu_name() -> str:
    try:
        query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
        return subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown GPU"


def translate_all(model: OrtModel, sources: list[list[int]], batch: int, beam: int) -> tuple[float, list[list[int]]]:
    """Output tokens per second (each output plus its eos) and the outputs, in batches of similar length."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: list[list[int]] = [[] for _ in sources]
    start = time.perf_counter()
    for first in range(0, len(order), batch):
        group = order[first : first + batch]
        for i, output in zip(group, model.translate_ids([sources[i] for i in group], beam), strict=True):
            outputs[i] = output
    seconds = time.perf_counter() - start
    return sum(len(o) + 1 for o in outputs) / seconds, outputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/multi30k")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print("cuda_check: this onnxruntime has no CUDA provider (install onnxruntime-gpu)", file=sys.stderr)
        return 2
    texts = read_lines(corpus_path(args.data, "test_2016_flickr", "en"))
    references = read_lines(corpus_path(args.data, "test_2016_flickr", "de"))
    models: dict[str, OrtModel] = {}
    for variant in ("fp32", "fp16"):
        for device_cache in (True, False):
            name = f"{variant}, cache on {'device' if device_cache else 'host'}"
            models[name] = OrtModel(args.model, RuntimeOptions(variant, "cuda", device_cache=device_cache))
    cpu = OrtModel(args.model, RuntimeOptions("fp32", "cpu", spinning=False))
    tokenizer = cpu.tokenizer
    sources = tokenizer.encode_source(texts)

    print(f"command: python benchmarks/cuda_check.py {shlex.join(sys.argv[1:])}")
    print(f"machine: {gpu_name()}; {describe_cpu()}; onnxruntime {ort.__version__}; medians of {args.repeats}")
    print("\n| check | result |\n|---|---|")
    for beam in (1, 4):
        _, on_cpu = translate_all(cpu, sources, 32, beam)
        for name in ("fp32, cache on device", "fp32, cache on host"):
            _, on_gpu = translate_all(models[name], sources, 32, beam)
            same = sum(a == b for a, b in zip(on_cpu, on_gpu, strict=True)) / len(sources)
            print(f"| CUDA {name} vs CPU fp32, beam {beam}: identical outputs | {same:.1%} |")
    for name in ("fp32, cache on device", "fp16, cache on device"):
        _, outputs = translate_all(models[name], sources, 32, 1)
        bleu = sacrebleu.corpus_bleu([tokenizer.decode(o) for o in outputs], [references]).score
        print(f"| CUDA {name}: BLEU, greedy | {bleu:.2f} |")

    print("\n| case (tok/s) | " + " | ".join(models) + " | fp32 device / host cache | fp16 / fp32 (device) |")
    print("|" + "---|" * (len(models) + 3))
    for batch, beam in CASES:
        subset = sources[:BATCH_1_SENTENCES] if batch == 1 else sources
        rates: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(args.repeats):
            for name, model in models.items():
                rates[name].append(translate_all(model, subset, batch, beam)[0])
        median = {name: statistics.median(values) for name, values in rates.items()}
        cells = " | ".join(f"{median[name]:,.0f}" for name in models)
        ratio = median["fp32, cache on device"] / median["fp32, cache on host"]
        fp16 = median["fp16, cache on device"] / median["fp32, cache on device"]
        print(f"| batch {batch}, {'greedy' if beam == 1 else f'beam {beam}'} | {cells} | {ratio:.2f} | {fp16:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
