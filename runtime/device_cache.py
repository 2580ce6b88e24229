"""The self-attention cache on the step's device for the whole decode (CUDA; tested on the CPU provider): its
buffers are ONNX Runtime values, reordered and grown by one-node graphs run where they live (``CacheOps``), so
the cache never visits the host."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from runtime.caches import KVCache

CACHE_OPS = Path(__file__).resolve().parent / "cache_ops"  # built by export/cache_ops.py


def cache_op_path(op: str, dtype: type) -> Path:
    """A one-node graph over cache buffers (``gather`` or ``pad``) for this dtype."""
    return CACHE_OPS / f"{op}.{np.dtype(dtype).name}.onnx"


@dataclass(frozen=True)
class BufferView:
    """The first rows of a device buffer, bound to the step by address (ONNX Runtime values cannot be sliced)."""

    value: ort.OrtValue
    shape: tuple[int, ...]


class CacheOps:
    """Row gathers, zero-padded copies and row copies in place (``copy_rows``) of cache buffers, run where the
    buffers live (small graphs on the step's execution provider), so a device-resident cache never visits the
    host."""

    def __init__(self, provider: str, device: str, dtype: type) -> None:
        self.provider, self.device, self.dtype = provider, device, dtype
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        graph = lambda op: str(cache_op_path(op, dtype))  # noqa: E731
        self.gather = ort.InferenceSession(graph("gather"), options, providers=[provider])
        self.pad = ort.InferenceSession(graph("pad"), options, providers=[provider])
        self._copy_rows = ort.InferenceSession(graph("copy_rows"), options, providers=[provider])

    def empty(self, shape: tuple[int, ...]) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), self.dtype, self.device, 0)

    def run(self, session: ort.InferenceSession, source: BufferView, index: np.ndarray, target: BufferView) -> None:
        binding = session.io_binding()
        binding.bind_input("x", self.device, 0, self.dtype, list(source.shape), source.value.data_ptr())
        binding.bind_cpu_input(session.get_inputs()[1].name, index)
        binding.bind_output("y", self.device, 0, self.dtype, list(target.shape), target.value.data_ptr())
        session.run_with_iobinding(binding)

    def copy_rows(self, source: ort.OrtValue | np.ndarray, target: ort.OrtValue, rows, targets) -> None:
        """target[targets] = source[rows], each row zero-padded to target's slots (axis 2), in target's own
        buffer; ``source`` may be ``target`` itself (every row is read before any is written) or a host array
        (copied to the device by this run)."""
        shape, into = tuple(source.shape() if isinstance(source, ort.OrtValue) else source.shape), target.shape()
        pads = np.array([0, 0, 0, 0, 0, 0, into[2] - shape[2], 0], np.int64)
        binding = self._copy_rows.io_binding()
        if isinstance(source, ort.OrtValue):
            binding.bind_ortvalue_input("x", source)
        else:
            binding.bind_cpu_input("x", np.ascontiguousarray(source, self.dtype))
        binding.bind_ortvalue_input("target", target)
        binding.bind_cpu_input("rows", np.asarray(rows, np.int64))
        binding.bind_cpu_input("targets", np.asarray(targets, np.int64).reshape(-1, 1))
        binding.bind_cpu_input("pads", pads)
        binding.bind_ortvalue_output("y", target)
        self._copy_rows.run_with_iobinding(binding)


class DeviceKVCache(KVCache):
    """The self-attention cache on the step's device for the whole decode (CUDA; tested on the CPU provider):
    buffers are ONNX Runtime values, bound to the step by address; reordering rows gathers into the spare
    buffers and growing copies with zero padding, both by ``CacheOps`` on the device. Rows are always
    gathered (no in-place moves on a device)."""

    moves_in_place = False

    def __init__(self, layers: int, heads: int, d_cache: int, dtype, ops: CacheOps) -> None:
        self.ops = ops
        super().__init__(layers, heads, d_cache, dtype)

    def _buffer(self, rows: int, capacity: int) -> ort.OrtValue:
        return self.ops.empty((rows, self.heads, capacity, self.d_cache))

    @staticmethod
    def _shape(buffer: ort.OrtValue) -> tuple[int, ...]:
        return tuple(buffer.shape())

    def _copy_live(self, old: ort.OrtValue, new: ort.OrtValue, longest: int) -> None:
        """All rows of old, zero-padded to new's shape (whole rows: padding needs no strides)."""
        shape, target = self._shape(old), self._shape(new)
        if 0 in shape:
            return
        pads = np.array([0, 0, 0, 0, target[0] - shape[0], 0, target[2] - shape[2], 0], np.int64)
        self.ops.run(self.ops.pad, BufferView(old, shape), pads, BufferView(new, target))

    def _gather(self, old: ort.OrtValue, new: ort.OrtValue, rows: np.ndarray, longest: int) -> None:
        _, heads, capacity, d = self._shape(old)
        source = BufferView(old, (self.rows, heads, capacity, d))
        self.ops.run(self.ops.gather, source, rows.astype(np.int64), BufferView(new, (len(rows), heads, capacity, d)))

    def view(self, buffer: ort.OrtValue) -> BufferView:
        _, heads, capacity, d = self._shape(buffer)
        return BufferView(buffer, (self.rows, heads, capacity, d))


def device_cache_for(provider: str, cache_dtype: type, requested: bool | None) -> bool:
    """Whether the self-attention cache lives on the step's device (``RuntimeOptions.device_cache``; None: the
    default). ONNX Runtime's CUDA ``GroupQueryAttention`` has float16 and bfloat16 kernels only, so an fp32 step
    on CUDA runs its self-attention on the CPU and copies the cache across at every step. With the cache bound
    on the device that decoded wrongly (13.7-21.7% of test_2016_flickr identical to the CPU provider, against
    100% with the cache on the host; NVIDIA H200, ONNX Runtime 1.30, benchmarks/gpu_check.md): on CUDA only
    an fp16 cache lives on the device, and asking for an fp32 one there is refused. The CPU provider runs the
    device cache's code for tests."""
    if requested is None:
        return provider == "cuda" and cache_dtype == np.float16
    if requested and provider == "cuda" and cache_dtype != np.float16:
        raise ValueError(
            "device_cache: an fp32 cache cannot live on CUDA (ONNX Runtime's CUDA GroupQueryAttention has no "
            "float32 kernel, so the step's self-attention runs on the CPU): use the fp16 variant, or leave "
            "device_cache unset for a host cache"
        )
    return requested
