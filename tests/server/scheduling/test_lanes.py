"""A lane on its own (server/scheduling/lanes.py): a model's lanes, where a request's sentences go, what it leaves for
its replicas to take, and that only its methods change it; no scheduler, no inference threads."""

from __future__ import annotations

import ast
import dataclasses
import threading
from pathlib import Path

import pytest

from server.scheduling.fairness import LongerLanes
from server.scheduling.jobs import QueuedSentence
from server.scheduling.lanes import Lane, model_lanes, size_class, spread
from testkit.sentences import own_sentences
from tests.server.fake_engine import FakeEngine, fake_job


def test_every_lane_size_has_its_replicas_numbered_across_models_and_longer_sizes_run_at_lower_priority():
    lanes = model_lanes({"en-de": 2, "de-en": 1}, bounds=(64,), fairness=LongerLanes(niceness_step=10, share=0.5))
    names = {
        model: [(lane.index, lane.name, lane.size_class, lane.niceness) for lane in lanes[model]] for model in lanes
    }
    assert names == {
        "en-de": [(0, "1-64/0", 0, 0), (1, "1-64/1", 0, 0), (2, "65+/0", 1, 10), (3, "65+/1", 1, 10)],
        "de-en": [(4, "1-64", 0, 0), (5, "65+", 1, 10)],
    }
    assert [size_class((32, 128), tokens) for tokens in (1, 32, 33, 128, 129)] == [0, 0, 1, 1, 2]


def test_a_requests_sentences_spread_over_the_replicas_each_to_the_least_loaded():
    engine = FakeEngine()
    busy, idle = Lane(0, "1-64/0", "m", 0), Lane(1, "1-64/1", "m", 0)
    busy.waiting.extend(_queued(engine, own_sentences(3)))
    # the idle replica takes sentences until it is as loaded, then they alternate
    assert spread([busy, idle], 6) == [1, 1, 1, 0, 1, 0]
    assert spread([idle], 2) == [1, 1]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="thread names are read from /proc (Linux)")
def test_a_lane_names_its_thread_for_the_os():
    """top -H and /proc show which lane burns the CPU (benchmarks/service_overhead.py reads them)."""
    lane = Lane(3, "65+", "m", 0)
    names = []

    def run() -> None:
        lane.open(FakeEngine())
        names.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert names == ["lane3 65+"] and lane.batch is not None


def _queued(engine: FakeEngine, sentences: list[str], beam: int = 1) -> list[QueuedSentence]:
    """The sentences of a job, as the scheduler queues them."""
    job = fake_job(engine, sentences, beam)
    return [QueuedSentence(job, spec, max_length=16) for spec in job.specs]


def test_a_lane_overflows_with_what_its_batch_has_no_room_for():
    engine = FakeEngine()
    lane = Lane(1, "17+", "m", 10, size_class=1)
    document = _queued(engine, own_sentences(5))
    for segment in document[1:]:
        lane.queue(segment)
    lane.join(document[0])
    assert list(lane.overflow(3)) == document[3:]  # 1 running, 2 waiting fit in a room of 3
    assert list(lane.overflow(1)) == document[1:]


MUTATORS = {"append", "appendleft", "remove", "pop", "popleft", "clear", "extend", "insert", "setdefault", "discard"}


def test_no_field_of_a_lane_is_assigned_outside_its_class():
    """The scheduler asks a lane to change (attach, start, step, queue, join, leave, restart...): outside its class
    nobody assigns one of its fields, an item of its queue or batch, or changes them in place, nor do the tests."""
    fields = {field.name for field in dataclasses.fields(Lane)}
    containers = {"waiting", "running"}  # the lane's own queue and rows, which only its methods change
    root = Path(__file__).resolve().parents[3]
    lanes = root / "server" / "scheduling" / "lanes.py"
    assert lanes.is_file()

    def of_a_lane(node: ast.AST) -> bool:  # lane.x, self.lanes[i].x, ..., but not self.x in a class of its own
        return isinstance(node, ast.Attribute) and "lane" in ast.unparse(node.value)

    changed = []
    for path in [*(root / "server").rglob("*.py"), *(root / "tests").rglob("*.py"), *(root / "testkit").rglob("*.py")]:
        if path == lanes:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [getattr(node, "target", None)]
            items = [
                item for target in targets for item in (target.elts if isinstance(target, ast.Tuple) else [target])
            ]
            items = [item.value if isinstance(item, ast.Subscript) else item for item in items]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                changes = node.func.value  # lane.waiting in lane.waiting.append(...)
                if isinstance(changes, ast.Attribute) and changes.attr in containers:
                    items.append(changes)
            for item in items:
                if of_a_lane(item) and item.attr in fields:
                    changed.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(item)}")
    assert not changed
