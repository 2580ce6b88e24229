"""TLS and mutual TLS, with certificates made in the test (openssl)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest

from proto import translate_pb2, translate_pb2_grpc
from tests.server.conftest import RunningServer, server_config


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        cwd=d,
    )
    (d / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
            cwd=d,
        )
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", f"{name}.pem",
                "-days", "1", "-extfile", "san.cnf", cwd=d)  # fmt: skip
    return d


def translate(port: int, credentials: grpc.ChannelCredentials | None) -> str:
    target = f"localhost:{port}"
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
