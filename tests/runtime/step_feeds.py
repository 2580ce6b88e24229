"""A greedy step's feeds for the tests that run a step graph directly (tests/runtime/test_fusions.py,
test_step_graphs.py): rows at given lengths, whole sources, the caches and sources' keys random."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort


def greedy_step_feeds(
    session: ort.InferenceSession, tokens: Sequence[int], lengths: Sequence[int], cache_len: int, src_len: int
) -> dict[str, np.ndarray]:
    """Every input of ``session``'s greedy step: ``tokens`` and ``lengths`` per row, the total length their
    longest + 1, every source token real, and each other input (caches, sources' keys) random, of the axes'
    sizes."""
    rows, rng = len(tokens), np.random.default_rng(0)
    feeds = {
        "tokens": np.array(tokens, np.int64),
        "lengths": np.array(lengths, np.int32),
        "total_length": np.array(max(lengths) + 1, np.int32),
        "src_mask": np.ones((rows, src_len), np.int32),
    }
    sizes = {"rows": rows, "sources": rows, "cache_len": cache_len, "src_len": src_len}
    for value in session.get_inputs():
        if value.name not in feeds:
            shape = [sizes.get(axis, axis) for axis in value.shape]
            feeds[value.name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
    return feeds
