"""SkipLayerNormalization written into the greedy step (runtime/fusions.py) against the step as exported, on the CPU
provider (not a test): whether the CPU's own greedy graph should take the fusion the device greedy step has.

    python benchmarks/skip_layer_norm.py --out benchmarks/skip_layer_norm.md

For each variant of the default model and each row count: one run's median time over ``--repeats`` rounds of
``--runs`` runs, the two graphs alternating in one process on the engine's CPU session options (2 intra-op
threads), fed one fixed mid-decode state (cache length 64, 20 entries per row, sources of 24 tokens), and the
largest difference in log-probabilities and whether the chosen tokens agree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.cpu import describe_cpu  # noqa: E402
from runtime.fusions import fuse_skip_layer_norm  # noqa: E402
from runtime.providers import open_session  # noqa: E402
from runtime.step_graphs import greedy_step_graph  # noqa: E402

FILES = {"fp32": "decoder.onnx", "int8": "decoder.int8.onnx"}


def feeds(session, rows: int) -> dict[str, np.ndarray]:  # noqa: ANN001
    rng = np.random.default_rng(0)
    sizes = {"rows": rows, "sources": rows, "cache_len": 64, "src_len": 24}
    values = {
        "tokens": rng.integers(4, 100, rows).astype(np.int64),  # ids every vocabulary has
        "lengths": np.full(rows, 20, np.int32),
        "total_length": np.array(21, np.int32),
        "src_mask": np.ones((rows, 24), np.int32),
    }
    for value in session.get_inputs():
        if value.name not in values:
            shape = [sizes.get(axis, axis) for axis in value.shape]
            values[value.name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "exported" / "default")
    parser.add_argument("--rows", default="1,32")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lines = [
        "# SkipLayerNormalization in the greedy step, on the CPU",
        "",
        f"command: `python benchmarks/skip_layer_norm.py {' '.join(sys.argv[1:])}`",
        f"machine: {describe_cpu()}; ONNX Runtime's CPU provider, 2 intra-op threads; medians of {args.repeats}.",
        "",
        "| variant | rows | as exported, ms per run | fused, ms per run | fused / as exported | max log-p difference "
        "| same tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant, name in FILES.items():
        plain = greedy_step_graph(onnx.load(str(args.model / name)))
        graphs = {"plain": plain, "fused": fuse_skip_layer_norm(greedy_step_graph(onnx.load(str(args.model / name))))}
        sessions = {key: open_session(g.SerializeToString(), "cpu", 2, True, False) for key, g in graphs.items()}
        for rows in map(int, args.rows.split(",")):
            inputs = feeds(sessions["plain"], rows)
            outputs = {key: s.run(None, {k: v.copy() for k, v in inputs.items()}) for key, s in sessions.items()}
            times: dict[str, list[float]] = {key: [] for key in sessions}
            for repeat in range(args.repeats):
                for key in list(sessions) if repeat % 2 == 0 else list(sessions)[::-1]:
                    start = time.perf_counter()
                    for _ in range(args.runs):
                        sessions[key].run(None, inputs)
                    times[key].append((time.perf_counter() - start) / args.runs * 1e3)
            plain_ms, fused_ms = (statistics.median(times[key]) for key in ("plain", "fused"))
            difference = float(np.abs(outputs["plain"][0] - outputs["fused"][0]).max())
            same = bool((outputs["plain"][1] == outputs["fused"][1]).all())
            lines.append(
                f"| {variant} | {rows} | {plain_ms:.3f} | {fused_ms:.3f} | {fused_ms / plain_ms:.2f} | "
                f"{difference:.1e} | {same} |"
            )
            print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
