"""ONNX Runtime's BeamSearch node over our weights (the benchmark's reference): greedy, it chooses what our
engine chooses; with beams, the same tokens for most sentences (it ranks finished hypotheses its own way)."""

from __future__ import annotations

from pathlib import Path

from export.generation_op import BeamSearchOp
from model.checkpoint import load_checkpoint
from runtime import offline
from runtime.backend import OrtBackend
from runtime.options import EngineSettings, RuntimeOptions
from tests.conftest import own_sentences


def test_the_beam_search_node_decodes_greedy_as_our_engine(tiny_checkpoint: Path, tiny_export: Path):
    model, tokenizer = load_checkpoint(tiny_checkpoint)
    op = BeamSearchOp(model, threads=1)
    ours = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu", intra_op_threads=1)))
    ids = tokenizer.encode_source(own_sentences(4))
    for source in ids:  # one at a time: the node decodes a batch to its longest limit, ours each to its own
        assert op.translate_ids([source], 1, max_output_tokens=12) == offline.translate_ids(ours, [source], 1, 12)


def test_the_beam_search_node_finds_the_engines_beams(tiny_checkpoint: Path, tiny_export: Path):
    """Beam 2: the node's tokens are the engine's for every sentence; beams 3 and 4 differ where the node keeps
    a finished hypothesis the engine's search ranks lower (40 tiny-model sentences: 36 and 31 the same)."""
    model, tokenizer = load_checkpoint(tiny_checkpoint)
    op = BeamSearchOp(model, threads=1)
    ours = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu", intra_op_threads=1)))
    ids = tokenizer.encode_source(own_sentences(40))
    for beam, at_least in ((2, 40), (3, 34), (4, 28)):
        theirs = [op.translate_ids([source], beam, max_output_tokens=12)[0] for source in ids]
        engine = [offline.translate_ids(ours, [source], beam, 12)[0] for source in ids]
        same = sum(a == b for a, b in zip(theirs, engine, strict=True))
        assert same >= at_least, f"beam {beam}: {same} of {len(ids)} the same"


def test_the_node_carried_as_a_graph_decodes_as_the_one_made_from_the_model(tiny_checkpoint: Path):
    """The GPU check carries the node's graph to a device without PyTorch (``from_graph``), in fp16 there: the
    graph made beforehand decodes what the model's own node decodes, and its fp16 form keeps the node's inputs
    and outputs while its subgraphs' weights become float16 (the CPU provider has no fp16 BeamSearch to run)."""
    import onnx

    from export.generation_op import build_beam_search

    model, tokenizer = load_checkpoint(tiny_checkpoint)
    graph = build_beam_search(model)
    c = model.config
    carried = BeamSearchOp.from_graph(graph.SerializeToString(), c.pad_id, c.eos_id, "CPUExecutionProvider")
    ids = tokenizer.encode_source(own_sentences(3))
    assert carried.translate_ids(ids, 2, 12) == BeamSearchOp(model, threads=1).translate_ids(ids, 2, 12)
    half = BeamSearchOp.float16(graph)
    assert [(v.name, v.type) for v in half.graph.input] == [(v.name, v.type) for v in graph.graph.input]
    assert [(v.name, v.type) for v in half.graph.output] == [(v.name, v.type) for v in graph.graph.output]
    subgraphs = [a.g for a in half.graph.node[0].attribute if a.type == onnx.AttributeProto.GRAPH]
    weights = [t.data_type for g in subgraphs for t in g.initializer if t.dims and len(t.dims) > 1]
    assert weights and set(weights) == {onnx.TensorProto.FLOAT16}
