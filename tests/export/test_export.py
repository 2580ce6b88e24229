from __future__ import annotations

import concurrent.futures
import inspect
import json
import os
import shutil
import stat
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from export import __main__ as export_main
from export import pipeline
from export.cache_ops import DTYPES, OPS, build
from export.parity import ParityReport, check_graphs
from model.checkpoint import load_checkpoint
from model.translate import TorchTranslator
from runtime import search as search_module
from runtime.contract import CANDIDATE_OUTPUTS
from runtime.engine import Engine
from runtime.manifest import ModelFolderError, read_manifest
from runtime.search import default_max_output, new_search, pad_sources
from runtime.sessions import OrtModel, ProviderUnavailable, RuntimeOptions, cache_op_path, device_cache_for
from tests.conftest import own_sentences


def test_manifest_describes_the_folder(tiny_export: Path):
    manifest = read_manifest(tiny_export)
    assert set(manifest["variants"]) == {"fp32", "int8", "fp16"}
    assert manifest["variants"]["fp32"]["parity"]["passed"] is True
    assert manifest["variants"]["fp32"]["parity"]["decoder_max_abs_diff"] <= 1e-4
    assert manifest["variants"]["fp32"]["quality"]["greedy_token_agreement_with_pytorch"] == 1.0
    assert {"onnxruntime", "onnx", "torch"} <= set(manifest["versions"])
    decoder_inputs = [i["name"] for i in manifest["graphs"]["decoder"]["inputs"]]
    step = ["tokens", "lengths", "total_length", "groups", "row_position", "src_mask", "top_k"]
    search_head = ["row_scores", "candidate_bias"]
    assert decoder_inputs == step + search_head + [
        f"{part}_{kind}_{i}" for part in ("past", "cross") for i in range(2) for kind in ("key", "value")
    ]
    decoder_outputs = [o["name"] for o in manifest["graphs"]["decoder"]["outputs"]]
    assert decoder_outputs[:6] == ["top_log_probs", "top_ids", "eos_log_probs", *CANDIDATE_OUTPUTS]
    assert set(manifest["files"]) == {p.name for p in tiny_export.iterdir()} - {"manifest.json"}
    assert manifest["export_command"].startswith("python -m export")


def test_the_folder_is_readable_by_other_users(tiny_export: Path):
    """Exported through a private temporary folder, the result still gets a new folder's permissions (the
    image's server runs as another user than the export)."""
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(tiny_export.stat().st_mode) == 0o777 & ~umask
    assert all(stat.S_IMODE(f.stat().st_mode) & 0o444 == 0o444 & ~umask for f in tiny_export.iterdir())


def test_parity_with_rows_of_different_cache_lengths(tiny_checkpoint: Path, tiny_export: Path):
    model, _ = load_checkpoint(tiny_checkpoint)
    sessions = [
        ort.InferenceSession(str(tiny_export / f), providers=["CPUExecutionProvider"])
        for f in ("encoder.onnx", "decoder.onnx")
    ]
    report = check_graphs(model, *sessions)
    assert report.passed, report
    assert report.cases >= 9


@pytest.mark.parametrize("io_binding", [False, True])
@pytest.mark.parametrize("beam", [1, 4])
def test_runtime_decoder_equals_pytorch(
    tiny_checkpoint: Path, tiny_export: Path, beam: int, io_binding: bool, provider: str
):
    model, tokenizer = load_checkpoint(tiny_checkpoint)
    sentences = own_sentences(40)
    runtime = OrtModel(tiny_export, RuntimeOptions(provider=provider, io_binding=io_binding, device_cache=False))
    ids = tokenizer.encode_source(sentences)
    expected = TorchTranslator(model, tokenizer, max_output_tokens=20).translate_ids(ids, beam)
    assert runtime.translate_ids(ids, beam, max_output_tokens=20) == expected


def test_the_step_ranks_each_sources_candidates_as_the_search_does(tiny_export: Path):
    """The step graph's search head against BeamSearch's own ranking of the same step's rows, at every step
    of a batch mixing greedy and beam sizes 2, 3 and 5 (rows per source 1 to 5, groups with repeats): the same
    scores to the bit, origins and tokens; and the translations equal those ranked on the host."""
    runtime = OrtModel(tiny_export, RuntimeOptions(provider="cpu"))
    c = runtime.config
    ids = runtime.tokenizer.encode_source(own_sentences(8))
    beams = [1, 2, 3, 5, 1, 3, 2, 5]
    checked = []

    def translate(rank_in_graph: bool) -> dict[int, list[int]]:
        batch = runtime.new_batch()

        def step(batch):
            outputs = runtime.step(batch)
            offset = 0
            for position, search in enumerate(batch.searches.values()):
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
        src_tokens, src_mask = pad_sources(ids, c.pad_id, c.eos_id)
        limits = [default_max_output(len(s) + 1, 20) for s in ids]
        searches = [new_search(beam, n, c.eos_id, max_repeats=2) for beam, n in zip(beams, limits, strict=True)]
        batch.add(list(range(len(ids))), searches, *runtime.encode(src_tokens, src_mask), src_mask)
        return {key: (h.tokens, h.score) for key, h in batch.drain().items()}

    assert translate(rank_in_graph=True) == translate(rank_in_graph=False)
    assert len(set(checked)) >= 4


@pytest.mark.parametrize("device_cache", [False, True])
@pytest.mark.parametrize("beam", [1, 3])
def test_sources_join_a_running_batch_with_io_binding(tiny_export: Path, beam: int, device_cache: bool, provider: str):
    """The CUDA path (IOBinding, cross keys/values held as device values; with device_cache, the
    self-attention cache too, reordered and grown by graphs on the device), on the CPU provider unless
    ``--provider cuda``: sources joining mid-way get the translations they get alone on the host path."""
    host = OrtModel(tiny_export, RuntimeOptions(provider="cpu"))
    runtime = OrtModel(tiny_export, RuntimeOptions(provider=provider, io_binding=True, device_cache=device_cache))
    c = runtime.config
    ids = runtime.tokenizer.encode_source(own_sentences(6))
    alone = [host.translate_ids([source], beam, max_output_tokens=20)[0] for source in ids]
    batch = runtime.new_batch()
    arrivals = {0: [0, 1], 1: [2], 3: [3, 4], 5: [5]}
    results: dict[int, list[int]] = {}
    step = 0
    while len(batch) or step <= max(arrivals):
        if step in arrivals:
            keys = arrivals[step]
            sources = [ids[k] for k in keys]
            src_tokens, src_mask = pad_sources(sources, c.pad_id, c.eos_id)
            cross_k, cross_v = runtime.encode(src_tokens, src_mask)
            searches = [new_search(beam, default_max_output(len(s) + 1, 20), c.eos_id) for s in sources]
            batch.add(keys, searches, cross_k, cross_v, src_mask)
            assert isinstance(batch.sources.step_inputs()[0][0], ort.OrtValue)
            assert isinstance(batch.cache.keys[0], ort.OrtValue if device_cache else np.ndarray)
        if len(batch):
            results.update(batch.step())
        step += 1
    assert [results[k].tokens for k in range(len(ids))] == alone


def test_the_step_binds_a_device_cache_where_it_lives_and_host_feeds_on_the_host(tiny_export: Path, monkeypatch):
    """On CUDA, a device cache's buffers bound as host memory crash the step (ONNX Runtime copies from a device
    address on the host), and host feeds copied to the device once would hide the tokens the host writes between
    steps: the step names its device for the buffers and leaves numpy feeds on the host."""
    from runtime import sessions

    bound = []
    signature = inspect.signature(sessions.bind_step)

    def spy(*args, **kwargs):
        bound.append(signature.bind(*args, **kwargs).arguments)
        return bind_step(*args, **kwargs)

    bind_step = sessions.bind_step
    monkeypatch.setattr(sessions, "bind_step", spy)
    runtime = OrtModel(tiny_export, RuntimeOptions(provider="cpu", device_cache=True))
    runtime.translate(["A man is walking.", "Two dogs play in the snow."], 2)
    assert bound and all(b.get("device") == runtime.device and b.get("feeds_on", "cpu") == "cpu" for b in bound)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_kept_binding_binds_host_feeds_again_before_each_run_on_a_device(tiny_export: Path, device: str):
    """ONNX Runtime copies a host input to another device when it is bound: a binding kept across steps must bind
    the host feeds again before each run there, or the step never sees the tokens written since (on an H200 no
    output matched the CPU's). On the CPU the bound memory is the feed itself, and nothing is bound again."""
    from runtime.sessions import bind_step

    runtime = OrtModel(tiny_export, RuntimeOptions(provider="cpu"))
    batch = runtime.new_batch()
    ids = runtime.tokenizer.encode_source(own_sentences(2))
    src_tokens, src_mask = pad_sources(ids, runtime.config.pad_id, runtime.config.eos_id)
    searches = [new_search(1, 20, runtime.config.eos_id) for _ in ids]
    batch.add([0, 1], searches, *runtime.encode(src_tokens, src_mask), src_mask)
    bound = bind_step(runtime.decoder, batch.step_feeds(), None, device)
    again = [name for name, _ in bound.host_inputs]
    assert again == ([] if device == "cpu" else list(batch.step_feeds()))  # here every feed is a host array
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


@pytest.mark.parametrize("spinning", [False, True])
def test_spinning_of_intra_op_threads_is_configurable(tiny_export: Path, spinning: bool):
    runtime = OrtModel(tiny_export, RuntimeOptions(provider="cpu", spinning=spinning))
    for session in (runtime.encoder, runtime.decoder):
        options = session.get_session_options()
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == ("1" if spinning else "0")
        # spinning threads stop when a run returns: they never steal a core between runs
        assert options.get_session_config_entry("session.force_spinning_stop") == ("1" if spinning else "0")


def test_fp16_variant_runs_and_stays_close(tiny_export: Path, provider: str):
    parity = read_manifest(tiny_export)["variants"]["fp16"]["parity"]
    assert parity["passed"], parity
    runtime = OrtModel(tiny_export, RuntimeOptions(variant="fp16", provider=provider, device_cache=False))
    assert runtime.cache_dtype == np.float16
    assert len(runtime.translate(["A man is walking."])) == 1
    on_device = OrtModel(tiny_export, RuntimeOptions(variant="fp16", provider=provider, device_cache=True))
    sentences = own_sentences(8)
    for beam in (1, 3):  # the CUDA layout (fp16 cache kept where the step runs) on the CPU provider
        assert on_device.translate(sentences, beam) == runtime.translate(sentences, beam)


def test_modified_file_refuses_to_load(tiny_export: Path, tmp_path: Path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_export, folder)
    with open(folder / "decoder.onnx", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ModelFolderError, match=r"decoder.onnx does not match its sha256"):
        OrtModel(folder)
    shutil.copy(tiny_export / "decoder.onnx", folder / "decoder.onnx")
    (folder / "sentencepiece.model").unlink()
    with pytest.raises(ModelFolderError, match=r"sentencepiece.model is listed in the manifest but missing"):
        read_manifest(folder)


def test_existing_output_needs_force(tiny_checkpoint: Path, tiny_export: Path, capsys):
    assert export_main.main(["--checkpoint", str(tiny_checkpoint), "--out", str(tiny_export)]) == 1
    assert "already exists, use --force to override" in capsys.readouterr().err


def test_failed_parity_writes_nothing(tiny_checkpoint: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(pipeline, "check_graphs", lambda *a, **k: ParityReport(1.0, 1.0, 1, 1e-4))
    out = tmp_path / "model"
    assert export_main.main(["--checkpoint", str(tiny_checkpoint), "--out", str(out)]) == 1
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_check_command_passes_on_an_export(tiny_export: Path):
    result = subprocess.run(
        [sys.executable, "-m", "export.check", "--model", str(tiny_export)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["fp32"]["passed"] is True


def _counted(counts: dict[str, int], name: str, run):
    """``run``, counting its calls in counts[name]."""

    def counting(*args):
        counts[name] += 1
        return run(*args)

    return counting


def test_small_batches_step_on_sessions_of_their_own(tiny_export: Path):
    """A batch of 20 rows steps on the 2-thread sessions until rows finish and fewer than 16 remain, then on
    the 1-thread ones: the switch mid-batch changes no translation."""
    small = OrtModel(tiny_export, RuntimeOptions(provider="cpu", intra_op_threads=2, small_batch_threads=1))
    plain = OrtModel(tiny_export, RuntimeOptions(provider="cpu", intra_op_threads=2))
    threads = [s.get_session_options().intra_op_num_threads for s in (small.small_decoder, small.decoder)]
    assert threads == [1, 2] and plain.small_decoder is plain.decoder
    ids = small.tokenizer.encode_source(own_sentences(20))
    ids = [row[: 1 + i % 6] for i, row in enumerate(ids)]  # output caps of 12 to 22 tokens: rows finish apart
    steps = {"small": 0, "large": 0}

    small.small_decoder.run_with_iobinding = _counted(steps, "small", small.small_decoder.run_with_iobinding)
    small.decoder.run_with_iobinding = _counted(steps, "large", small.decoder.run_with_iobinding)
    for beam in (1, 2):
        assert small.translate_ids(ids, beam, max_output_tokens=20) == plain.translate_ids(ids, beam, 20)
    assert steps["small"] > 0 and steps["large"] > 0


def test_a_narrow_batch_encodes_and_steps_on_the_narrow_sessions(tiny_export: Path):
    """A batch marked narrow (a server lane sharing the cores) runs on the narrow sessions, whatever its rows,
    and translates as on the others; a batch switched back runs on the others again."""
    model = OrtModel(tiny_export, RuntimeOptions(provider="cpu", intra_op_threads=2, narrow_threads=1))
    plain = OrtModel(tiny_export, RuntimeOptions(provider="cpu", intra_op_threads=2))
    threads = lambda s: s.get_session_options().intra_op_num_threads  # noqa: E731
    assert [threads(model.narrow_encoder), threads(model.narrow_decoder), threads(model.decoder)] == [1, 1, 2]
    assert plain.narrow_decoder is plain.decoder
    runs = {"narrow": 0, "wide": 0}

    model.narrow_encoder.run = _counted(runs, "narrow", model.narrow_encoder.run)
    model.narrow_decoder.run_with_iobinding = _counted(runs, "narrow", model.narrow_decoder.run_with_iobinding)
    model.decoder.run_with_iobinding = _counted(runs, "wide", model.decoder.run_with_iobinding)
    ids = model.tokenizer.encode_source(own_sentences(20))
    c = model.config
    src_tokens, src_mask = pad_sources(ids, c.pad_id, c.eos_id)
    outputs = []
    for narrow in (True, False):
        batch = model.new_batch()
        batch.narrow = narrow
        cross_k, cross_v = model.encode(src_tokens, src_mask, narrow)
        searches = [new_search(2, 12, c.eos_id, model.length_penalty, None) for _ in ids]
        batch.add(list(range(len(ids))), searches, cross_k, cross_v, src_mask)
        outputs.append(batch.drain())
        assert runs["narrow" if narrow else "wide"] > 0 and runs["wide" if narrow else "narrow"] == 0
        runs.update(narrow=0, wide=0)
    expected = dict(enumerate(plain.hypotheses(ids, 2, 12)))
    assert [{k: h.tokens for k, h in o.items()} for o in outputs] == [{k: h.tokens for k, h in expected.items()}] * 2


def test_warming_up_runs_the_narrow_sessions_too(tiny_export: Path):
    """A server's longer lane steps on its narrow sessions beside other lanes: warming its engine up runs
    them as well, so that its first such step finds them warm."""
    engine = Engine(tiny_export, RuntimeOptions(provider="cpu", intra_op_threads=2, narrow_threads=1))
    runs = {"encoder": 0, "decoder": 0}

    model = engine.model
    model.narrow_encoder.run = _counted(runs, "encoder", model.narrow_encoder.run)
    model.narrow_decoder.run_with_iobinding = _counted(runs, "decoder", model.narrow_decoder.run_with_iobinding)
    engine.warmup(lengths=(8,), beams=(1, 2))
    assert runs["encoder"] == 1 and runs["decoder"] > 1


def test_batches_decoding_at_once_on_one_model_keep_their_own_bindings(tiny_export: Path):
    """translate-file's workers share one model: two batches stepped in turn (and two threads decoding
    at once) translate as each does alone, and each batch keeps its bindings until it is gone."""
    model = OrtModel(tiny_export, RuntimeOptions(provider="cpu", intra_op_threads=1))
    ids = model.tokenizer.encode_source(own_sentences(16))
    halves = [ids[:8], ids[8:]]
    alone = [model.hypotheses(half, 1, 16) for half in halves]
    batches = []
    for half in halves:
        batch = model.new_batch()
        src_tokens, src_mask = pad_sources(half, model.config.pad_id, model.config.eos_id)
        searches = [new_search(1, 16, model.config.eos_id, model.length_penalty, None) for _ in half]
        batch.add(list(range(len(half))), searches, *model.encode(src_tokens, src_mask), src_mask)
        batches.append(batch)
    results: list[dict] = [{}, {}]
    while any(len(batch) for batch in batches):
        for batch, found in zip(batches, results, strict=True):
            if len(batch):
                found.update(batch.step())
    kept = [binding for batch in batches for bound in batch.step_state.values() for binding in bound.values()]
    assert len(kept) == 2 and kept[0].binding is not kept[1].binding  # one binding each, their own
    for found, expected in zip(results, alone, strict=True):
        assert [found[i].tokens for i in range(len(expected))] == [h.tokens for h in expected]
    references = [weakref.ref(binding) for binding in kept]
    del batches, batch, kept
    assert all(reference() is None for reference in references)  # gone with their batches
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda half: model.translate_ids(half, 2, 16), halves * 2))
    assert together == [model.translate_ids(half, 2, 16) for half in halves * 2]


def test_batches_that_reuse_the_last_caches_buffers_translate_the_same(tiny_export: Path):
    """Offline decoding's cache pool: each batch takes the last one's buffers, slots full of the last
    batch's entries, and translates as with fresh zeroed ones."""
    fresh = OrtModel(tiny_export, RuntimeOptions(provider="cpu", intra_op_threads=1))
    reusing = OrtModel(tiny_export, RuntimeOptions(provider="cpu", intra_op_threads=1, reuse_cache_buffers=True))
    ids = fresh.tokenizer.encode_source(own_sentences(10))
    chunks = [ids[4:], ids[:4], ids[2:5], ids]  # the largest first: the rest fit in its buffers
    taken = []
    original = reusing.cache_pool.take
    reusing.cache_pool.take = lambda rows, capacity: taken.append(original(rows, capacity)) or taken[-1]
    for beam in (1, 3):
        assert [reusing.translate_ids(c, beam, 16) for c in chunks] == [
            fresh.translate_ids(c, beam, 16) for c in chunks
        ]
    assert sum(found is not None for found in taken) >= 4
    assert fresh.cache_pool is None


def test_cache_op_graphs_are_the_ones_the_builder_writes():
    """The shipped one-node graphs (the server cannot build them: no onnx package) are current."""
    for op in OPS:
        for dtype in DTYPES:
            assert cache_op_path(op, dtype).read_bytes() == build(op, dtype), f"run python -m export.cache_ops ({op})"


def test_a_folder_from_an_older_export_says_to_export_again(tiny_export: Path, tmp_path: Path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_export, folder)
    shutil.copy(folder / "encoder.onnx", folder / "decoder.onnx")  # a graph without the step's inputs
    older = r"exported by an older version .* lacks candidate_bias, groups, .*python -m export"
    with pytest.raises(ModelFolderError, match=older):
        OrtModel(folder, RuntimeOptions(provider="cpu", verify_files=False))


def test_graphs_name_the_ir_version_of_their_opset(tiny_export: Path):
    """An onnx newer than the onnxruntime that loads the graphs must not stamp its own latest IR version
    (onnx 1.23 writes 14; onnxruntime-gpu 1.31 reads up to 13 and refused our export on a GPU machine)."""
    import onnx

    from export.builder import IR_VERSION

    graphs = sorted(tiny_export.glob("*.onnx")) + [cache_op_path(op, dtype) for op in OPS for dtype in DTYPES]
    versions = {path.name: onnx.load(str(path), load_external_data=False).ir_version for path in graphs}
    assert len(versions) >= 7 and set(versions.values()) == {IR_VERSION}, versions


def test_a_checkpoints_length_penalty_reaches_the_engine(tiny_checkpoint: Path, tmp_path: Path, monkeypatch):
    """The α a checkpoint was tuned with goes into the manifest; the engine's beam searches are made with
    it and translate as PyTorch does with the same α."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config["decoding"] = {"length_penalty": 2.0}
    (checkpoint / "config.json").write_text(json.dumps(config))
    assert export_main.main(["--checkpoint", str(checkpoint), "--out", str(tmp_path / "model")]) == 0
    assert read_manifest(tmp_path / "model")["decoding"] == {"length_penalty": 2.0}
    runtime = OrtModel(tmp_path / "model", RuntimeOptions(provider="cpu"))
    assert runtime.length_penalty == 2.0
    model, tokenizer = load_checkpoint(checkpoint)
    ids = tokenizer.encode_source(own_sentences(40))
    tuned = TorchTranslator(model, tokenizer, max_output_tokens=20, length_penalty=2.0).translate_ids(ids, 3)
    alphas: list[float] = []
    monkeypatch.setattr(search_module, "new_search", lambda *a: alphas.append(a[3]) or new_search(*a))
    assert runtime.translate_ids(ids, 3, max_output_tokens=20) == tuned
    assert set(alphas) == {2.0}


def test_the_encoder_multiplies_real_tokens_only(tiny_checkpoint: Path):
    """Padding removed: every matrix product runs over the batch's real tokens, and each source's outputs
    at its real tokens are what it gets encoded alone."""
    import onnx

    from export.encoder import build_encoder

    model, _ = load_checkpoint(tiny_checkpoint)
    graph = build_encoder(model)
    products = [node.output[0] for node in graph.graph.node if node.op_type == "MatMul"]
    graph.graph.output.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in products
    )
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    c = model.config
    sources = [[5, 6, 7], list(range(5, 45)), [8]]
    src, mask = pad_sources(sources, c.pad_id, c.eos_id)
    memory, cross_k, _, *outputs = session.run(None, {"src_tokens": src, "src_mask": mask})
    assert src.size == 3 * 41 and {output.shape[0] for output in outputs} == {int(mask.sum())} == {4 + 41 + 2}
    for row, source in enumerate(sources):
        alone, alone_mask = pad_sources([source], c.pad_id, c.eos_id)
        memory_alone, k_alone, _, *_ = session.run(None, {"src_tokens": alone, "src_mask": alone_mask})
        real = int(alone_mask.sum())
        np.testing.assert_allclose(memory[row, :real], memory_alone[0], atol=1e-5)
        np.testing.assert_allclose(cross_k[:, row, :, :real], k_alone[:, 0], atol=1e-5)


def test_only_an_fp16_cache_lives_on_cuda():
    """ONNX Runtime's CUDA GroupQueryAttention has no float32 kernel: an fp32 step on CUDA attends on the CPU, and
    its cache bound on the device decoded wrongly on an H200, so fp32 keeps its cache on the host there."""
    assert device_cache_for("cuda", np.float16, None) is True
    assert device_cache_for("cuda", np.float32, None) is False
    assert device_cache_for("cpu", np.float16, None) is False
    assert device_cache_for("cpu", np.float32, True) is True  # the device cache's code, tested on the CPU
    assert device_cache_for("cuda", np.float16, False) is False
    with pytest.raises(ValueError, match="use the fp16 variant"):
        device_cache_for("cuda", np.float32, True)


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available provider names")
def test_a_provider_onnx_runtime_falls_back_from_is_an_error_not_a_cpu_server(tiny_export: Path, monkeypatch):
    """When the CUDA provider cannot load (onnxruntime-gpu built for another CUDA than the machine's), ONNX
    Runtime falls back to the CPU with a warning: the model refuses to load instead of serving "cuda" on the
    CPU. Here the CPU build stands in, told that it has CUDA."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(ProviderUnavailable, match="could not use CUDAExecutionProvider .* fell back to CPU"):
        OrtModel(tiny_export, RuntimeOptions(provider="cuda"))


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available provider names")
def test_provider_auto_takes_the_cpu_when_cuda_cannot_load(tiny_export: Path, monkeypatch, caplog):
    """``auto`` (the server's default) means CUDA where it can run: a CUDA build whose provider cannot load (a
    CUDA image started without a GPU) serves on the CPU, and says so."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    runtime = OrtModel(tiny_export, RuntimeOptions(provider="auto"))
    assert (runtime.provider, runtime.device, runtime.device_cache) == ("cpu", "cpu", False)
    assert "provider auto: provider 'cuda': ONNX Runtime could not use CUDAExecutionProvider" in caplog.text
    assert len(runtime.translate(["A man is walking."])) == 1
