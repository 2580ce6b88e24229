"""ONNX Runtime's execution providers: which one a request for 'cpu', 'cuda' or 'auto' takes, and a graph's
session on it, made the same way for every graph the engine runs."""

from __future__ import annotations

import onnxruntime as ort

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
# ONNX Runtime fusions that make our graphs slower on the CPU, disabled in every session: fused
# SkipLayerNormalization is 3-4x slower than Add + LayerNormalization (see export/builder.py).
NO_FUSIONS = ["SkipLayerNormFusion"]


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
        raise ProviderUnavailable(
            f"provider {requested!r} is not available in this onnxruntime build (has {available})"
        )
    return requested


def open_session(path: str, provider: str, threads: int, spinning: bool, memory_arena: bool) -> ort.InferenceSession:
    """A graph's session on ``provider`` ('cpu' or 'cuda') with ``threads`` intra-op threads (0: one per core)
    that spin only within a run (``spinning``, see RuntimeOptions); ProviderUnavailable when ONNX Runtime falls
    back to another provider."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", str(int(spinning)))
    options.add_session_config_entry("session.force_spinning_stop", str(int(spinning)))
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = memory_arena
    providers = [PROVIDERS[provider]]
    session = ort.InferenceSession(path, options, providers, disabled_optimizers=NO_FUSIONS)
    if session.get_providers()[0] != providers[0]:  # ONNX Runtime fell back to another provider
        raise ProviderUnavailable(
            f"provider {provider!r}: ONNX Runtime could not use {providers[0]} for {path} and fell "
            f"back to {session.get_providers()[0]}; on CUDA, onnxruntime-gpu must be built for this "
            "machine's CUDA (PyPI's: CUDA 12 up to 1.26, CUDA 13 from 1.27, both with cuDNN 9)"
        )
    return session
