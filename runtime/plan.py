"""How an engine runs, resolved once (``EnginePlan``): every choice the backend acts on, from the settings, the
provider and variant the sessions took, and what the loaded decoder step says, checked together; ``plan_engine``
refuses an impossible combination with one message naming all of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from runtime.contract import ORT_DTYPES
from runtime.device_cache import device_cache_for
from runtime.options import RuntimeOptions


@dataclass(frozen=True, kw_only=True)
class EnginePlan:
    provider: str  # the sessions' provider: "cpu" or "cuda"
    variant: str  # the variant they loaded
    cache_dtype: type  # the decoder's float type, its caches'
    d_cache: int  # the cache's head size (padded)
    device_cache: bool  # the compact layout's self-attention cache lives on the step's device
    io_binding: bool  # feeds bound as values where the step runs (the CPU provider runs the same path when asked)
    batch_layout: str  # "compact" or "buckets"
    cuda_graphs: bool  # each bucket's step captured as a CUDA graph
    steps_per_run: int  # greedy steps per decoder run

    @property
    def device(self) -> str:
        """Where bound values live."""
        return "cuda" if self.provider == "cuda" else "cpu"

    @property
    def greedy_graph(self) -> bool:
        """Greedy batches run the greedy step graph (runtime/step_graphs.py, ``greedy_step_graph``) at any steps per
        run: a compact batch on the host, where each greedy source's one row is its group."""
        return self.batch_layout == "compact" and not self.io_binding

    @property
    def host_greedy_runs(self) -> bool:
        """Greedy batches on host buffers run a graph of their own: the greedy step's (``greedy_graph``), or a
        slotted batch's several steps per run over the full step's copies."""
        return self.greedy_graph or (self.steps_per_run > 1 and not self.io_binding)

    @property
    def device_buckets(self) -> bool:
        """Buckets whose buffers live where the step runs, their steps run by runtime/captured.py."""
        return self.batch_layout == "buckets" and self.io_binding


def plan_engine(options: RuntimeOptions, provider: str, variant: str, decoder: ort.InferenceSession) -> EnginePlan:
    """The plan for ``options`` on sessions of ``provider`` and ``variant`` (``decoder``: the loaded step)."""
    past = next(i for i in decoder.get_inputs() if i.name == "past_key_0")
    cache_dtype = ORT_DTYPES[past.type]
    device_cache = device_cache_for(provider, cache_dtype, options.device_cache)
    io_binding = (provider == "cuda" if options.io_binding is None else options.io_binding) or device_cache
    layout = options.settings.batch_layout
    device_buckets = layout == "buckets" and io_binding
    problems = []
    if options.cuda_graphs and not device_buckets:
        problems.append("cuda_graphs captures each bucket's step: it needs batch_layout buckets on a device")
    if device_buckets and provider == "cuda" and cache_dtype != np.float16:
        problems.append(
            "batch_layout buckets on CUDA keeps the cache on the device, where ONNX Runtime's "
            "GroupQueryAttention has no float32 kernel: use the fp16 variant"
        )
    if options.steps_per_run > 1 and io_binding and not device_buckets:
        problems.append("steps_per_run > 1 on a device runs in batch_layout buckets only")
    if problems:
        raise ValueError("; ".join(problems))
    graphs = provider == "cuda" if options.cuda_graphs is None else options.cuda_graphs
    return EnginePlan(
        provider=provider,
        variant=variant,
        cache_dtype=cache_dtype,
        d_cache=past.shape[3],
        device_cache=device_cache,
        io_binding=io_binding,
        batch_layout=layout,
        cuda_graphs=device_buckets and graphs,
        steps_per_run=options.steps_per_run,
    )
