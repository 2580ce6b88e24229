"""The SkipLayerNormalization benchmark runs on any exported folder and reports both graphs agreeing."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.benchmarks.conftest import load_benchmark

skip_layer_norm = load_benchmark("skip_layer_norm")


def test_it_times_both_graphs_and_finds_them_agreeing(tiny_export: Path, tmp_path: Path, monkeypatch):
    out = tmp_path / "report.md"
    flags = ["--model", str(tiny_export), "--rows", "1,3", "--repeats", "1", "--runs", "2", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["skip_layer_norm.py", *flags])
    assert skip_layer_norm.main() == 0
    rows = [
        line.split(" | ")
        for line in out.read_text().splitlines()
        if line.startswith("| fp32") or line.startswith("| int8")
    ]
    assert [(row[0], row[1]) for row in rows] == [("| fp32", "1"), ("| fp32", "3"), ("| int8", "1"), ("| int8", "3")]
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in rows)
    assert all(row[6] == "True |" for row in rows if row[0] == "| fp32")  # same tokens in fp32
