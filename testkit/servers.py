"""Servers to test and measure: in-process on its own event loop thread (``RunningServer``, tests talk to it
with sync stubs and ``http``) or ``python -m server`` as a process (``start_subprocess_server``)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path

import grpc

from common import flags
from proto import translate_pb2, translate_pb2_grpc
from runtime.options import EngineSettings
from server.app import Server, create_server
from server.config import ServerConfig

# The status codes Translate documents: whatever it is sent, it answers with one of these.
# NOT_FOUND: a glossary_id the caller has not stored (server/documents/glossaries.py)
DOCUMENTED_CODES = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
}


class RunningServer:
    """The aio server on its own event loop thread; tests talk to it with sync stubs."""

    def __init__(self, config: ServerConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: Server = self.call(self._create(config))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.server.port}")
        self.stub = translate_pb2_grpc.TranslatorStub(self.channel)

    async def _create(self, config: ServerConfig) -> Server:
        server = create_server(config)
        await server.start()
        return server

    def call(self, coroutine, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def translate(
        self, texts: list[str], beam: int = 0, alternatives: int = 0, mirror_formatting: bool = True, **kwargs
    ) -> translate_pb2.TranslateResponse:
        """Translate over gRPC; ``mirror_formatting=False``: as the model wrote it (a decoder's output)."""
        options = translate_pb2.TranslateOptions(
            beam_size=beam, alternatives=alternatives, mirror_formatting=mirror_formatting
        )
        return self.stub.Translate(translate_pb2.TranslateRequest(texts=texts, options=options), **kwargs)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The sum of the samples named ``name`` whose labels include ``labels`` (None when there are none)."""
        wanted = (labels or {}).items()
        values = [
            sample.value
            for family in self.server.metrics.registry.collect()
            for sample in family.samples
            if sample.name == name and wanted <= sample.labels.items()
        ]
        return sum(values) if values else None

    def count(self, name: str, labels: dict[str, str] | None = None) -> float:
        """``metric``, 0 where there is no sample yet: a counter read before and after, to assert what a test
        added to it on a server other tests use too."""
        return self.metric(name, labels) or 0.0

    def wait_for_metric(self, name: str, value: float, timeout: float = 5.0) -> float | None:
        """The metric once it equals value (gauges update right after the answer goes out)."""
        deadline = time.monotonic() + timeout
        while self.metric(name) != value and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.metric(name)

    def close(self) -> None:
        self.channel.close()
        self.call(self.server.drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def server_config(model: Path | tuple[Path, ...], **overrides) -> ServerConfig:
    """A server's config for tests: on the CPU in fp32, greedy by default, on free ports, not warmed up, without
    the translation cache; ``overrides`` by the settings' flag names, wherever they nest (``max_batch_size``,
    ``provider``)."""
    base = ServerConfig(
        model=model,
        engine=EngineSettings(provider="cpu"),  # fp32: tests compare with references of the fp32 weights
        default_beam_size=1,  # greedy, as the references are, unless a test asks for a beam
        port=0,
        metrics_port=0,
        http_port=0,
        warmup=False,
        grace_seconds=0.0,  # closed by its test with nothing in flight (tests/server/test_lifecycle.py drains)
        cache_mib=0,  # the engine answers every sentence (tests/server/test_cache.py turns the cache on)
        # An in-process server's event loop shares the interpreter with the test's own threads: its lag is theirs
        # too, so it sheds nothing (tests/server/doors/test_door.py tests the shedding).
        max_loop_lag_ms=0.0,
    )
    return flags.replace(base, **overrides)


def start_server(model: Path, **overrides) -> RunningServer:
    """An in-process server on a free HTTP port, quick to batch and with short outputs, unless ``overrides``
    say otherwise."""
    config = server_config(model, http_port=free_port(), max_batch_delay_ms=5.0, max_output_tokens=16)
    return RunningServer(flags.replace(config, **overrides))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(server: RunningServer, path: str, body: object = None, form: dict | None = None, method: str | None = None):
    """(status, headers, parsed JSON body) of one request to the server's HTTP API."""
    url = f"http://127.0.0.1:{server.server.http_port}{path}"
    data, headers = None, {}
    if form is not None:
        data = urllib.parse.urlencode(form, doseq=True).encode()
    elif body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.headers, json.loads(error.read())


def upload(site: RunningServer, name: str, data: bytes, **fields: str) -> tuple[int, dict]:
    """POST /translate_file as a multipart form, as LibreTranslate's clients send it."""
    boundary = uuid.uuid4().hex
    values = {"source": "en", "target": "de", **fields}
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in values.items()
    ]
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n\r\n'.encode()
    body = b"".join(parts) + head + data + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{site.server.http_port}/translate_file",
        data=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def server_command(model: Path) -> list[str]:
    """``python -m server`` for this folder, every port chosen by the system, its listeners open for a second
    after SIGTERM (the tests that drain say how long)."""
    return [
        sys.executable,
        "-m",
        "server",
        "--model",
        str(model),
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--http-port",
        "0",
        "--grace-seconds",
        "1",
    ]


def start_subprocess_server(
    model: Path, *flags: str, cwd: Path | None = None, wrapper: Sequence[str] = (), start_timeout_s: float = 60
) -> tuple[subprocess.Popen, int, int]:
    """``python -m server`` on free ports; ``cwd``: the checkout whose server runs (default this one);
    ``wrapper``: a command that runs it (e.g. ``ip netns exec NAME``); ``start_timeout_s``: how long it may take
    to serve (longer where it exports the default models first)."""
    cmd = [*wrapper, *server_command(model), "--host", "127.0.0.1", "--provider", "cpu", "--cache-mib", "0", *flags]
    process = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=cwd)
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        match = re.search(r"gRPC on \S+:(\d+), HTTP API on .*, metrics on \S+:(\d+)", line)
        if match:  # from here on stderr (access-log lines) is drained, so a full pipe never blocks the server
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return process, int(match.group(1)), int(match.group(2))
        if process.poll() is not None:
            break
    process.kill()
    raise AssertionError("server did not start")
