"""The scheduler matrix benchmark's cells, report and heat map, on made-up measurements (the benchmark itself
runs servers for hours: benchmarks/scheduler_matrix.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.benchmarks.conftest import load_benchmark


@pytest.fixture(scope="module")
def matrix():
    return load_benchmark("scheduler_matrix")


def test_a_cells_traffic_is_each_models_corpus_with_the_repeats_of_its_cache_setting(matrix):
    corpus = Path("/corpus/train")
    two = matrix.Cell(models=2, cache="90", beam=4, long="doc:10-40", short=80, load=0.7)
    assert two.profiles(corpus) == [
        ("en:de", "corpus:/corpus/train.en.gz:80:doc:10-40:90"),
        ("de:en", "corpus:/corpus/train.de.gz:80:doc:10-40:90"),
    ]
    off = matrix.Cell(models=1, cache="off", beam=1, long="run-on:100-1000", short=50, load=0.5)
    assert off.profiles(corpus) == [("en:de", "corpus:/corpus/train.en.gz:50:run-on:100-1000:0")]


def test_the_report_gives_each_cells_ratios_and_the_heat_map_is_drawn(matrix, tmp_path: Path):
    def run(p99: float, rps: float) -> dict:
        return {"requests_per_s": rps, "short_p50": p99 / 4, "short_p99": p99, "long_p99": 1.0, "errors": 0}

    cells = [matrix.Cell(1, cache, 1, "doc:10-40", 80, 0.7) for cache in ("off", "90")]
    measured = {
        cells[0]: {
            "capacity": {"static": 40.0, "continuous": 30.0},
            "rate": 28.0,
            "static": run(0.4, 28.0),
            "continuous": run(0.1, 27.0),
        },
        cells[1]: {
            "capacity": {"static": 100.0, "continuous": 100.0},
            "rate": 70.0,
            "static": run(0.1, 70.0),
            "continuous": run(0.2, 70.0),
        },
    }
    args = argparse.Namespace(seconds=30.0, repeats=3, capacity_seconds=15.0)
    lines = matrix.report(measured, args, 0.0)
    assert "| 1 model, cache off, greedy, doc:10-40, 80% short, 70% load | 0.25 | 0.96 | 0.75 |" in lines
    assert "| 1 model, cache 90% rep., greedy, doc:10-40, 80% short, 70% load | 2.00 | 1.00 | 1.00 |" in lines
    assert sum(line.startswith("| 1 | ") for line in lines) == 4  # each cell, each scheduler
    assert "| 40.0 / 30.0 | 28.0 | continuous | 27.00 |" in lines[6]  # capacity, offered rate, throughput
    matrix.heat_map(measured, tmp_path / "map.png")
    assert (tmp_path / "map.png").read_bytes().startswith(b"\x89PNG")
