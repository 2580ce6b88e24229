"""How an engine runs: the settings a user chooses (``EngineSettings``: flags of the server and of
translate-file, nested in their configs) and the options the code chooses besides (``RuntimeOptions``, which
holds the settings). Both are keyword-only and checked when built: a value of the wrong type or an impossible
combination is refused with one ValueError naming every problem."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from common.flags import choice_problems, setting, type_problems
from runtime.manifest import Provider, VariantChoice

BatchLayout = Literal["compact", "buckets"]  # runtime/slotted_rows.py


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """The engine's settings, as the server and translate-file take them (``--variant``, ``--provider``,
    ``--batch-layout``, ``--intra-op-threads``)."""

    variant: VariantChoice = setting(
        "fp32",
        "the exported variant to load: int8 is faster on CPU, fp16 is for CUDA; auto: int8 on the CPU and fp16 on "
        "CUDA where the folder has it, else fp32",
    )
    provider: Provider = setting("auto", "ONNX Runtime's provider (auto: CUDA where available)")
    batch_layout: BatchLayout = setting(
        "compact",
        "how a running batch keeps its rows: compact (packed, its buffers sized to them) or buckets (fixed-capacity "
        "buffers a source joins and leaves without moving others; on CUDA they live on the device and each bucket's "
        "step is a captured CUDA graph, which needs the fp16 variant and the onnx package)",
    )
    intra_op_threads: int = setting(
        0,
        "ONNX Runtime's threads in all (0: one per usable core): the server divides them among its running "
        "batches of a lane size (static: one batch has them all), translate-file among its workers",
    )

    def __post_init__(self) -> None:
        problems = choice_problems(self) + type_problems(self)
        if isinstance(self.intra_op_threads, int) and self.intra_op_threads < 0:
            problems.append(f"intra_op_threads={self.intra_op_threads}: use 0 (one per usable core) or more")
        _refuse("invalid engine settings", problems)


@dataclass(frozen=True, kw_only=True)
class RuntimeOptions:
    """The user's settings, and what each entry point chooses besides."""

    settings: EngineSettings = field(default_factory=EngineSettings)

    # Intra-op threads spin between a run's tasks instead of sleeping, and stop when the run returns
    # (session.force_spinning_stop), so they never steal a core from the numpy work between decoder steps or
    # from the other session. Spinning this way in both sessions against the decoder's alone spinning for
    # good: fp32 batch 32 greedy 1.06x, beam 4 1.04x (2-core x86-64, medians of 7, alternating in one
    # process); a spinning encoder beside a decoder that never stops spinning was 0.95x. The server keeps it
    # off: its lanes share the cores, and a spinning run steals from the other lanes' runs.
    spinning: bool = True
    io_binding: bool | None = None  # None: on for CUDA, off for CPU
    # The self-attention cache on the step's device for the whole decode (DeviceKVCache; implies
    # io_binding). None: on for CUDA with an fp16 variant (device_cache_for says why not fp32); on the CPU
    # provider it runs the same code, for tests.
    device_cache: bool | None = None
    verify_files: bool = True
    # Greedy steps per decoder run (runtime/step_graphs.py): a batch whose sources are all greedy goes to ONNX
    # Runtime and back once per this many tokens. 1: one step per run.
    steps_per_run: int = 1
    # Each bucket's step one captured CUDA graph (runtime/captured.py; batch_layout buckets on a device). None:
    # on for buckets on CUDA. On the CPU provider the same code runs without capture, for tests.
    cuda_graphs: bool | None = None
    # CPU: batches under SMALL_BATCH_ROWS rows run on sessions with this many threads (None: the same ones).
    small_batch_threads: int | None = None
    # ONNX Runtime's CPU arena keeps the largest intermediates a session ever made (an encoder call over a
    # long input) for good, rounded up to powers of two; without it they go back to the allocator (see
    # bound_process_memory). No measurable speed difference (2-core x86-64, int8, batch 1 and 32).
    memory_arena: bool = False
    # Offline decoding (runtime/offline.py) makes a self-attention cache per batch; with this, each takes the
    # buffers of the last one that emptied when they fit (CachePool) instead of fresh pages. The server leaves
    # it off: its batches live on, and an idle cache would be memory its budget does not count.
    reuse_cache_buffers: bool = False

    def __post_init__(self) -> None:
        problems = type_problems(self)
        if isinstance(self.steps_per_run, int) and self.steps_per_run < 1:
            problems.append(f"steps_per_run={self.steps_per_run}: use 1 or more")
        if isinstance(self.small_batch_threads, int) and self.small_batch_threads < 1:
            problems.append(
                f"small_batch_threads={self.small_batch_threads}: use None (the same sessions) or 1 or more"
            )
        if self.device_cache and self.io_binding is False:
            problems.append("device_cache=True keeps the cache on the step's device, which needs io_binding")
        if self.cuda_graphs and self.settings.batch_layout != "buckets":
            problems.append("cuda_graphs=True captures each bucket's step: it needs batch_layout 'buckets'")
        _refuse("invalid runtime options", problems)


def flat_options(**values: object) -> RuntimeOptions:
    """RuntimeOptions from one flat set of names, the settings' among them: for the benchmarks that vary any one
    of them (``batch_layout`` or ``steps_per_run`` alike)."""
    setting_names = {f.name for f in fields(EngineSettings)}
    settings = EngineSettings(**{name: value for name, value in values.items() if name in setting_names})
    return RuntimeOptions(
        settings=settings, **{name: value for name, value in values.items() if name not in setting_names}
    )


def _refuse(what: str, problems: list[str]) -> None:
    if problems:
        raise ValueError(f"{what}: " + "; ".join(problems))
