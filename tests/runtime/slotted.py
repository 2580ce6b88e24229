"""An engine on the CPU provider in a given batch layout, and where a bound buffer sits (its address and shape):
what the tests of the bucketed layout and of its captured steps share."""

from __future__ import annotations

from pathlib import Path

from runtime.backend import OrtBackend
from runtime.options import EngineSettings, RuntimeOptions


def backend(folder: Path, layout: str, **extra) -> OrtBackend:
    return OrtBackend(
        folder,
        RuntimeOptions(settings=EngineSettings(provider="cpu", intra_op_threads=1, batch_layout=layout), **extra),
    )


def address(value) -> int:  # noqa: ANN001 (a numpy array or an ONNX Runtime value)
    return value.data_ptr() if hasattr(value, "data_ptr") else value.__array_interface__["data"][0]


def shape(value) -> tuple[int, ...]:  # noqa: ANN001
    return tuple(value.shape() if callable(value.shape) else value.shape)
