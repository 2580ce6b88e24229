"""A model rollout as far as one machine allows: a server restarted from one model folder to another
(a new version of the same model) and back, the served version visible in GetModelInfo, every response
and translate_model_info; a folder that fails its checksum never reaches SERVING."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

import grpc
import pytest

from proto import translate_pb2, translate_pb2_grpc
from testkit.servers import server_command, start_subprocess_server
from tests.conftest import make_tiny_checkpoint


@pytest.fixture(scope="module")
def versions(tiny_export: Path, tmp_path_factory) -> tuple[Path, Path]:
    """Two exported versions of one model (tiny-test, en→de): the same name and languages, new weights."""
    from export.__main__ import main

    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("v2_checkpoint"), 7, {"name": "tiny-test"})
    v2 = tmp_path_factory.mktemp("v2") / "model"
    assert main(["--checkpoint", str(checkpoint), "--out", str(v2)]) == 0
    return tiny_export, v2


def version_of(folder: Path) -> str:
    return json.loads((folder / "manifest.json").read_text())["checkpoint"]["weights_sha256"][:12]


def served(folder: Path) -> tuple[str, str, str]:
    """Start a server on the folder: the version GetModelInfo, a response and the info metric report."""
    process, port, metrics_port = start_subprocess_server(folder)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = translate_pb2_grpc.TranslatorStub(channel)
            info = stub.GetModelInfo(translate_pb2.GetModelInfoRequest(), timeout=20).version
            answer = stub.Translate(translate_pb2.TranslateRequest(texts=["A man is walking."]), timeout=20).model
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        (line,) = [line for line in body.splitlines() if line.startswith("translate_model_info{")]
        metric = line.split('version="')[1].split('"')[0]
    finally:
        process.send_signal(signal.SIGTERM)  # a rolling update drains the old replica
        assert process.wait(30) == 0
    return info, answer.split("@")[1], metric


def test_rolling_to_a_new_version_and_back(versions: tuple[Path, Path]):
    v1, v2 = versions
    assert version_of(v1) != version_of(v2)
    for folder in (v1, v2, v1):  # roll out, then roll back
        assert served(folder) == (version_of(folder),) * 3


def test_a_folder_that_fails_its_checksum_never_serves(versions: tuple[Path, Path], tmp_path: Path):
    broken = tmp_path / "model"
    shutil.copytree(versions[1], broken)
    weights = broken / "decoder.onnx"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")  # one byte changed, same size
    result = subprocess.run(
        server_command(broken),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "decoder.onnx" in result.stderr and "SERVING" not in result.stderr
