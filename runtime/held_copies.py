"""Copying one slot of a host cache into another with the interpreter lock held (``copy_slots``).

numpy lets go of the interpreter lock for any copy of more than a few hundred elements, and a thread that let
go of it gets it back only when the thread holding it gives it up. A lane's cache moves are many such copies
(a departed source's keys and values, each row's self-attention keys and values), and beside the event loop and
the other lane each cost a wait: with 32 greedy single-sentence clients on a 2-core AMD EPYC, moving a departed
source's keys took 1,489 µs of wall time for 178 µs of CPU. A slot's first ``length`` positions are one
contiguous run per index of the other axes (per layer and head), which a memoryview's slice assignment copies
with memcpy, lock held: as fast as numpy's copy where neither waits (3.5 against 3.7 µs for a 20-token source
of 3 layers and 4 heads).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import numpy as np

# Above this many contiguous runs, or this many bytes in all, the caller copies with numpy, which lets other threads
# run meanwhile: a run costs ~0.15 µs of Python and 256 KiB ~25 µs of memcpy, so the lock is held for at most
# ~65 µs. A single sentence's slot (20 tokens, 3 layers and 4 heads, float32: 120 KiB for keys and values) is
# under both; a long document's rows and sources go through numpy, whose copy is then worth the wait.
HELD_RUNS = 256
HELD_BYTES = 256 * 1024


@functools.lru_cache(maxsize=64)
def _run_starts(shape: tuple[int, ...], strides: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """Byte offsets, from the slot's start, of the runs a slot along ``axis`` holds: one per index of every axis
    but ``axis`` and the last two."""
    others = [a for a in range(len(shape) - 2) if a != axis]
    return tuple(
        sum(i * strides[a] for a, i in zip(others, index, strict=True))
        for index in itertools.product(*(range(shape[a]) for a in others))
    )


def copy_slots(
    targets: Sequence[np.ndarray],
    sources: Sequence[np.ndarray],
    slots: Sequence[tuple[int, int]],
    axis: int,
    length: int,
) -> bool:
    """``target[.., t, .., :length, :] = source[.., s, .., :length, :]`` for each pair of ``targets`` and
    ``sources`` and each (t, s) of ``slots``, a slot's index on ``axis`` (not one of the last two), the lock held;
    or False, nothing copied, where the copy is over HELD_RUNS or HELD_BYTES or its arrays are not C-contiguous
    arrays of one dtype (the caller then copies with numpy). The targets have one shape, as do the sources, and
    the two match but for ``axis`` and the second-to-last, which needs ``length`` positions in both. No slot copied
    from may be one copied to earlier (a target may be its own source)."""
    shape, from_shape = targets[0].shape, sources[0].shape
    length = min(length, shape[-2], from_shape[-2])  # as numpy's slices do
    if length <= 0 or not slots:
        return True
    strides, from_strides = targets[0].strides, sources[0].strides
    starts = _run_starts(shape, strides, axis)
    run = length * strides[-2]  # bytes: the last axis is contiguous in both
    count = len(slots) * len(starts) * len(targets)
    if count > HELD_RUNS or count * run > HELD_BYTES or targets[0].dtype != sources[0].dtype:
        return False
    if not (targets[0].flags.c_contiguous and sources[0].flags.c_contiguous):
        return False
    from_starts = starts if from_strides == strides else _run_starts(from_shape, from_strides, axis)
    runs = [  # (bytes written, bytes read), made once for every pair of arrays
        (slice(to, to + run), slice(at, at + run))
        for to, at in (
            (to * strides[axis] + start, at * from_strides[axis] + from_start)
            for to, at in slots
            for start, from_start in zip(starts, from_starts, strict=True)
        )
    ]
    for target, source in zip(targets, sources, strict=True):
        into = memoryview(target).cast("B")
        out_of = into if source is target else memoryview(source).cast("B")
        for written, read in runs:
            into[written] = out_of[read]
    return True
