"""Replicas that fail and roll without losing a request: three server processes on loopback under
closed-loop load through the callers' service config (round robin, retries of UNAVAILABLE); one replica
is SIGKILLed mid-load and restarted, then every replica is replaced one at a time (SIGTERM, drain, start,
ready). No request may be lost: every one gets its translation in the end."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import grpc

from client.channel import aio_channel
from client.loadtest_report import percentile
from proto import translate_pb2, translate_pb2_grpc
from server.operations.access import ATTEMPT_HEADER
from testkit.faults import REPLICA_FLAGS
from testkit.sentences import own_sentences
from testkit.servers import free_port, start_subprocess_server

CLIENTS = 8


class Load(threading.Thread):
    """Closed-loop clients until stopped; each result is (start, latency, code, the attempt that answered)."""

    def __init__(self, target: str) -> None:
        super().__init__(daemon=True)
        self.target, self.results, self.stopping = target, [], threading.Event()
        self.details: list[str] = []

    def run(self) -> None:
        asyncio.run(self._clients())

    async def _clients(self) -> None:
        async with aio_channel(self.target) as channel:
            stub = translate_pb2_grpc.TranslatorStub(channel)
            sentences = own_sentences(40)

            async def client(k: int) -> None:
                i = k
                while not self.stopping.is_set():
                    request = translate_pb2.TranslateRequest(texts=[sentences[i % len(sentences)]])
                    start = time.monotonic()
                    attempt = None
                    try:
                        call = stub.Translate(request, timeout=30)
                        response = await call
                        code = "OK" if response.translations[0].text else "EMPTY"
                        attempt = dict(await call.trailing_metadata() or ()).get(ATTEMPT_HEADER)
                    except grpc.aio.AioRpcError as error:
                        code = error.code().name
                        self.details.append(f"{code}: {error.details()} {error.debug_error_string()}"[:300])
                    except Exception as error:  # noqa: BLE001 (any failure is a lost request)
                        code = type(error).__name__
                    self.results.append((start, time.monotonic() - start, code, int(attempt or 1)))
                    i += CLIENTS

            await asyncio.gather(*(client(k) for k in range(CLIENTS)))


def test_a_killed_replica_and_a_rolling_restart_lose_nothing(tiny_export: Path, capsys):
    ports = [free_port() for _ in range(3)]
    replicas = [start_subprocess_server(tiny_export, "--port", str(port), *REPLICA_FLAGS)[0] for port in ports]
    load = Load("ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports))
    phases = [("steady", time.monotonic())]
    load.start()
    try:
        time.sleep(2)
        phases.append(("kill and restart one", time.monotonic()))
        replicas[0].send_signal(signal.SIGKILL)
        replicas[0].wait(10)
        time.sleep(1)
        replicas[0] = start_subprocess_server(tiny_export, "--port", str(ports[0]), *REPLICA_FLAGS)[0]
        time.sleep(1)
        phases.append(("rolling restart", time.monotonic()))
        for k, port in enumerate(ports):
            replicas[k].send_signal(signal.SIGTERM)
            assert replicas[k].wait(30) == 0  # drained cleanly
            replicas[k] = start_subprocess_server(tiny_export, "--port", str(port), *REPLICA_FLAGS)[0]
        phases.append(("after", time.monotonic()))
        time.sleep(1)
    finally:
        load.stopping.set()
        load.join(60)
        for replica in replicas:
            replica.terminate()
            replica.wait(30)
    phases.append(("end", time.monotonic()))
    lines = []
    for (name, start), (_, end) in zip(phases, phases[1:], strict=False):
        results = [r for r in load.results if start <= r[0] < end]
        latencies = [latency for _, latency, code, _ in results if code == "OK"]
        lost = sum(code != "OK" for _, _, code, _ in results)
        retried = sum(attempt > 1 for *_, attempt in results)
        p99 = percentile(latencies, 0.99)
        lines.append(f"{name}: {len(results)} requests, retried {retried}, lost {lost}, p99 {p99:.3f} s")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    codes = {code for _, _, code, _ in load.results}
    assert len(load.results) > 100 and codes == {"OK"}, (lines, load.details[:5])
