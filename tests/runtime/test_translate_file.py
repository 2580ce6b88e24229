"""translate-file: stdin to stdout through an exported folder, without a server or torch."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from runtime import offline
from runtime import translate_file as translate_file_module
from runtime.backend import OrtBackend
from runtime.options import EngineSettings
from runtime.stops import RepetitionGuard
from runtime.translate_file import main, parallelism, runtime_options
from tests.conftest import ROOT, own_sentences

SENTENCES = own_sentences(240)[::17]
LIMIT = 12  # output tokens: the tiny model's random weights rarely stop early


@pytest.fixture(scope="module")
def reference(tiny_export: Path) -> OrtBackend:
    """The model as translate-file loads it."""
    return OrtBackend(tiny_export, runtime_options(EngineSettings(provider="cpu")))


def translate_file(monkeypatch, capsys, lines: list[str], *flags: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{line}\n" for line in lines)))
    code = main(["--provider", "cpu", "--max-output-tokens", str(LIMIT), *flags])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("beam", [1, 2])
def test_translates_line_by_line_in_the_input_order(tiny_export, reference, monkeypatch, capsys, beam: int):
    lines = SENTENCES[:5] + [""] + SENTENCES[5:]
    flags = ["--model", str(tiny_export), "--beam", str(beam), "--batch-size", "4"]
    code, out, err = translate_file(monkeypatch, capsys, lines, *flags)
    assert (code, err) == (0, "")
    expected = offline.translate(
        reference, SENTENCES, beam, batch_size=4, max_output_tokens=LIMIT, stop_rules=(RepetitionGuard(),)
    )
    assert out == "".join(f"{line}\n" for line in expected[:5] + [""] + expected[5:])


def test_workers_translate_batches_at_once_with_the_same_output(tiny_export, monkeypatch, capsys):
    flags = ["--model", str(tiny_export), "--batch-size", "3", "--stats"]
    one_thread = ("--intra-op-threads", "1")
    code, one, err = translate_file(monkeypatch, capsys, SENTENCES, *flags, "--workers", "1", *one_thread)
    tokens = json.loads(err)["output_tokens"]
    code, three, err = translate_file(
        monkeypatch, capsys, SENTENCES, *flags, "--workers", "3", "--intra-op-threads", "1"
    )
    assert code == 0 and three == one and json.loads(err)["output_tokens"] == tokens


@pytest.mark.parametrize(
    ("workers", "threads", "provider", "cores", "chosen"),
    [
        (0, 0, "cpu", 4, (4, 1)),  # a core per worker, one thread each
        (0, 2, "cpu", 4, (2, 2)),
        (2, 0, "cpu", 4, (2, 2)),
        (3, 1, "cpu", 2, (3, 1)),  # as told
        (0, 0, "cpu", 1, (1, 1)),
        (0, 0, "cuda", 16, (1, 0)),  # one worker on the device, ONNX Runtime's threads
    ],
)
def test_parallelism_defaults_to_a_single_threaded_worker_per_core_on_cpu(workers, threads, provider, cores, chosen):
    assert parallelism(workers, threads, provider, cores) == chosen


def test_stats_count_each_output_and_its_eos(tiny_export, reference, monkeypatch, capsys):
    ids = reference.tokenizer.encode_source(SENTENCES)
    by_length = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # one batch, in the order translate-file sorts
    sentences = [SENTENCES[i] for i in by_length]
    code, out, err = translate_file(monkeypatch, capsys, sentences, "--model", str(tiny_export), "--stats")
    assert code == 0 and len(out.splitlines()) == len(sentences)
    [line] = err.splitlines()
    stats = json.loads(line)
    assert set(stats) == {"sentences", "output_tokens", "seconds", "tokens_per_second"}
    outputs = offline.translate_ids(reference, [ids[i] for i in by_length], 1, LIMIT, (RepetitionGuard(),))
    assert stats["sentences"] == len(sentences)
    assert stats["output_tokens"] == sum(len(output) + 1 for output in outputs)
    assert stats["tokens_per_second"] == pytest.approx(stats["output_tokens"] / stats["seconds"], rel=1e-3)


def test_a_folder_that_cannot_be_loaded_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    code, out, err = translate_file(monkeypatch, capsys, SENTENCES[:1], "--model", str(tmp_path / "missing"))
    assert (code, out) == (2, "")
    assert str(tmp_path / "missing") in err and len(err.splitlines()) == 1, err


def test_bad_flags_exit_2_naming_every_one(tiny_export, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit:
        translate_file(
            monkeypatch,
            capsys,
            SENTENCES[:1],
            "--model",
            str(tiny_export),
            "--variant",
            "int4",
            "--provider",
            "tpu",
            "--beam",
            "0",
        )
    err = capsys.readouterr().err
    assert exit.value.code == 2
    for message in (
        "--variant: 'int4': use auto, fp32, int8 or fp16",
        "--provider: 'tpu': use auto, cpu or cuda",
        "--beam, --batch-size and --max-output-tokens must be at least 1",
    ):
        assert message in err, err


def test_does_not_import_torch(tiny_export: Path):
    code = (
        "import io, sys\n"
        "from runtime.translate_file import main\n"
        "sys.stdin = io.StringIO('A man is walking.\\n\\nA cat is sleeping.\\n')\n"
        f"assert main(['--model', {str(tiny_export)!r}, '--provider', 'cpu', '--max-output-tokens', '4']) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3


def test_is_a_console_script():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["translate-file"] == "runtime.translate_file:main"


@pytest.mark.parametrize("beam", [1, 2])
def test_output_equals_the_servers(tiny_export, monkeypatch, capsys, beam: int):
    """Offline and served translations of the same sentences are the same strings (the server's as the model
    wrote them: translate-file mirrors no case or punctuation)."""
    from testkit.servers import RunningServer, server_config

    code, out, _ = translate_file(monkeypatch, capsys, SENTENCES, "--model", str(tiny_export), "--beam", str(beam))
    assert code == 0
    server = RunningServer(server_config(tiny_export, max_output_tokens=LIMIT))
    try:
        served = [t.text for t in server.translate(SENTENCES, beam=beam, mirror_formatting=False).translations]
    finally:
        server.close()
    assert out.splitlines() == served


@pytest.mark.parametrize(
    ("flags", "threads", "layout"),
    [
        (("--workers", "2", "--intra-op-threads", "1"), 1, "compact"),
        (("--workers", "1", "--intra-op-threads", "2", "--batch-layout", "buckets"), 2, "buckets"),
    ],
)
def test_the_thread_count_and_batch_layout_reach_every_session(
    tiny_export, monkeypatch, capsys, flags: tuple[str, ...], threads: int, layout: str
):
    loaded: list[OrtBackend] = []

    class Recorded(OrtBackend):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            loaded.append(self)

    monkeypatch.setattr(translate_file_module, "OrtBackend", Recorded)
    code, _, _ = translate_file(monkeypatch, capsys, SENTENCES[:3], "--model", str(tiny_export), *flags)
    (backend,) = loaded
    sessions = (backend.encoder, backend.decoder, backend.small_encoder, backend.small_decoder)
    assert code == 0 and backend.batch_layout == layout
    assert [session.get_session_options().intra_op_num_threads for session in sessions] == [threads] * 4
