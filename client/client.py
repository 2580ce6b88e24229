"""A command-line client: ``translate-client`` (or ``python -m client.client``) ``[--target HOST:PORT]
[--from LANG] [--to LANG] [--model NAME[@VERSION]] [--beam N] [--max-output-tokens N] [--timeout SECONDS]
[--batch LINES] [--api-key KEY]``.

Reads source lines on stdin and prints one translation per line (a blank line stays blank). On error it
prints the gRPC status code and message and exits non-zero. Where the server has API keys (server/operations/keys.py),
the key goes as the ``x-api-key`` metadata: ``--api-key``, or the TRANSLATE_API_KEY environment variable,
which keeps it out of the shell's history and the process list.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import grpc

from client.channel import channel, target_problem
from proto import translate_pb2, translate_pb2_grpc
from server.operations.keys import KEY_METADATA

API_KEY_VARIABLE = "TRANSLATE_API_KEY"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--target", default="127.0.0.1:50051", help="host:port, or dns:///name:port for every address of a name"
    )
    parser.add_argument(
        "--from", dest="source", default="", help="source language (default: the server's default model)"
    )
    parser.add_argument("--to", dest="target_language", default="", help="target language")
    parser.add_argument("--model", default="", help="a model's name (or name@version) instead of, or with, languages")
    parser.add_argument("--beam", type=int, default=0, help="beam size (0: the server's default)")
    parser.add_argument("--max-output-tokens", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="deadline per request, in seconds")
    parser.add_argument("--batch", type=int, default=32, help="lines per request")
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_VARIABLE, ""),
        help=f"the API key, where the server has keys (default: ${API_KEY_VARIABLE})",
    )
    args = parser.parse_args(argv)
    if problem := target_problem(args.target):
        print(f"translate-client: --target {problem}", file=sys.stderr)
        return 2
    metadata = ((KEY_METADATA, args.api_key),) if args.api_key else ()
    lines = [line.rstrip("\n") for line in sys.stdin]
    options = translate_pb2.TranslateOptions(beam_size=args.beam, max_output_tokens=args.max_output_tokens)
    with channel(args.target) as connection:
        stub = translate_pb2_grpc.TranslatorStub(connection)
        for start in range(0, len(lines), args.batch):
            batch = lines[start : start + args.batch]
            texts = [line for line in batch if line.strip()]  # blank lines stay blank, untranslated
            translations = iter([])
            if texts:
                request = translate_pb2.TranslateRequest(
                    texts=texts,
                    options=options,
                    model=args.model,
                    source_language=args.source,
                    target_language=args.target_language,
                )
                try:
                    translations = iter(stub.Translate(request, timeout=args.timeout, metadata=metadata).translations)
                except grpc.RpcError as error:
                    print(f"error: {error.code().name}: {error.details()}{hint(error.code())}", file=sys.stderr)
                    return 1
            for line in batch:
                print(next(translations).text if line.strip() else "", flush=True)
    return 0


def hint(code: grpc.StatusCode) -> str:
    """What this client can do about a refusal: the server's message speaks of metadata, not of flags."""
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return f" (translate-client: --api-key KEY or {API_KEY_VARIABLE})"
    return ""


if __name__ == "__main__":
    sys.exit(main())
