"""ONNX Runtime's execution providers: which one a request for 'cpu', 'cuda' or 'auto' takes, and a graph's
session on it, made the same way for every graph the engine runs."""

from __future__ import annotations

import re
import shutil
import subprocess

import onnxruntime as ort

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
# PyPI's onnxruntime-gpu is built for CUDA 12 and cuDNN 9 up to 1.26 and for CUDA 13 from this release on (the
# wheels' nvidia-cuda-runtime requirement; the Dockerfile's CUDA image pins below it).
FIRST_CUDA_13_ONNXRUNTIME = "1.27"
DRIVER_CUDA = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")  # nvidia-smi's header: the newest CUDA the driver runs
# ONNX Runtime fusions that make our graphs slower on the CPU, disabled in CPU sessions: fused
# SkipLayerNormalization was 3-4x slower than Add + LayerNormalization (see export/builder.py), and with ONNX
# Runtime 1.32 is still no faster (0.97-1.00x, fp32 greedy at batch 1 and 32, 2-core AMD EPYC, 2026-11-28). On
# CUDA they stay on: the fused step runs 18 fewer kernels and is 10-14% faster (NVIDIA H200, fp16, captured,
# 1 to 128 rows: benchmarks/gpu_check.md, 2026-11-28).
# Written into the CPU's greedy step (runtime/fusions.py, the same nodes) a run takes 0.93-0.97x the time in fp32
# and 0.98-1.08x in int8, but end to end batch-1 greedy shows no gain (benchmarks/skip_layer_norm.md): only the
# device greedy step has it written in.
NO_FUSIONS = ["SkipLayerNormFusion"]
FUSIONS_OFF = {"cpu"}  # the providers whose sessions turn NO_FUSIONS off


def disabled_optimizers(provider: str) -> list[str]:
    """The fusions a session on ``provider`` ('cpu' or 'cuda') turns off."""
    return NO_FUSIONS if provider in FUSIONS_OFF else []


class ProviderUnavailable(ValueError):
    """The execution provider asked for cannot run here: this onnxruntime build lacks it, or it could not load
    (ONNX Runtime would otherwise fall back to the CPU without a word)."""


def resolve_provider(requested: str) -> str:
    """'cpu', 'cuda' or 'auto' (CUDA when this onnxruntime build can use it, else CPU)."""
    available = ort.get_available_providers()
    if requested == "auto":
        return "cuda" if PROVIDERS["cuda"] in available else "cpu"
    if requested not in PROVIDERS:
        raise ValueError(f"provider {requested!r}: use cpu, cuda or auto")
    if PROVIDERS[requested] not in available:
        fix = f"; {install_cuda_build()}" if requested == "cuda" else ""
        raise ProviderUnavailable(
            f"provider {requested!r} is not available in this onnxruntime build (has {available}){fix}"
        )
    return requested


def driver_cuda_version() -> tuple[int, int] | None:
    """The newest CUDA version this machine's NVIDIA driver supports, as nvidia-smi reports it; None without
    nvidia-smi or when it reports none (no GPU, no driver loaded)."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return None
    try:
        report = subprocess.run([nvidia_smi], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = DRIVER_CUDA.search(report)
    return (int(found[1]), int(found[2])) if found else None


def onnxruntime_gpu_for_this_machine() -> tuple[str | None, str]:
    """(the onnxruntime-gpu requirement for this machine's CUDA, or None where nvidia-smi cannot tell; why)."""
    cuda_12, cuda_13 = f"onnxruntime-gpu<{FIRST_CUDA_13_ONNXRUNTIME}", f"onnxruntime-gpu>={FIRST_CUDA_13_ONNXRUNTIME}"
    cuda = driver_cuda_version()
    if cuda is None:
        return None, (
            f"choose by the CUDA version nvidia-smi shows on the GPU machine (none found here): '{cuda_12}' for "
            f"CUDA 12, '{cuda_13}' for CUDA 13 or later"
        )
    version = f"this machine's NVIDIA driver supports CUDA {cuda[0]}.{cuda[1]} (nvidia-smi)"
    if cuda[0] < 12:
        return None, f"{version}; PyPI's onnxruntime-gpu needs CUDA 12 or later: update the driver"
    return (cuda_12 if cuda[0] == 12 else cuda_13), version


def install_cuda_build() -> str:
    """What to run where this onnxruntime is the CPU build and CUDA was asked for."""
    requirement, why = onnxruntime_gpu_for_this_machine()
    if requirement is None:
        return f"install onnxruntime-gpu in place of onnxruntime: {why}"
    return f"{why}: pip uninstall -y onnxruntime && pip install '{requirement}'"


def reinstall_cuda_build() -> str:
    """What to run where the installed onnxruntime-gpu could not load its CUDA provider (built for another CUDA)."""
    requirement, why = onnxruntime_gpu_for_this_machine()
    return why if requirement is None else f"{why}: pip install '{requirement}'"


def open_session(
    path: str | bytes,
    provider: str,
    threads: int,
    spinning: bool,
    memory_arena: bool,
    provider_options: dict[str, str] | None = None,
) -> ort.InferenceSession:
    """A graph's session (a file, or a serialized model) on ``provider`` ('cpu' or 'cuda') with ``threads``
    intra-op threads (0: one per core) that spin only within a run (``spinning``, see RuntimeOptions) and the
    provider's ``provider_options``; ProviderUnavailable when ONNX Runtime falls back to another provider."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", str(int(spinning)))
    options.add_session_config_entry("session.force_spinning_stop", str(int(spinning)))
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = memory_arena
    providers = [PROVIDERS[provider]]
    chosen = [(providers[0], provider_options)] if provider_options else providers
    session = ort.InferenceSession(path, options, chosen, disabled_optimizers=disabled_optimizers(provider))
    if session.get_providers()[0] != providers[0]:  # ONNX Runtime fell back to another provider
        raise ProviderUnavailable(
            f"provider {provider!r}: ONNX Runtime could not use {providers[0]} for "
            f"{path if isinstance(path, str) else 'a graph'} and fell "
            f"back to {session.get_providers()[0]}; on CUDA, onnxruntime-gpu must be built for this "
            f"machine's CUDA, with cuDNN 9: {reinstall_cuda_build()}"
        )
    return session
