"""A batch's rows in buckets (runtime/slotted_rows.py): it decodes what the compact batch decodes while sources
join, leave and are removed mid-way, with its buffers on the host or on the step's device
(runtime/bucket_buffers.py, run here on the CPU provider as on CUDA), one or several greedy steps per run, and
within a bucket every buffer the step binds keeps its memory and shape, as a captured CUDA step needs
(runtime/captured.py)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from runtime import slotted_rows
from runtime.backend import OrtBackend
from runtime.bucket_buffers import Bucket
from runtime.options import EngineSettings, RuntimeOptions
from runtime.search import default_max_output
from runtime.slotted_rows import SlottedRows
from testkit.arrivals import decode_arriving
from tests.conftest import own_sentences
from tests.runtime.slotted import address, backend, shape

ENGINES = {  # how a bucketed engine runs: its buffers' place, graphs and steps per run
    "host": {},
    "host, 3 steps per run": {"steps_per_run": 3},
    "device": {"io_binding": True},
    "device, graphs": {"io_binding": True, "cuda_graphs": True},
    "device, graphs, 3 steps per run": {"io_binding": True, "cuda_graphs": True, "steps_per_run": 3},
}


def decode(
    engine: OrtBackend, sources: list[list[int]], arrivals: dict[int, list[tuple[int, int]]], removed: dict[int, int]
) -> tuple[dict[int, list[int]], list]:
    """Sources joining at the steps ``arrivals`` says ((source, beam) each), ``removed`` ones dropped at theirs;
    each source's output, and the batch."""
    batch = engine.new_batch()
    decoded = decode_arriving(
        batch,
        arrivals,
        lambda keys: engine.encode_sources([sources[key] for key in keys]),
        lambda key: default_max_output(len(sources[key]), 24),
        removed=removed,
    )
    return {key: hypothesis.tokens for key, hypothesis in decoded.results.items()}, batch


ARRIVALS = {
    0: [(0, 1)],
    1: [(1, 3), (2, 1)],
    3: [(3, 3)],
    4: [(4, 1), (5, 1), (6, 1), (7, 3), (8, 1)],  # past 4 slots: a larger bucket
    9: [(9, 2)],
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("beams", ["mixed", "greedy", "beam"])
def test_buckets_decode_what_a_compact_batch_decodes(tiny_export: Path, beams: str, engine: str):
    sentences = backend(tiny_export, "compact").tokenizer.encode_source(own_sentences(10))
    sources = [ids[: 3 + 2 * i] for i, ids in enumerate(sentences)]  # of different lengths
    beam_of = {"mixed": lambda b: b, "greedy": lambda b: 1, "beam": lambda b: 3}[beams]
    arrivals = {step: [(key, beam_of(b)) for key, b in joining] for step, joining in ARRIVALS.items()}
    removed = {5: 3}
    compact, _ = decode(backend(tiny_export, "compact"), sources, arrivals, removed)
    bucketed, batch = decode(backend(tiny_export, "buckets", **ENGINES[engine]), sources, arrivals, removed)
    assert isinstance(batch.layout, SlottedRows) and batch.layout.buckets_used >= 2  # it grew past its first bucket
    assert set(compact) == set(range(10)) - {3}
    assert bucketed == compact


def test_within_a_bucket_joining_leaving_and_stepping_keep_every_bound_buffer(tiny_export: Path):
    engine = backend(tiny_export, "buckets")
    sources = engine.tokenizer.encode_source(own_sentences(6))
    batch = engine.new_batch()
    batch.add([0, 1, 2], engine.encode_sources(sources[:3]), [2, 2, 1], [40, 40, 30])  # 4 slots
    inputs = batch.step_inputs()
    bound = {name: (address(value), shape(value)) for name, value in inputs.feeds.items()}
    sizes = [batch.layout.bucket, batch.cache_bytes, batch.cross_bytes]
    tracemalloc.start()
    try:
        batch.step()
        batch.add([3], engine.encode_sources(sources[3:4]), [1], [30])  # the fourth slot
        batch.step()
        batch.remove(0)
        batch.add([4], engine.encode_sources(sources[4:5]), [2], [20])  # into the slot 0 left
        for _ in range(3):
            batch.step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert batch.step_inputs() is inputs and batch.layout.buckets_used == 1
    assert {name: (address(value), shape(value)) for name, value in inputs.feeds.items()} == bound
    assert [batch.layout.bucket, batch.cache_bytes, batch.cross_bytes] == sizes
    # Nothing the size of a buffer was made: the encoder's outputs and the step's small arrays at most.
    assert peak < min(value.nbytes for name, value in inputs.feeds.items() if name.startswith("past_"))
    kept = engine.step_bindings._kept[inputs.batch]
    assert list(kept) == [inputs.feeds_key]  # bound once, for every step of the bucket


def test_a_batch_takes_a_larger_bucket_when_sources_do_not_fit_and_a_smaller_one_when_few_are_left(
    tiny_export: Path, monkeypatch
):
    monkeypatch.setattr(slotted_rows, "SHRINK_AFTER", 2)
    engine = backend(tiny_export, "buckets")
    sources = engine.tokenizer.encode_source(own_sentences(9))
    batch = engine.new_batch()
    batch.add(list(range(4)), engine.encode_sources(sources[:4]), [1] * 4, [60] * 4)
    assert batch.layout.bucket == Bucket(sources=4, group=1, src_len=batch.layout.bucket.src_len, cache_len=64)
    batch.add(list(range(4, 9)), engine.encode_sources(sources[4:9]), [1] * 5, [60] * 5)
    assert batch.layout.bucket.sources == 16 and batch.layout.buckets_used == 2
    for key in range(1, 9):
        batch.remove(key)
    batch.step()
    batch.step()
    assert batch.layout.bucket.sources == 2 and batch.layout.buckets_used == 3  # room for twice the one left
    batch.drain()
    assert batch.layout.bucket is None and batch.cache_bytes == 0  # an empty batch holds no buffers


def test_cuda_graphs_need_buckets_on_a_device(tiny_export: Path):
    with pytest.raises(
        ValueError, match="cuda_graphs=True captures each bucket's step: it needs batch_layout 'buckets'"
    ):
        RuntimeOptions(settings=EngineSettings(provider="cpu"), cuda_graphs=True)
    on_host = RuntimeOptions(settings=EngineSettings(provider="cpu", batch_layout="buckets"), cuda_graphs=True)
    with pytest.raises(ValueError, match="needs batch_layout buckets on a device"):
        OrtBackend(tiny_export, on_host)


def test_buckets_on_a_device_without_the_onnx_package_are_refused_at_load(tiny_export: Path, monkeypatch):
    """Their beam reorder's graph is made on first use: without the package, loading says so, not a request."""
    import sys

    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ValueError, match="pip install onnx"):
        backend(tiny_export, "buckets", io_binding=True, cuda_graphs=False)
