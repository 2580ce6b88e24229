"""TLS and mutual TLS, with certificates made in the test (openssl)."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from proto import translate_pb2, translate_pb2_grpc
from testkit.certificates import make_certificates
from testkit.servers import RunningServer, free_port, server_config


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Path:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def translate(port: int, credentials: grpc.ChannelCredentials | None) -> str:
    target = f"127.0.0.1:{port}"
    channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    with channel:
        stub = translate_pb2_grpc.TranslatorStub(channel)
        return (
            stub.Translate(translate_pb2.TranslateRequest(texts=["A man is walking."]), timeout=20).translations[0].text
        )


def test_tls(tiny_export: Path, certificates: Path):
    d = certificates
    server = RunningServer(server_config(tiny_export, tls_cert=d / "server.pem", tls_key=d / "server.key"))
    try:
        assert translate(server.server.port, grpc.ssl_channel_credentials((d / "ca.pem").read_bytes()))
        with pytest.raises(grpc.RpcError) as error:
            translate(server.server.port, None)  # plaintext against a TLS port
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.close()


def test_mutual_tls_requires_a_client_certificate(tiny_export: Path, certificates: Path):
    d = certificates
    config = server_config(tiny_export, tls_cert=d / "server.pem", tls_key=d / "server.key", tls_client_ca=d / "ca.pem")
    server = RunningServer(config)
    try:
        ca = (d / "ca.pem").read_bytes()
        with_cert = grpc.ssl_channel_credentials(ca, (d / "client.key").read_bytes(), (d / "client.pem").read_bytes())
        assert translate(server.server.port, with_cert)
        with pytest.raises(grpc.RpcError) as error:
            translate(server.server.port, grpc.ssl_channel_credentials(ca))
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.close()


def test_tls_settings_are_checked():
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        server_config(Path("x"), tls_cert=Path("a.pem"))
    with pytest.raises(ValueError, match="mutual TLS"):
        server_config(Path("x"), tls_client_ca=Path("ca.pem"))


def https_translate(port: int, ca: Path) -> str:
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/translate",
        data=b'{"q": "A man.", "source": "en", "target": "de"}',
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=20, context=context) as response:
        return response.read().decode()


def test_certificates_reload_without_a_restart(tiny_export: Path, certificates: Path, tmp_path: Path):
    """New files (from another CA) reach new connections of both front ends; the server never restarts."""
    served = tmp_path / "served"
    served.mkdir()
    for name in ("server.pem", "server.key"):
        shutil.copy(certificates / name, served / name)
    config = server_config(
        tiny_export, tls_cert=served / "server.pem", tls_key=served / "server.key", http_port=free_port()
    )
    server = RunningServer(config)
    try:
        port, http_port = server.server.port, server.server.http_port
        old_ca, new = certificates / "ca.pem", make_certificates(tmp_path / "rotated")
        assert translate(port, grpc.ssl_channel_credentials(old_ca.read_bytes()))
        assert "translatedText" in https_translate(http_port, old_ca)
        for name in ("server.pem", "server.key"):
            shutil.copy(new / name, served / name)
            os.utime(served / name, ns=(10**18, 10**18))  # a changed stamp, however fast the copy
        assert translate(port, grpc.ssl_channel_credentials((new / "ca.pem").read_bytes()))
        with pytest.raises(grpc.RpcError):
            translate(port, grpc.ssl_channel_credentials(old_ca.read_bytes()))
        assert server.server.certificates.reload_http()  # what the server's periodic check does
        assert "translatedText" in https_translate(http_port, new / "ca.pem")
        with pytest.raises(urllib.error.URLError):
            https_translate(http_port, old_ca)
    finally:
        server.close()


HEALTHCHECK = Path(__file__).resolve().parents[3] / "deploy" / "docker" / "healthcheck.py"


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
def test_the_container_health_check_speaks_tls(tiny_export: Path, certificates: Path, mutual: bool):
    d = certificates
    client_ca = {"tls_client_ca": d / "ca.pem"} if mutual else {}
    server = RunningServer(server_config(tiny_export, tls_cert=d / "server.pem", tls_key=d / "server.key", **client_ca))
    try:
        environment = {
            **os.environ,
            "PYTHONPATH": str(HEALTHCHECK.parents[3]),
            "TRANSLATE_PORT": str(server.server.port),
            "TRANSLATE_TLS_CERT": str(d / "server.pem"),
            "TRANSLATE_TLS_KEY": str(d / "server.key"),
            "TRANSLATE_HEALTHCHECK_CA": str(d / "ca.pem"),
        }
        if mutual:
            environment |= {
                "TRANSLATE_TLS_CLIENT_CA": str(d / "ca.pem"),
                "TRANSLATE_HEALTHCHECK_CERT": str(d / "client.pem"),
                "TRANSLATE_HEALTHCHECK_KEY": str(d / "client.key"),
            }
        check = lambda env: subprocess.run(
            [sys.executable, str(HEALTHCHECK)], env=env, capture_output=True, text=True, timeout=60
        )  # noqa: E731
        result = check(environment)
        assert result.returncode == 0 and result.stdout.strip() == "translation.v1.Translator: SERVING", result.stderr
        plaintext = {k: v for k, v in environment.items() if not k.startswith("TRANSLATE_TLS")}
        assert check(plaintext).returncode == 1  # a plaintext check against the TLS port fails
    finally:
        server.close()


@pytest.mark.parametrize("api", ["grpc", "http"])
def test_the_load_generator_speaks_mutual_tls(tiny_export: Path, certificates: Path, tmp_path: Path, api: str):
    from client import loadtest

    d = certificates
    config = server_config(
        tiny_export,
        tls_cert=d / "server.pem",
        tls_key=d / "server.key",
        tls_client_ca=d / "ca.pem",
        http_port=free_port(),
    )
    server = RunningServer(config)
    try:
        port = server.server.port if api == "grpc" else server.server.http_port
        args = [
            "--api",
            api,
            "--target",
            f"127.0.0.1:{port}",
            "--metrics",
            "",
            "--requests",
            "6",
            "--tokenizer",
            str(tiny_export / "sentencepiece.model"),
            "--out",
            str(tmp_path / api),
            "--tls-ca",
            str(d / "ca.pem"),
            "--tls-cert",
            str(d / "client.pem"),
            "--tls-key",
            str(d / "client.key"),
        ]
        assert loadtest.main(args) == 0
        report = json.loads((tmp_path / api / "report.json").read_text())
        assert report["runs"][0]["codes"] == {"OK": 6}
        assert loadtest.main(args[:-4] + ["--out", str(tmp_path / "no-client-cert")]) == 0
        refused = json.loads((tmp_path / "no-client-cert" / "report.json").read_text())["runs"][0]["codes"]
        assert "OK" not in refused  # mutual TLS: without a client certificate nothing gets through
    finally:
        server.close()
