"""``translate-client`` against a server with API keys: the key from --api-key or TRANSLATE_API_KEY goes as the
x-api-key metadata; without one the server's refusal is printed with what to give the client."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import loadtest
from client.channel import target_problem
from client.client import API_KEY_VARIABLE, main
from server.operations.keys import digest
from testkit.servers import RunningServer, server_config

KEY = "k-client-test-1234567890"


@pytest.fixture(scope="module")
def keyed(tiny_export: Path, tmp_path_factory) -> Iterator[RunningServer]:
    """A server that refuses callers without a key."""
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "client", "sha256": digest(KEY)}], "anonymous": None}))
    server = RunningServer(server_config(tiny_export, api_keys=keys, max_output_tokens=8))
    yield server
    server.close()


def run_client(server: RunningServer, monkeypatch, capsys, *flags: str) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO("A man.\n\nA woman.\n"))
    code = main(["--target", f"127.0.0.1:{server.server.port}", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_key_from_the_flag_or_the_environment_translates(keyed: RunningServer, monkeypatch, capsys):
    monkeypatch.delenv(API_KEY_VARIABLE, raising=False)
    code, out, err = run_client(keyed, monkeypatch, capsys, "--api-key", KEY)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3 and lines[0] and not lines[1] and lines[2], (out, err)
    monkeypatch.setenv(API_KEY_VARIABLE, KEY)
    assert run_client(keyed, monkeypatch, capsys)[:2] == (0, out)


def test_without_a_key_the_refusal_says_how_to_give_one(keyed: RunningServer, monkeypatch, capsys):
    monkeypatch.delenv(API_KEY_VARIABLE, raising=False)
    code, out, err = run_client(keyed, monkeypatch, capsys)
    assert (code, out) == (1, "")
    assert err.startswith("error: UNAUTHENTICATED: an API key is required") and "--api-key KEY or" in err, err
    monkeypatch.setenv(API_KEY_VARIABLE, "k-guessed")
    code, out, err = run_client(keyed, monkeypatch, capsys)
    assert code == 1 and err.startswith("error: PERMISSION_DENIED: the API key is not valid"), err
    assert "k-guessed" not in err


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("http://127.0.0.1:50051", "is a URL: give host:port (127.0.0.1:50051)"),
        ("127.0.0.1", "has no port: give host:port, e.g. 127.0.0.1:50051"),
        ("127.0.0.1:99999", "the port must be a number from 1 to 65535"),
        ("127.0.0.1:abc", "the port must be a number from 1 to 65535"),
        (":50051", "has no host"),
        ("::1:50051", "an IPv6 address is written in brackets with its port, e.g. [::1]:50051"),
        ("[::1", "an IPv6 address is written [address]:port"),
        ("ipv4:127.0.0.1:1,127.0.0.1", "has no port"),
    ],
)
def test_a_malformed_target_is_refused_at_once_in_one_line(target: str, says: str, monkeypatch, capsys):
    """gRPC would take each of these and fail only at the deadline ("errors resolving ..."), or quietly reach
    port 443, or another port modulo 65536."""
    monkeypatch.setattr("sys.stdin", io.StringIO("A man.\n"))
    assert main(["--target", target, "--timeout", "60"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"translate-client: --target {target!r}")
    assert says in err
    with pytest.raises(SystemExit):  # the load generator refuses it among its flags' problems
        loadtest.parse_args(["--target", target, "--metrics", ""])
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    "target",
    ["127.0.0.1:50051", "[::1]:50051", "dns:///translator:50051", "unix:/tmp/s", "ipv4:127.0.0.1:1,127.0.0.1:2"],
)
def test_the_targets_a_channel_reaches_pass(target: str):
    assert target_problem(target) is None
    assert target_problem("dns://8.8.8.8/translator.example:443") is None
