"""The CPU a figure was measured on: its model and the instruction sets int8 speed and accuracy depend on.

ONNX Runtime's int8 matrix products (MLAS) pick their kernel by these features: with VNNI (``avx512_vnni``,
``avx_vnni``) the u8×s8 products accumulate in 32 bits; without it (AVX2, AVX-512 alone) they use
``VPMADDUBSW``, whose 16-bit pair sums saturate unless the weights keep to 7 bits (export/optimize.py).
Every speed or int8 figure names them, through ``describe_cpu``.
"""

from __future__ import annotations

import math
import os
import platform
from functools import cache
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# The features that decide which int8 and float kernels run, as /proc/cpuinfo names them.
KERNEL_FEATURES = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")
VNNI = ("avx512_vnni", "avx_vnni")


@cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    if not CPUINFO.exists():
        return fields
    for line in CPUINFO.read_text().splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_flags() -> frozenset[str]:
    return frozenset(_cpuinfo().get("flags", "").split())


def kernel_features(flags: frozenset[str] | None = None) -> list[str]:
    """Which of KERNEL_FEATURES the CPU has, in that order."""
    flags = cpu_flags() if flags is None else flags
    return [feature for feature in KERNEL_FEATURES if feature in flags]


def has_vnni(flags: frozenset[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return any(feature in flags for feature in VNNI)


def usable_cores(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may keep busy: those it may run on, fewer where its cgroup (v2) has a CPU quota,
    as a container's CPU limit sets (a quota of 2.5 cores gives 3)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def describe_cpu(cores: int | None = None) -> str:
    """E.g. "AMD EPYC, x86_64, 2 cores, avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 (VNNI)"."""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    features = " ".join(kernel_features()) or "none of " + "/".join(KERNEL_FEATURES[:3])
    return f"{cpu_model()}, {platform.machine()}, {cores} cores, {features} ({'VNNI' if has_vnni() else 'no VNNI'})"


@cache
def int8_products_saturate() -> bool:
    """Whether ONNX Runtime's u8×s8 matrix product here saturates 16-bit pair sums (the AVX2 / AVX-512 kernels
    without VNNI): asked of ONNX Runtime itself with one product whose exact value needs more than 16 bits,
    so it holds under an emulator or a CPU that /proc/cpuinfo misdescribes."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    depth = 64  # exact: 64 × 255 × 127; two products per 16-bit lane cap each pair sum at 32,767
    weights = numpy_helper.from_array(np.full((depth, 8), 127, np.int8), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B"], ["Y"])],
        "saturation_probe",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [4, depth])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, [4, 8])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    product = session.run(None, {"A": np.full((4, depth), 255, np.uint8)})[0]
    return int(product[0, 0]) != depth * 255 * 127
