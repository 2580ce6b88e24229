"""``translate-client`` against a server with API keys: the key from --api-key or TRANSLATE_API_KEY goes as the
x-api-key metadata; without one the server's refusal is printed with what to give the client."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from client.client import API_KEY_VARIABLE, main
from server.keys import digest
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
