"""The gRPC API: ``translate.proto`` and the stubs generated from it.

Stubs are generated at build time (``python -m proto``, run by ``make``) and
regenerated here on import when missing or older than the .proto file.
"""

from __future__ import annotations

from pathlib import Path

PROTO = Path(__file__).resolve().parent / "translate.proto"


def generate() -> None:
    """Write translate_pb2.py and translate_pb2_grpc.py next to the .proto file."""
    import grpc_tools
    from grpc_tools import protoc

    root = PROTO.parent.parent
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{root}", f"-I{include}", f"--python_out={root}", f"--grpc_python_out={root}", str(PROTO)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")


def _stale() -> bool:
    stubs = [PROTO.with_name("translate_pb2.py"), PROTO.with_name("translate_pb2_grpc.py")]
    return any(not s.exists() or s.stat().st_mtime < PROTO.stat().st_mtime for s in stubs)


if _stale():
    generate()

from proto import translate_pb2, translate_pb2_grpc  # noqa: E402

__all__ = ["translate_pb2", "translate_pb2_grpc", "generate"]
