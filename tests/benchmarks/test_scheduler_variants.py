"""The scheduler variants benchmark's variant syntax and report, on made-up measurements (the benchmark itself
runs servers: benchmarks/scheduler_variants.py)."""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import pytest

from tests.benchmarks.conftest import load_benchmark


@pytest.fixture(scope="module")
def variants():
    return load_benchmark("scheduler_variants")


def test_a_variant_names_its_flags_and_optionally_another_checkout(variants, tmp_path: Path):
    here = variants.Variant.parse("one-lane=--scheduler,continuous,--lanes,")
    assert (here.name, here.checkout, here.flags) == ("one-lane", None, ("--scheduler", "continuous", "--lanes", ""))
    there = variants.Variant.parse(f"before=@{tmp_path}:--scheduler,static")
    assert (there.checkout, there.flags) == (tmp_path.resolve(), ("--scheduler", "static"))
    for bad in ("no-flags", "=--scheduler,static"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME="):
            variants.Variant.parse(bad)


def test_the_report_gives_each_variants_capacity_and_latency_against_the_first(variants):
    def run(p99: float, rps: float) -> dict:
        window = rps - 1.0  # a few long requests answered after the last was sent
        return {
            "requests_per_s": rps,
            "window_per_s": window,
            "short_p50": p99 / 4,
            "short_p99": p99,
            "long_p99": 1.0,
            "errors": 1,
            "rate": 70,
            "cpu_s": 30.0 if p99 > 0.2 else 33.0,
        }

    chosen = [variants.Variant.parse("static=--scheduler,static"), variants.Variant.parse("continuous=")]
    measured = {
        "static": {"capacity": 100.0, "capacities": [99.0, 100.0, 101.0], 0.7: run(0.4, 70.0)},
        "continuous": {"capacity": 110.0, "capacities": [110.0, 108.0, 111.0], 0.7: run(0.1, 69.0)},
    }
    cell = variants.Cell(1, "off", 1, "doc:10-40", 80, 0.0)
    args = argparse.Namespace(seconds=20.0, repeats=3, capacity_seconds=12.0)
    lines = variants.report(measured, chosen, cell, [0.7], args)
    assert "| continuous | `` | 110.0 (110.0, 108.0, 111.0) | 1.10 |" in lines
    row = "| 70% | 70.0 | continuous | 69.00 | 68.00 | 0.025 | 0.100 | 1.000 | 1 | 33.0 | 0.25 | 0.99 | 0.99 | 1.10 |"
    assert row in lines
    assert lines[1].startswith("machine: ") and "80% single sentences, the rest doc:10-40" in lines[2]


def test_a_server_process_cpu_counts_its_other_threads(variants):
    """The CPU read for a server is every thread's, not only the main thread's (its lanes decode on others),
    and a thread that has ended still counts."""

    def burn() -> None:
        start = time.thread_time()
        while time.thread_time() - start < 0.3:
            pass

    before = variants.cpu_seconds(os.getpid())
    worker = threading.Thread(target=burn)
    worker.start()
    worker.join()
    assert variants.cpu_seconds(os.getpid()) - before >= 0.25
