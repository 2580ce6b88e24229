"""A decoder step's bindings (runtime/binding.py): where each feed is bound, what is bound again before each run,
and the bindings a session keeps for each batch."""

from __future__ import annotations

import concurrent.futures
import inspect
import weakref
from pathlib import Path

import pytest

from runtime import binding as binding_module
from runtime import offline
from runtime.backend import OrtBackend
from runtime.binding import bind_step
from runtime.options import EngineSettings, RuntimeOptions
from tests.conftest import own_sentences


def test_the_step_binds_a_device_cache_where_it_lives_and_host_feeds_on_the_host(tiny_export: Path, monkeypatch):
    """On CUDA, a device cache's buffers bound as host memory crash the step (ONNX Runtime copies from a device
    address on the host), and host feeds copied to the device once would hide the tokens the host writes between
    steps: the step names its device for the buffers and leaves numpy feeds on the host."""
    bound = []
    signature = inspect.signature(bind_step)

    def spy(*args, **kwargs):
        bound.append(signature.bind(*args, **kwargs).arguments)
        return bind_step(*args, **kwargs)

    monkeypatch.setattr(binding_module, "bind_step", spy)
    runtime = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu"), device_cache=True))
    offline.translate(runtime, ["A man is walking.", "Two dogs play in the snow."], 2)
    assert bound and all(b.get("device") == runtime.device and b.get("feeds_on", "cpu") == "cpu" for b in bound)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_kept_binding_binds_host_feeds_again_before_each_run_on_a_device(tiny_export: Path, device: str):
    """ONNX Runtime copies a host input to another device when it is bound: a binding kept across steps must bind
    the host feeds again before each run there, or the step never sees the tokens written since (on an H200 no
    output matched the CPU's). On the CPU the bound memory is the feed itself, and nothing is bound again."""
    runtime = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu")))
    batch = runtime.new_batch()
    ids = runtime.tokenizer.encode_source(own_sentences(2))
    batch.add([0, 1], runtime.encode_sources(ids), [1, 1], [20, 20])
    feeds = batch.step_inputs().feeds
    bound = bind_step(runtime.decoder, feeds, device)
    again = [name for name, _ in bound.host_inputs]
    assert again == ([] if device == "cpu" else list(feeds))  # here every feed is a host array
    calls = []

    class Recorder:
        def bind_ortvalue_input(self, name, value):
            calls.append(("bind", name))

        def run_with_iobinding(self, binding):
            calls.append(("run",))

    bound.binding = recorder = Recorder()
    bound.run(recorder)
    bound.run(recorder)
    assert calls == [*(("bind", name) for name in again), ("run",)] * 2


def test_batches_decoding_at_once_on_one_model_keep_their_own_bindings(tiny_export: Path):
    """translate-file's workers share one model: two batches stepped in turn (and two threads decoding
    at once) translate as each does alone, and the session keeps each batch's binding, its own, until the batch
    empties (an empty batch holds no buffers, so a server's idle lanes hold no memory)."""
    model = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu", intra_op_threads=1)))
    ids = model.tokenizer.encode_source(own_sentences(16))
    halves = [ids[:8], ids[8:]]
    alone = [offline.hypotheses(model, half, 1, 16) for half in halves]
    batches = []
    for half in halves:
        batch = model.new_batch()
        batch.add(list(range(len(half))), model.encode_sources(half), [1] * len(half), [16] * len(half))
        batches.append(batch)
    results: list[dict] = [{}, {}]
    references = []
    while any(len(batch) for batch in batches):
        for batch, found in zip(batches, results, strict=True):
            if len(batch):
                found.update(batch.step())
        if not references:
            kept = [binding for bound in model.k_steps._kept.values() for binding in bound.values()]  # greedy
            assert len(kept) == 2 and kept[0].binding is not kept[1].binding  # one binding each, their own
            references = [weakref.ref(binding) for binding in kept]
            del kept
    for found, expected in zip(results, alone, strict=True):
        assert [found[i].tokens for i in range(len(expected))] == [h.tokens for h in expected]
    assert all(reference() is None for reference in references)  # gone when their batches emptied
    assert not any(model.k_steps._kept.values())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda half: offline.translate_ids(model, half, 2, 16), halves * 2))
    assert together == [offline.translate_ids(model, half, 2, 16) for half in halves * 2]
