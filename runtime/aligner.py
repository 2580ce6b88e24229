"""Where each output token looked in its source: the export's aligner graph (export/aligner.py) over the
encoder's cross-attention keys/values, to place markup."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from runtime.batch import SourceStates, host_float32, pad_sources
from runtime.manifest import ModelFolderError
from runtime.model_config import ModelConfig
from runtime.providers import NO_FUSIONS, PROVIDERS

ALIGN_GROUP = 16  # pairs per aligner call


def _stacked(parts: Sequence[np.ndarray], length: int) -> np.ndarray:
    """Sources' kept keys or values (L, 1, H, S_i, d_k) as one padded batch (L, n, H, length, d_k): the padding is
    masked, as an encoder call's is."""
    layers, _, heads, _, d_k = parts[0].shape
    if len(parts) == 1 and parts[0].shape[3] == length:
        return parts[0]
    stacked = np.zeros((layers, len(parts), heads, length, d_k), np.float32)
    for row, part in enumerate(parts):
        stacked[:, row, :, : part.shape[3]] = part[:, 0]
    return stacked


def _mean(readings: list[np.ndarray]) -> np.ndarray:
    """The readings' mean, element by element (np.mean's stacking costs more than the sum for a few)."""
    return functools.reduce(np.add, readings) / np.float32(len(readings))


class Aligner:
    """A folder's aligner graph, loaded on first use, over ``encode`` (the model's encoder: source tokens and
    mask to cross-attention keys and values). An int8 engine runs the aligner's int8 form where the export wrote one
    (its placements are the fp32 one's to 0.2%, export/pipeline.py), at about 0.6x the CPU of fp32's."""

    def __init__(
        self,
        folder: Path,
        manifest: dict,
        config: ModelConfig,
        encode: Callable[[np.ndarray, np.ndarray], Any],
        variant: str = "fp32",
    ) -> None:
        self.folder, self.manifest, self.config, self.encode = folder, manifest, config, encode
        self.variant = variant
        self._loaded: tuple[ort.InferenceSession, list[tuple[int, int]]] | None = None  # made on first use
        self._lock = threading.Lock()

    def align(
        self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], kept: Sequence[SourceStates | None] = ()
    ) -> list[np.ndarray]:
        """Where each output token looked in its source: for each (source ids, output ids) pair, the
        cross-attention probabilities (len(output), len(source)) the export chose (the mean of its
        manifest's readings, export/aligner.py), eos's column dropped. Runs the aligner graph, on the CPU, in groups of
        ALIGN_GROUP pairs by length; raises ModelFolderError for a folder exported without it. ``kept``: per pair,
        its source's keys and values from its decoding's encoder call, or None (then it is encoded again)."""
        _, readings = self._session()
        return [
            _mean([every[layer, offset : offset + len(output), : len(source)] for layer, offset in readings])
            for every, (source, output) in zip(self.alignments(pairs, kept=kept), pairs, strict=True)
        ]

    def alignments(
        self,
        pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
        session: ort.InferenceSession | None = None,
        kept: Sequence[SourceStates | None] = (),
    ) -> list[np.ndarray]:
        """For each (source ids, output ids) pair, the aligner's layers' cross-attention probabilities
        (L', len(output) + 1, len(source) + 1): ``align`` before choosing layers and rows. ``session``: another
        aligner graph than the folder's (benchmarks/alignment.py compares every layer)."""
        session = session or self._session()[0]
        c, results = self.config, [np.zeros((0, 0, 0), np.float32)] * len(pairs)
        kept = list(kept) or [None] * len(pairs)
        order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
        for start in range(0, len(order), ALIGN_GROUP):
            group = order[start : start + ALIGN_GROUP]
            src_tokens, src_mask = pad_sources([pairs[i][0] for i in group], c.pad_id, c.eos_id)
            outputs = [list(pairs[i][1]) for i in group]
            tgt = np.full((len(group), max(map(len, outputs)) + 1), c.pad_id, np.int64)
            for row, output in enumerate(outputs):
                tgt[row, : len(output) + 1] = [c.decoder_start_id, *output]
            states = [kept[i] for i in group]
            if all(state is not None for state in states):
                cross_k, cross_v = (_stacked([state[n] for state in states], src_mask.shape[1]) for n in (0, 1))
            else:
                cross_k, cross_v = self.encode(src_tokens, src_mask)
            feeds = {
                "tgt_tokens": tgt,
                "src_mask": src_mask.astype(np.int32),
                "cross_k": host_float32(cross_k),
                "cross_v": host_float32(cross_v),
            }
            alignment = session.run(None, feeds)[0]  # (L, B, T, S)
            for row, i in enumerate(group):
                source, output = pairs[i]
                results[i] = alignment[:, row, : len(output) + 1, : len(source) + 1]
        return results

    def _session(self) -> tuple[ort.InferenceSession, list[tuple[int, int]]]:
        with self._lock:
            if self._loaded is None:
                spec = self.manifest.get("aligner")
                if spec is None:
                    raise ModelFolderError(
                        f"{self.folder} was exported without an aligner (markup needs it); export it again: "
                        f"python -m export --out {self.folder} --force"
                    )
                options = ort.SessionOptions()
                options.intra_op_num_threads = 1  # beside the decoding lanes, which own the cores
                options.enable_cpu_mem_arena = False
                form = spec.get("int8", spec) if self.variant == "int8" else spec  # no int8 form: fp32
                path = str(self.folder / form["file"])
                session = ort.InferenceSession(path, options, [PROVIDERS["cpu"]], disabled_optimizers=NO_FUSIONS)
                self._loaded = (session, [(int(layer), int(offset)) for layer, offset in spec["readings"]])
            return self._loaded
