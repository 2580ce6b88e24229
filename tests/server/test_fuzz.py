"""The coverage-guided fuzz targets (tests/server/fuzz.py), each for FUZZ_SECONDS (6 by default: seven
targets, under a minute in CI, which keeps the whole suite under its 15 minutes) from its seeds,
with a fixed seed (FUZZ_RANDOM=1: a new one each run, as the property tests do). A crash fails the test with
the input libFuzzer saved; replay it with ``python -m tests.server.fuzz TARGET FILE`` and keep it as a
regression test beside the code it broke. FUZZ_SECONDS=600 FUZZ_RANDOM=1 explores for longer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="atheris (the test extra) is not installed")

from tests.conftest import ROOT  # noqa: E402
from tests.server.fuzz import SERVED_TARGETS, TARGETS  # noqa: E402

SEEDS = Path(__file__).parent / "fuzz_seeds"
SECONDS = int(os.environ.get("FUZZ_SECONDS", "6"))


@pytest.mark.parametrize("target", [*TARGETS, *SERVED_TARGETS])
def test_fuzz_target_finds_nothing(target: str, tiny_export: Path, tmp_path: Path, capsys):
    corpus = tmp_path / "corpus"  # what the run adds; the seeds stay as they are
    corpus.mkdir()
    model = ["--model", str(tiny_export)] if target in SERVED_TARGETS else []
    flags = [f"-max_total_time={SECONDS}", "-timeout=30", "-rss_limit_mb=4096", f"-artifact_prefix={tmp_path}/"]
    if not os.environ.get("FUZZ_RANDOM"):
        flags.append("-seed=1")
    command = [sys.executable, "-m", "tests.server.fuzz", target, *model, *flags, str(corpus), str(SEEDS / target)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=SECONDS + 120)
    crashes = sorted(tmp_path.glob("crash-*")) + sorted(tmp_path.glob("timeout-*"))
    assert run.returncode == 0 and not crashes, (crashes, run.stderr[-3000:])
    runs = re.search(r"Done (\d+) runs in (\d+) second", run.stderr)
    with capsys.disabled():
        print(f"\n{target}: {int(runs[1]):,} runs in {runs[2]} s, {int(runs[1]) // max(int(runs[2]), 1):,}/s")
