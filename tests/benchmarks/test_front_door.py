"""The front-door benchmark in its smallest form: the shipped server over a null engine answers every request
shape, its CPU per request is counted, and py-spy's samples are split by stage in the order STAGES says."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.benchmarks.conftest import load_benchmark

front_door = load_benchmark("front_door")


def test_the_null_engine_answers_each_sentence_at_its_first_step_with_its_own_ids(tiny_export: Path):
    engine = front_door.NullEngine(tiny_export)
    ids = engine.tokenize(["A man rides a bike.", "Two dogs."])
    batch = engine.new_batch()
    batch.add(["a", "b"], engine.encode(ids), [1, 1], [32, 32])
    assert batch.rows == 2
    done = dict(batch.step())
    assert [done["a"].tokens, done["b"].tokens] == ids and len(batch) == 0
    assert engine.detokenize([done["a"].tokens]) == engine.tokenizer.decode([ids[0]])


def test_every_request_shape_is_served_and_its_cpu_counted(tiny_export: Path, multi30k: Path, tmp_path: Path):
    out = tmp_path / "front_door.md"
    flags = ["--model", str(tiny_export), "--data", str(multi30k), "--seconds", "0.5", "--repeats", "1"]
    assert front_door.main([*flags, "--clients", "2", "--out", str(out)]) == 0
    results = json.loads(out.with_suffix(".json").read_text())
    assert sorted(results) == sorted(front_door.SHAPES)
    for runs in results.values():
        assert runs[0]["requests_per_s"] > 0 and runs[0]["server_ms_per_request"] > 0
    report = out.read_text()
    assert all(f"| {shape} | " in report for shape in front_door.SHAPES)


def test_a_sample_goes_to_the_innermost_stage_of_its_stack(tmp_path: Path):
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "lane0;run (server/scheduling/scheduler.py:1);decode (sentencepiece/__init__.py:2) 3\n"
        "loop;run (asyncio/base_events.py:1);finish (server/operations/access.py:9);emit (logging/__init__.py:4) 2\n"
        "loop;run (asyncio/base_events.py:1) 5\n"
        "loop;somewhere (elsewhere.py:1) 1\n"
    )
    assert front_door.stage_samples(raw) == {
        "tokenize / detokenize": 3,
        "access log": 2,
        "event loop": 5,
        "other": 1,
    }


def test_every_stage_names_modules_that_exist():
    """A stage's pattern for our own files matches a module of the repository: one that moved would otherwise
    leave its samples under "other"."""
    root = Path(__file__).resolve().parents[2]
    modules = [str(path.relative_to(root)) for path in root.glob("[rs]*/**/*.py")]
    for name, pattern in front_door.STAGES:
        for alternative in pattern.split("|"):
            if alternative.startswith(("server/", "runtime/")):
                assert any(re.search(alternative, module) for module in modules), (name, alternative)
