"""The backend (runtime/backend.py): an exported folder on ONNX Runtime sessions against PyTorch on the same
weights, its sessions and providers, and the running batch it makes (on the CPU provider, and on CUDA with
``--provider cuda``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from model.checkpoint import load_checkpoint
from model.translate import TorchTranslator
from runtime import offline
from runtime.backend import OrtBackend, chosen_variant
from runtime.batch import StepInputs
from runtime.manifest import ModelFolderError, read_manifest
from runtime.options import EngineSettings, RuntimeOptions
from runtime.providers import ProviderUnavailable
from runtime.search import default_max_output
from runtime.stops import RepetitionGuard
from testkit.arrivals import decode_arriving
from tests.conftest import own_sentences
from tests.runtime.spies import counted


@pytest.mark.parametrize("io_binding", [False, True])
@pytest.mark.parametrize("beam", [1, 4])
def test_runtime_decoder_equals_pytorch(
    tiny_checkpoint: Path, tiny_export: Path, beam: int, io_binding: bool, provider: str
):
    model, tokenizer = load_checkpoint(tiny_checkpoint)
    sentences = own_sentences(40)
    runtime = OrtBackend(
        tiny_export,
        RuntimeOptions(settings=EngineSettings(provider=provider), io_binding=io_binding, device_cache=False),
    )
    ids = tokenizer.encode_source(sentences)
    expected = TorchTranslator(model, tokenizer, max_output_tokens=20).translate_ids(ids, beam)
    assert offline.translate_ids(runtime, ids, beam, max_output_tokens=20) == expected


def test_the_step_ranks_each_sources_candidates_as_the_search_does(tiny_export: Path):
    """The step graph's search head against BeamSearch's own ranking of the same step's rows, at every step
    of a batch mixing greedy and beam sizes 2, 3 and 5 (rows per source 1 to 5, groups with repeats): the same
    scores to the bit, origins and tokens; and the translations equal those ranked on the host."""
    runtime = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu")))
    ids = runtime.tokenizer.encode_source(own_sentences(8))
    beams = [1, 2, 3, 5, 1, 3, 2, 5]
    checked = []

    def translate(rank_in_graph: bool) -> dict[int, list[int]]:
        batch = runtime.new_batch(runtime.decoding((RepetitionGuard(max_repeats=2),)))

        def step(inputs: StepInputs):
            outputs = runtime.step(inputs)
            offset = 0
            for position, search in enumerate(batch.layout.searches.values()):
                rows = slice(offset, offset + search.rows)
                offset += search.rows
                if search.width == 1:
                    continue
                k = search.top_k
                values = (np.asarray(search.scores)[:, None] + outputs[0][rows, :k]).reshape(-1)
                ranked = np.argsort(-values, kind="stable")[:k]
                graph = [output[position, :k] for output in outputs[3:]]
                np.testing.assert_array_equal(graph[0], values[ranked])
                np.testing.assert_array_equal(graph[1], ranked // k)
                np.testing.assert_array_equal(graph[2], outputs[1][rows, :k].reshape(-1)[ranked])
                checked.append(position)
            return outputs if rank_in_graph else outputs[:3]

        batch.step_fn = step
        limits = [default_max_output(len(s), 20) for s in ids]
        batch.add(list(range(len(ids))), runtime.encode_sources(ids), beams, limits)
        return {key: (h.tokens, h.score) for key, h in batch.drain().items()}

    assert translate(rank_in_graph=True) == translate(rank_in_graph=False)
    assert len(set(checked)) >= 4


@pytest.mark.parametrize("device_cache", [False, True])
@pytest.mark.parametrize("beam", [1, 3])
def test_sources_join_a_running_batch_with_io_binding(tiny_export: Path, beam: int, device_cache: bool, provider: str):
    """The CUDA path (IOBinding, cross keys/values held as device values; with device_cache, the
    self-attention cache too, reordered and grown by graphs on the device), on the CPU provider unless
    ``--provider cuda``: sources joining mid-way get the translations they get alone on the host path."""
    host = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu")))
    runtime = OrtBackend(
        tiny_export,
        RuntimeOptions(settings=EngineSettings(provider=provider), io_binding=True, device_cache=device_cache),
    )
    ids = runtime.tokenizer.encode_source(own_sentences(6))
    alone = [offline.translate_ids(host, [source], beam, max_output_tokens=20)[0] for source in ids]
    arrivals = {step: [(key, beam) for key in keys] for step, keys in {0: [0, 1], 1: [2], 3: [3, 4], 5: [5]}.items()}

    def on_the_device(batch) -> None:  # noqa: ANN001
        assert isinstance(batch.layout.sources.step_inputs()[0][0], ort.OrtValue)
        assert isinstance(batch.layout.cache.keys[0], ort.OrtValue if device_cache else np.ndarray)

    decoded = decode_arriving(
        runtime.new_batch(),
        arrivals,
        lambda keys: runtime.encode_sources([ids[key] for key in keys]),
        lambda key: default_max_output(len(ids[key]), 20),
        joined=on_the_device,
    )
    assert decoded.tokens(range(len(ids))) == alone


@pytest.mark.parametrize("spinning", [False, True])
def test_spinning_of_intra_op_threads_is_configurable(tiny_export: Path, spinning: bool):
    runtime = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu"), spinning=spinning))
    for session in (runtime.encoder, runtime.decoder):
        options = session.get_session_options()
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == ("1" if spinning else "0")
        # spinning threads stop when a run returns: they never steal a core between runs
        assert options.get_session_config_entry("session.force_spinning_stop") == ("1" if spinning else "0")


def test_fp16_variant_runs_and_stays_close(tiny_export: Path, provider: str):
    parity = read_manifest(tiny_export)["variants"]["fp16"]["parity"]
    assert parity["passed"], parity
    runtime = OrtBackend(
        tiny_export, RuntimeOptions(settings=EngineSettings(variant="fp16", provider=provider), device_cache=False)
    )
    assert runtime.cache_dtype == np.float16
    assert len(offline.translate(runtime, ["A man is walking."])) == 1
    on_device = OrtBackend(
        tiny_export, RuntimeOptions(settings=EngineSettings(variant="fp16", provider=provider), device_cache=True)
    )
    sentences = own_sentences(8)
    for beam in (1, 3):  # the CUDA layout (fp16 cache kept where the step runs) on the CPU provider
        assert offline.translate(on_device, sentences, beam) == offline.translate(runtime, sentences, beam)


def test_small_batches_step_on_sessions_of_their_own(tiny_export: Path):
    """A batch of 20 rows steps on the 2-thread sessions until rows finish and fewer than 16 remain, then on
    the 1-thread ones, greedy and beam search alike: the switch mid-batch changes no translation."""
    small = OrtBackend(
        tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu", intra_op_threads=2), small_batch_threads=1)
    )
    plain = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu", intra_op_threads=2)))
    sessions = {  # beam search's steps, and greedy batches' runs over the greedy step graph
        "small": small.small_decoder,
        "large": small.decoder,
        "small greedy": small.small_k_steps.session,
        "large greedy": small.k_steps.session,
    }
    threads = [session.get_session_options().intra_op_num_threads for session in sessions.values()]
    assert threads == [1, 2, 1, 2] and plain.small_decoder is plain.decoder and plain.small_k_steps is plain.k_steps
    ids = small.tokenizer.encode_source(own_sentences(20))
    ids = [row[: 1 + i % 6] for i, row in enumerate(ids)]  # output caps of 12 to 22 tokens: rows finish apart
    steps = dict.fromkeys(sessions, 0)
    for name, session in sessions.items():
        session.run_with_iobinding = counted(steps, name, session.run_with_iobinding)
    for beam, sources in ((1, ids), (2, ids), (2, ids[:4])):  # the last: 8 beam rows, under 16 from the start
        assert offline.translate_ids(small, sources, beam, 20) == offline.translate_ids(plain, sources, beam, 20)
    assert all(steps.values()), steps


def test_a_folder_from_an_older_export_says_to_export_again(tiny_export: Path, tmp_path: Path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_export, folder)
    shutil.copy(folder / "encoder.onnx", folder / "decoder.onnx")  # a graph without the step's inputs
    older = r"exported by an older version .* lacks candidate_bias, groups, .*python -m export"
    with pytest.raises(ModelFolderError, match=older):
        OrtBackend(folder, RuntimeOptions(settings=EngineSettings(provider="cpu"), verify_files=False))


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available provider names")
def test_a_provider_onnx_runtime_falls_back_from_is_an_error_not_a_cpu_server(tiny_export: Path, monkeypatch):
    """When the CUDA provider cannot load (onnxruntime-gpu built for another CUDA than the machine's), ONNX
    Runtime falls back to the CPU with a warning: the model refuses to load instead of serving "cuda" on the
    CPU. Here the CPU build stands in, told that it has CUDA."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(ProviderUnavailable, match="could not use CUDAExecutionProvider .* fell back to CPU"):
        OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cuda")))


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available provider names")
def test_provider_auto_takes_the_cpu_when_cuda_cannot_load(tiny_export: Path, monkeypatch, caplog):
    """``auto`` (the server's default) means CUDA where it can run: a CUDA build whose provider cannot load (a
    CUDA image started without a GPU) serves on the CPU, and says so."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    runtime = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="auto")))
    assert (runtime.provider, runtime.device, runtime.device_cache) == ("cpu", "cpu", False)
    assert "provider auto: provider 'cuda': ONNX Runtime could not use CUDAExecutionProvider" in caplog.text
    assert len(offline.translate(runtime, ["A man is walking."])) == 1


@pytest.mark.filterwarnings("ignore:Specified provider .CUDAExecutionProvider. is not in available provider names")
def test_variant_auto_takes_what_the_provider_runs_best_that_the_folder_has(tiny_export: Path, monkeypatch):
    folder = Path("m")
    assert chosen_variant(folder, "auto", {"fp32": {}, "int8": {}, "fp16": {}}, "cpu") == "int8"
    assert chosen_variant(folder, "auto", {"fp32": {}, "int8": {}, "fp16": {}}, "cuda") == "fp16"
    assert chosen_variant(folder, "auto", {"fp32": {}}, "cpu") == chosen_variant(folder, "auto", {"fp32": {}}, "cuda")
    assert chosen_variant(folder, "fp32", {"fp32": {}, "int8": {}}, "cpu") == "fp32"
    with pytest.raises(ModelFolderError, match="m has no 'int8' variant"):
        chosen_variant(folder, "int8", {"fp32": {}}, "cpu")
    assert (
        OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(variant="auto", provider="cpu"))).variant
        == "int8"
    )
    # provider auto whose CUDA cannot load: the CPU's choice, not CUDA's
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    fallen_back = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(variant="auto", provider="auto")))
    assert (fallen_back.provider, fallen_back.variant) == ("cpu", "int8")


def test_batches_that_reuse_the_last_caches_buffers_translate_the_same(tiny_export: Path):
    """Offline decoding's cache pool: each batch takes the last one's buffers, slots full of the last
    batch's entries, and translates as with fresh zeroed ones."""
    fresh = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu", intra_op_threads=1)))
    reusing = OrtBackend(
        tiny_export,
        RuntimeOptions(settings=EngineSettings(provider="cpu", intra_op_threads=1), reuse_cache_buffers=True),
    )
    ids = fresh.tokenizer.encode_source(own_sentences(10))
    batches = [ids[4:], ids[:4], ids[2:5], ids]  # the largest first: the rest fit in its buffers
    taken = []
    original = reusing.cache_pool.take
    reusing.cache_pool.take = lambda rows, capacity: taken.append(original(rows, capacity)) or taken[-1]
    for beam in (1, 3):
        assert [offline.translate_ids(reusing, c, beam, 16) for c in batches] == [
            offline.translate_ids(fresh, c, beam, 16) for c in batches
        ]
    assert sum(found is not None for found in taken) >= 4
    assert fresh.cache_pool is None
