"""ONNX Runtime's BeamSearch node over our weights (the benchmark's reference): greedy, it chooses what our
engine chooses; with beams it runs and answers token ids."""

from __future__ import annotations

from pathlib import Path

from export.generation_op import BeamSearchOp
from model.checkpoint import load_checkpoint
from runtime.sessions import OrtModel, RuntimeOptions
from tests.conftest import own_sentences


def test_the_beam_search_node_decodes_greedy_as_our_engine(tiny_checkpoint: Path, tiny_export: Path):
    model, tokenizer = load_checkpoint(tiny_checkpoint)
    op = BeamSearchOp(model, threads=1)
    ours = OrtModel(tiny_export, RuntimeOptions(provider="cpu", intra_op_threads=1))
    ids = tokenizer.encode_source(own_sentences(4))
    for source in ids:  # one at a time: the node decodes a batch to its longest limit, ours each to its own
        assert op.translate_ids([source], 1, max_output_tokens=12) == ours.translate_ids([source], 1, 12)
    beams = op.translate_ids(ids, 3, max_output_tokens=12)
    assert len(beams) == len(ids)
    assert all(0 < len(out) <= 12 and all(isinstance(t, int) for t in out) for out in beams)
