"""A translation.v1 server without a model: every Translate is answered with its own texts after a fixed
delay. Under the same closed-loop clients and delay as the real server, its CPU per request is what serving
gRPC from Python costs at that rate, with nothing of ours in it (benchmarks/service_overhead.py's floor).
``--sync-threads N`` serves it with grpcio's synchronous server on a pool of N threads instead of grpc.aio's (the
server's), each request holding a thread for the delay.

    python benchmarks/grpc_floor.py --delay-s 0.13    # prints "on port N" on stderr once it listens
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from concurrent import futures

import grpc

from proto import translate_pb2, translate_pb2_grpc


def echoed(request: translate_pb2.TranslateRequest) -> translate_pb2.TranslateResponse:
    """Each text translated as itself."""
    translations = [translate_pb2.Translation(text=text, segments=1) for text in request.texts]
    return translate_pb2.TranslateResponse(translations=translations, model="floor@0")


class Echo(translate_pb2_grpc.TranslatorServicer):
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def Translate(self, request, context):  # noqa: N802 (gRPC's method names)
        await asyncio.sleep(self.delay_s)
        return echoed(request)


class SyncEcho(translate_pb2_grpc.TranslatorServicer):
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def Translate(self, request, context):  # noqa: N802 (gRPC's method names)
        time.sleep(self.delay_s)
        return echoed(request)


async def serve(delay_s: float) -> None:
    server = grpc.aio.server()
    translate_pb2_grpc.add_TranslatorServicer_to_server(Echo(delay_s), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"on port {port}", file=sys.stderr, flush=True)
    await server.wait_for_termination()


def serve_sync(delay_s: float, threads: int) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
    translate_pb2_grpc.add_TranslatorServicer_to_server(SyncEcho(delay_s), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"on port {port}", file=sys.stderr, flush=True)
    server.wait_for_termination()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-s", type=float, default=0.0, help="how long each Translate takes to answer")
    parser.add_argument("--sync-threads", type=int, default=0, help="grpcio's synchronous server on this many threads")
    args = parser.parse_args(argv)
    if args.sync_threads:
        serve_sync(args.delay_s, args.sync_threads)
    else:
        asyncio.run(serve(args.delay_s))


if __name__ == "__main__":
    main()
