"""The load generator's results and report (client/loadtest.py): latency percentiles overall and per
length bucket, errors by status code, the server's metric deltas and peaks, as JSON, Markdown and plots."""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from runtime.cpu import describe_cpu
from server.operations.metrics import length_label


@dataclass
class Result:
    input_tokens: int
    latency: float
    code: str
    output_tokens: int = 0
    started: float = 0.0
    attempts: int = 1  # gRPC: the attempt that answered (the service config retries UNAVAILABLE, CANCELLED)


@dataclass
class Run:
    mode: str
    concurrency: int
    rate: float
    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0
    server: dict[str, float] = field(default_factory=dict)
    client_cpu_seconds: float = 0.0  # the load generator's own CPU over the run (it may share the server's cores)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


THREAD_CPU = "translate_thread_cpu_seconds_total"  # one value per thread kind: "<name>:<kind>"


def scrape(url: str | None) -> dict[str, float]:
    """Selected samples of the server's metrics (sums over labels; the thread CPU by kind, one per kind)."""
    if not url:
        return {}
    wanted = (
        "translate_queue_wait_seconds_sum",
        "translate_queue_wait_seconds_count",
        "translate_batch_size_sentences_sum",
        "translate_batch_size_sentences_count",
        "translate_kv_cache_bytes",
        "translate_memory_reserved_bytes",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "translate_requests_total",
    )
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name in wanted:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
            elif sample.name == "translate_thread_cpu_seconds_total":
                values[f"{THREAD_CPU}:{sample.labels['kind']}"] = sample.value
    return values


def cores_busy(server: dict[str, float], seconds: float) -> dict[str, float]:
    """The server's cores busy over a run (CPU seconds per second): in all, and by thread kind."""
    if not seconds or "process_cpu_seconds_total_delta" not in server:
        return {}
    busy = {"all": server["process_cpu_seconds_total_delta"] / seconds}
    for key, value in server.items():
        if key.startswith(THREAD_CPU + ":"):
            busy[key.split(":")[1].removesuffix("_delta")] = value / seconds
    return busy


def summarize(run: Run) -> dict:
    ok = [r for r in run.results if r.code == "OK"]
    codes: dict[str, int] = {}
    for r in run.results:
        codes[r.code] = codes.get(r.code, 0) + 1
    buckets: dict[str, list[float]] = {}
    for r in ok:
        buckets.setdefault(length_label(r.input_tokens), []).append(r.latency)

    def stats(latencies: list[float]) -> dict[str, float]:
        return {
            "count": len(latencies),
            "p50": percentile(latencies, 0.5),
            "p90": percentile(latencies, 0.9),
            "p99": percentile(latencies, 0.99),
            "max": max(latencies, default=float("nan")),
        }

    s = run.server
    return {
        "mode": run.mode,
        "concurrency": run.concurrency,
        "rate": run.rate,
        "requests": len(run.results),
        "seconds": run.seconds,
        "requests_per_second": len(ok) / run.seconds if run.seconds else 0.0,
        "input_tokens_per_second": sum(r.input_tokens for r in ok) / run.seconds if run.seconds else 0.0,
        "output_tokens_per_second": sum(r.output_tokens for r in ok) / run.seconds if run.seconds else 0.0,
        "latency": stats([r.latency for r in ok]),
        "by_length": {
            b: stats(v) for b, v in sorted(buckets.items(), key=lambda kv: int(kv[0].split("-")[0].rstrip("+")))
        },
        "codes": codes,
        "server": s,
        "answered": len(ok),
        "lost": len(run.results) - len(ok),
        "retried": sum(r.attempts > 1 for r in run.results),
        "server_mean_queue_wait_seconds": s.get("translate_queue_wait_seconds_sum_delta", 0)
        / max(s.get("translate_queue_wait_seconds_count_delta", 0), 1),
        "server_mean_batch_sentences": s.get("translate_batch_size_sentences_sum_delta", 0)
        / max(s.get("translate_batch_size_sentences_count_delta", 0), 1),
        "server_cores_busy": cores_busy(s, run.seconds),
        "client_cores_busy": run.client_cpu_seconds / run.seconds if run.seconds else 0.0,
    }


def markdown(summaries: list[dict], command: str) -> str:
    lines = [
        f"command: `{command}`",
        f"client machine: {describe_cpu()} (the server's CPU is its own to record)",
        "",
        "| mode | concurrency / rate | sent | answered / retried / lost | req/s | in tok/s | p50 s | p90 s | p99 s "
        "| max s | codes | server batch | server queue wait s | peak KV bytes | peak RSS MiB | server cores busy "
        "| client cores busy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lat, srv = s["latency"], s["server"]
        load = f"{s['rate']}/s" if s["mode"] == "open" else str(s["concurrency"])
        lines.append(
            f"| {s['mode']} | {load} | {s['requests']} | {s['answered']} / {s['retried']} / {s['lost']} | "
            f"{s['requests_per_second']:.1f} | {s['input_tokens_per_second']:.0f} | "
            f"{lat['p50']:.3f} | {lat['p90']:.3f} | {lat['p99']:.3f} | {lat['max']:.3f} | {s['codes']} | "
            f"{s['server_mean_batch_sentences']:.1f} | {s['server_mean_queue_wait_seconds']:.3f} | "
            f"{srv.get('translate_kv_cache_bytes_peak', 0):.0f} | "
            f"{srv.get('process_resident_memory_bytes_peak', 0) / 2**20:.0f} | {_busy(s['server_cores_busy'])} | "
            f"{s['client_cores_busy']:.2f} |"
        )
    lines += ["", "| length bucket | count | p50 s | p99 s |", "|---|---|---|---|"]
    for s in summaries:
        for bucket, b in s["by_length"].items():
            lines.append(
                f"| {bucket} ({s['mode']} {s['concurrency'] or s['rate']}) | {b['count']} | "
                f"{b['p50']:.3f} | {b['p99']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def _busy(busy: dict[str, float]) -> str:
    """E.g. "1.86 (lanes 1.62, front_door 0.19, grpc 0.02, other 0.00)"."""
    if not busy:
        return "-"
    kinds = ", ".join(f"{kind} {value:.2f}" for kind, value in busy.items() if kind != "all")
    return f"{busy['all']:.2f}" + (f" ({kinds})" if kinds else "")


def plot(runs: list[Run], summaries: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    answered = 0
    for run in runs:
        ok = [r for r in run.results if r.code == "OK"]
        answered += len(ok)
        label = f"{run.mode} {run.concurrency or run.rate}"
        ax.scatter([r.input_tokens for r in ok], [r.latency for r in ok], s=8, alpha=0.5, label=label)
    ax.set(xlabel="input tokens", ylabel="latency (s)", title="Latency vs input length (answered requests)")
    if answered:
        ax.set(xscale="log", yscale="log")
        ax.legend()
    paths.append(out / "latency_vs_length.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    closed = [s for s in summaries if s["mode"] == "closed"]
    if closed:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot([s["concurrency"] for s in closed], [s["requests_per_second"] for s in closed], marker="o")
        ax.set(xlabel="concurrent clients", ylabel="requests/s", title="Throughput vs concurrency", xscale="log")
        paths.append(out / "throughput_vs_concurrency.png")
        fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close("all")
    return paths
