"""The step's layout of a batch's rows: which rows are each source's (``row_groups``), which candidates each
source takes (``step_layout``), and where sources go when others leave (``gap_filling_order``)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np


def row_groups(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of sources in order, counts[i] rows for source i, seen as groups of G = max(counts):
    groups (N, G) the row at each position of a source's group (its last row again where it has
    fewer), row_position (R,) each row's position in the flattened (N·G) groups, and
    source_index (R,) each row's source. The decoder step attends to a source's keys once for
    its whole group (the beams of a source are one query block)."""
    width = int(counts.max(initial=1))
    offsets = np.cumsum(counts) - counts
    source_index = np.repeat(np.arange(len(counts)), counts)
    within = np.arange(len(source_index)) - offsets[source_index]
    groups = offsets[:, None] + np.minimum(np.arange(width)[None, :], counts[:, None] - 1)
    return groups.astype(np.int64), (source_index * width + within).astype(np.int64), source_index


@functools.lru_cache(maxsize=256)
def step_layout(counts: tuple[int, ...], wanted: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """For sources with ``counts`` rows each, taking ``wanted`` candidates each: ``row_groups``, then
    ``candidate_bias`` (N, G, K), 0 on each real row's candidates its source takes and -inf elsewhere, and
    ``top_k``, the most any source takes (K). Read-only, so that batches can bind the same arrays: those of up
    to FEW_ROWS rows, and greedy batches of any size, are kept for the shapes that come back (every batch of one
    beam source, a greedy batch of n), where building them costs more than the step's other host work; the
    cache stays under a few MiB."""
    count_array, wanted_array = np.array(counts, np.int64), np.array(wanted, np.int64)
    groups, row_position, source_index = row_groups(count_array)
    k = int(wanted_array.max(initial=1))
    real_row = np.arange(groups.shape[1])[None, :, None] < count_array[:, None, None]
    under_limit = np.arange(k)[None, None, :] < wanted_array[:, None, None]
    candidate_bias = np.where(real_row & under_limit, 0.0, -np.inf)
    for array in (groups, row_position, source_index, candidate_bias):
        array.flags.writeable = False
    return groups, row_position, source_index, candidate_bias, k


def gap_filling_order(kept: Sequence[int]) -> list[int]:
    """A new order for the sources that go on (``kept``: their positions, increasing), as indices into
    ``kept``: those that can keep their position do, and the places of those that left go to sources
    from the end, so a departure moves one source's keys and rows, not every source after it (sources
    of equal row counts, as in a greedy or a beam batch; any order is correct)."""
    count = len(kept)
    stay = [index for index, position in enumerate(kept) if position < count]
    movers = iter(range(len(stay), count))  # those past the new end, in order
    slots = dict(zip((kept[index] for index in stay), stay, strict=True))
    return [slots[slot] if slot in slots else next(movers) for slot in range(count)]
