"""The lane profile's sorting of py-spy's samples: a lane thread's sample is in ONNX Runtime's run when its innermost
Python frame is at a line that calls one, else in the first part a frame of its stack names, innermost first; other
threads' samples are left out."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.conftest import load_benchmark

lane_profile = load_benchmark("lane_profile")


def test_a_lane_sample_goes_to_the_run_its_innermost_line_calls_or_to_the_innermost_part(tmp_path: Path):
    backend = tmp_path / "backend.py"
    backend.write_text("    return session.run(None, feeds)\n    rows = len(feeds)\n")
    lane = "thread (7): inference-1-64/0;Scheduler._run (server/scheduling/scheduler.py:185)"
    raw = tmp_path / "raw.txt"
    raw.write_text(
        f"{lane};OrtBackend.step ({backend}:1) 5\n"
        f"{lane};DecodeBatch.step (runtime/batch.py:9);KVCache._move (runtime/caches.py:103) 2\n"
        f"{lane};OrtBackend.step ({backend}:2) 1\n"
        "thread (1): MainThread;Runner.run (asyncio/runners.py:118) 9\n"
    )
    counts = lane_profile.lane_parts(raw)
    assert counts == {lane_profile.RUNS: 5, "KV-cache moves": 2, "scheduler and answers": 1}
