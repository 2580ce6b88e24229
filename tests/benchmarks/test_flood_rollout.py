"""The rolling-restart flood end to end at a tiny size: its report has a row per phase and every request it sent
is classified. Not its speed, nor that nothing was lost: the benchmark itself says that (benchmarks/flood_rollout.py,
exit status 1 and a FAIL verdict)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.benchmarks.conftest import load_benchmark, need_corpus_and_models

PHASES = ["before", "replica 1 restarting", "between", "replica 2 restarting", "after"]


def test_a_quick_rolling_restart_reports_each_phase_and_classifies_every_request(tmp_path: Path):
    need_corpus_and_models()
    out = tmp_path / "rollout.md"
    load_benchmark("flood_rollout").main(["--quick", "--out", str(out)])
    report = out.read_text()
    counts = r" \| (\d+)" * 5  # sent, answered, refused, failed, lost
    rows = re.findall(rf"^\| ([a-z0-9 ]+) \| [\d.]+ \| [\d.]+{counts} \|", report, re.M)
    assert [row[0] for row in rows] == [*PHASES, "all"]
    for phase, sent, answered, refused, failed, lost in rows:
        assert int(sent) == int(answered) + int(refused) + int(failed) + int(lost), phase
    assert int(rows[-1][1]) > 0
    assert re.search(r"^\*\*Verdict: (PASS|FAIL)", report, re.M)
