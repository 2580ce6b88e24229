"""The engine as the server decodes with it (runtime/engine.py): replicas on other threads, a batch stepped on
another replica's sessions, warm-up through ``drain``, the memory model it reports."""

from __future__ import annotations

from pathlib import Path

from runtime import offline
from runtime.backend import OrtBackend
from runtime.batch import DecodeBatch
from runtime.engine import Engine
from runtime.options import RuntimeOptions
from tests.conftest import own_sentences


def _counted(counts: dict[str, int], name: str, run):
    """``run``, counting its calls in counts[name]."""

    def counting(*args):
        counts[name] += 1
        return run(*args)

    return counting


def _sessions_counted(engine: Engine, runs: dict[str, int], name: str) -> None:
    backend = engine.backend
    backend.encoder.run = _counted(runs, name, backend.encoder.run)
    backend.decoder.run_with_iobinding = _counted(runs, name, backend.decoder.run_with_iobinding)


def test_a_batch_steps_on_whichever_replica_the_lane_holds(tiny_export: Path):
    """A server's longer lane holds its own replica and a narrow one (fewer threads) for while it shares the
    cores: a batch made by one encodes and steps on the other when told, switches back mid-decode, and
    translates as the model does alone."""
    engine = Engine(tiny_export, RuntimeOptions(provider="cpu", intra_op_threads=2))
    narrow = engine.replica(1)
    threads = lambda e: e.backend.decoder.get_session_options().intra_op_num_threads  # noqa: E731
    assert (threads(engine), threads(narrow)) == (2, 1)
    runs = {"wide": 0, "narrow": 0}
    _sessions_counted(engine, runs, "wide")
    _sessions_counted(narrow, runs, "narrow")
    ids = engine.tokenizer.encode_source(own_sentences(20))
    batch: DecodeBatch = engine.new_batch()
    batch.add(list(range(len(ids))), narrow.encode(ids), [2] * len(ids), [12] * len(ids))
    assert runs == {"wide": 0, "narrow": 1}
    results = {}
    for _ in range(4):
        results.update(batch.step(on=narrow))
    assert runs == {"wide": 0, "narrow": 5}
    while len(batch):
        results.update(batch.step())
    assert runs["wide"] > 0 and runs["narrow"] == 5
    plain = OrtBackend(tiny_export, RuntimeOptions(provider="cpu"))
    expected = offline.hypotheses(plain, ids, 2, 12)
    assert [results[i].tokens for i in range(len(ids))] == [h.tokens for h in expected]


def test_warming_up_decodes_each_length_and_beam_on_the_engines_own_sessions(tiny_export: Path):
    """Warm-up fills a batch and drains it for each length and beam: an encoder call each and several steps,
    all on the engine's sessions (a narrow replica warms its own)."""
    engine = Engine(tiny_export, RuntimeOptions(provider="cpu", intra_op_threads=2))
    narrow = engine.replica(1)
    runs = {"encoder": 0, "decoder": 0, "other": 0}
    backend = narrow.backend
    backend.encoder.run = _counted(runs, "encoder", backend.encoder.run)
    backend.decoder.run_with_iobinding = _counted(runs, "decoder", backend.decoder.run_with_iobinding)
    _sessions_counted(engine, runs, "other")
    narrow.warmup(lengths=(8, 16), beams=(1, 2))
    assert runs["encoder"] == 4 and runs["decoder"] >= 4 * 7 and runs["other"] == 0


def test_the_engines_memory_model_counts_the_cache_it_makes(tiny_export: Path):
    """``Engine.memory``: a source's self-attention cache after n steps is what the batch's cache holds for it,
    page-rounded per (layer, head) block."""
    engine = Engine(tiny_export, RuntimeOptions(provider="cpu"))
    batch = engine.new_batch()
    ids = engine.tokenizer.encode_source(own_sentences(1))
    batch.add([0], engine.encode(ids), [1], [16])
    assert engine.memory.target_bytes(16, 1) >= batch.cache_bytes > 0
    assert engine.memory.sequence_bytes(len(ids[0]), 16, 4) > engine.memory.sequence_bytes(len(ids[0]), 16, 1)
