"""The engine as the server decodes with it (runtime/engine.py): warm-up through ``drain``, the memory model it
reports."""

from __future__ import annotations

from pathlib import Path

from runtime.engine import Engine
from runtime.options import EngineSettings, RuntimeOptions
from tests.conftest import own_sentences
from tests.runtime.spies import counted


def test_warming_up_decodes_each_length_and_beam_on_the_engines_sessions(tiny_export: Path):
    """Warm-up fills a batch and drains it for each length and beam: an encoder call each and several steps."""
    engine = Engine(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu", intra_op_threads=1)))
    runs = {"encoder": 0, "decoder": 0, "greedy": 0}
    backend = engine.backend
    backend.encoder.run = counted(runs, "encoder", backend.encoder.run)
    backend.decoder.run_with_iobinding = counted(runs, "decoder", backend.decoder.run_with_iobinding)
    greedy = backend.k_steps.session  # greedy batches' own graph (runtime/step_graphs.py)
    greedy.run_with_iobinding = counted(runs, "greedy", greedy.run_with_iobinding)
    engine.warmup(lengths=(8, 16), beams=(1, 2))
    assert runs["encoder"] == 4 and runs["decoder"] >= 2 * 7 and runs["greedy"] >= 2 * 7, runs


def test_the_engines_memory_model_counts_the_cache_it_makes(tiny_export: Path):
    """``Engine.memory``: a source's self-attention cache after n steps is what the batch's cache holds for it,
    page-rounded per (layer, head) block."""
    engine = Engine(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu")))
    batch = engine.new_batch()
    ids = engine.tokenizer.encode_source(own_sentences(1))
    batch.add([0], engine.encode(ids), [1], [16])
    assert engine.memory.target_bytes(16, 1) >= batch.cache_bytes > 0
    assert engine.memory.sequence_bytes(len(ids[0]), 16, 4) > engine.memory.sequence_bytes(len(ids[0]), 16, 1)
