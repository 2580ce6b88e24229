"""The flood benchmark end to end at a tiny size: its report has a row per front door and every request it sent
is classified. Not its speed: the benchmark itself floods for ten minutes (benchmarks/flood.py)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.benchmarks.conftest import load_benchmark, need_corpus_and_models


def test_a_tiny_flood_reports_each_front_door_and_classifies_every_request(tmp_path: Path):
    need_corpus_and_models()
    out = tmp_path / "flood.md"
    tiny = ["--capacity-seconds", "2", "--seconds", "3", "--document-chars", "5000", "--drain-seconds", "15"]
    load_benchmark("flood").main(["--quick", *tiny, "--times", "2", "--out", str(out)])
    report = out.read_text()
    counts = r" \| (\d+)" * 5  # sent, answered, refused, failed, lost
    rows = re.findall(rf"^\| (http|grpc) \| [\d.]+ \| [\d.]+{counts} \|", report, re.M)
    assert [row[0] for row in rows] == ["http", "grpc"]
    for door, sent, answered, refused, failed, lost in rows:
        assert int(sent) > 0, door
        assert int(sent) == int(answered) + int(refused) + int(failed) + int(lost), door
    assert re.search(r"^- http: (PASS|FAIL)", report, re.M) and re.search(r"^- grpc: (PASS|FAIL)", report, re.M)
