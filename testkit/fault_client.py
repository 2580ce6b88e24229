"""The fault tests' client, a process of its own (run inside the client's network namespace): closed-loop
Translate calls through the callers' service config (client/channel.py) until SIGTERM, then a JSON report of
every call (start, latency, code, the attempt that answered) and, every SAMPLE_SECONDS, the calls each
replica's subchannel had started (from channelz), so a test sees when a replica stopped receiving calls.

    python -m testkit.fault_client --target ipv4:10.231.0.11:50051,... --out calls.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path

import grpc
from grpc_channelz.v1 import channelz_pb2
from grpc_channelz.v1.channelz import ChannelzServicer

from client.channel import aio_channel
from proto import translate_pb2, translate_pb2_grpc
from server.operations.access import ATTEMPT_HEADER
from testkit.sentences import own_sentences

SAMPLE_SECONDS = 0.1


def calls_started() -> dict[str, int]:
    """Calls started per subchannel address (ipv4:host:port), over every channel of this process."""
    started: dict[str, int] = {}
    top = ChannelzServicer.GetTopChannels(channelz_pb2.GetTopChannelsRequest(), None)
    for channel in top.channel:
        for ref in channel.subchannel_ref:
            request = channelz_pb2.GetSubchannelRequest(subchannel_id=ref.subchannel_id)
            subchannel = ChannelzServicer.GetSubchannel(request, None).subchannel
            target = subchannel.data.target
            started[target] = started.get(target, 0) + subchannel.data.calls_started
    return started


async def run(target: str, clients: int, deadline: float) -> dict:
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    calls: list[tuple[float, float, str, int]] = []
    samples: list[tuple[float, dict[str, int]]] = []
    sentences = own_sentences(40)
    async with aio_channel(target) as channel:
        stub = translate_pb2_grpc.TranslatorStub(channel)

        async def client(k: int) -> None:
            for i in range(k, 10**9, clients):
                if stopping.is_set():
                    return
                start, attempt = time.monotonic(), 1
                try:
                    call = stub.Translate(translate_pb2.TranslateRequest(texts=[sentences[i % 40]]), timeout=deadline)
                    response = await call
                    code = "OK" if response.translations[0].text else "EMPTY"
                    attempt = int(dict(await call.trailing_metadata() or ()).get(ATTEMPT_HEADER, 1))
                except grpc.aio.AioRpcError as error:
                    code = error.code().name
                calls.append((start, time.monotonic() - start, code, attempt))

        async def sample() -> None:
            while not stopping.is_set():
                samples.append((time.monotonic(), calls_started()))
                await asyncio.sleep(SAMPLE_SECONDS)

        await asyncio.gather(sample(), *(client(k) for k in range(clients)))
    return {"calls": calls, "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--deadline", type=float, default=60.0, help="each call's deadline in seconds")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report = asyncio.run(run(args.target, args.clients, args.deadline))
    args.out.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
