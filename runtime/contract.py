"""The decoder step graph's inputs and outputs: one table that the graph's builder (export/decoder_step.py)
declares its tensors from, and that the engine binds and checks a loaded graph against.

Shapes name their axes: ``rows`` (R, hypotheses being decoded), ``sources`` (N, a source's rows are its beams),
``group`` (G, the most rows any source has), ``k`` (K, candidates per row and per source), ``src_len`` (S),
``cache_len`` (T, slots of the self-attention cache), ``heads`` and ``d_cache`` (the cache's head size, padded
to a multiple of 8), ``d_head``. A dtype of None is the model's float type (float32, or float16).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: type | None  # None: the model's float type
    shape: tuple[str | int, ...]
    meaning: str


STEP_FEEDS = (
    Tensor("tokens", np.int64, ("rows",), "each row's last token"),
    Tensor("lengths", np.int32, ("rows",), "tokens cached per row: its position, and its self-attention mask"),
    Tensor("total_length", np.int32, (), "max(lengths) + 1"),
    Tensor("groups", np.int64, ("sources", "group"), "each source's rows (a source with fewer than G repeats one)"),
    Tensor("row_position", np.int64, ("rows",), "each row's place in the flattened groups (layout.row_groups)"),
    Tensor("src_mask", np.int32, ("sources", "src_len"), "1 on each source's real tokens"),
    Tensor("top_k", np.int64, (1,), "K: candidates kept per row and per source"),
    Tensor("row_scores", np.float64, ("rows", 1), "each row's running score (its hypothesis's log-probability)"),
    Tensor(
        "candidate_bias",
        np.float64,
        ("sources", "group", "k"),
        "0 where a source takes the candidate (its group position holds one of its rows, and the rank is under"
        " the source's limit: 2·beam, greedy 1), -inf elsewhere",
    ),
)
# Per decoder layer i: past_key_i, past_value_i (bound as present_key_i, present_value_i too: the step writes
# each row's new entry in place at slot lengths[r]) and the sources' cross-attention keys and values.
CACHE_SHAPE = ("rows", "heads", "cache_len", "d_cache")
CROSS_SHAPE = ("sources", "heads", "src_len", "d_head")

ROW_OUTPUTS = (
    Tensor("top_log_probs", np.float32, ("rows", "k"), "each row's K best log-probabilities, best first"),
    Tensor("top_ids", np.int64, ("rows", "k"), "their tokens (ties to the lower id)"),
    Tensor("eos_log_probs", np.float32, ("rows", 1), "each row's log-probability of eos"),
)
SOURCE_OUTPUTS = (
    Tensor("candidate_scores", np.float64, ("sources", "k"), "each source's K best extensions: row score + log-p"),
    Tensor("candidate_origins", np.int64, ("sources", "k"), "the row within the source each extends"),
    Tensor("candidate_tokens", np.int64, ("sources", "k"), "the token each adds"),
)

STEP_INPUTS = {tensor.name for tensor in STEP_FEEDS}
STEP_OUTPUTS = [tensor.name for tensor in ROW_OUTPUTS]
# Each source's best extensions over all its rows, ranked in the step graph (export/decoder_step.py,
# search_head); a step function that has no such head (the PyTorch reference) leaves them to the search.
CANDIDATE_OUTPUTS = [tensor.name for tensor in SOURCE_OUTPUTS]
ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
# Several greedy steps per run (runtime/step_graphs.py, k_step_graph): each row's k best tokens (R, k) int64 and
# their log-probabilities (R, k) float32
K_STEP_OUTPUTS = ("k_step_tokens", "k_step_log_probs")
# The device greedy step (runtime/step_graphs.py, device_greedy_graph) writes the next step's tokens and lengths
# where they live, from its own token and a live row's length + 1, so a steady step sends nothing from the host;
# what the host reads is one packed output
LIVE = "live"  # (rows,) int32: 1 on a live row, 0 on a free slot's rows
NEXT_STATE = {"next_tokens": "tokens", "next_lengths": "lengths"}  # the output that is each feed's next value
GREEDY_PACKED = "greedy_packed"  # (rows, 2) float32: each row's token (exact: ids are below 2**24), its log-p
HOST_FEEDS = ("total_length", "top_k")  # read by kernels from host memory
ON_DEVICE = ".device"  # the suffix of a host feed's device copy (step_graphs.split_host_feeds)
# Host-memory inputs of the operators that take them: (op_type, input index)
HOST_INPUTS = {("GroupQueryAttention", 6), ("TopK", 1)}


def layer_names(prefix: str, layers: int) -> list[str]:
    """Per-layer feed names: past_key_0, past_value_0, past_key_1, ..."""
    return [f"{prefix}_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]


def present_names(layers: int, k: int) -> list[list[str]]:
    """Per copy j of a k-step graph, its present outputs (present_key_0, present_value_0, ...): the last copy's
    are the step's names, the others' carry ``@j``; all are bound to the past buffer of the same name."""
    base = layer_names("present", layers)
    return [[name if j == k - 1 else f"{name}@{j}" for name in base] for j in range(k)]


def output_arrays(rows: int, sources: int, k: int) -> list[np.ndarray]:
    """Empty host arrays for ROW_OUTPUTS then SOURCE_OUTPUTS, for a step to write into."""
    sizes = {"rows": rows, "sources": sources, "k": k}
    return [
        np.empty([sizes.get(axis, axis) for axis in tensor.shape], tensor.dtype)
        for tensor in ROW_OUTPUTS + SOURCE_OUTPUTS
    ]
