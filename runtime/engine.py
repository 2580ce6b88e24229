"""The inference engine: an exported model folder on ONNX Runtime, as a server decodes with it. It implements
``server.interface``: the scheduler sees token ids, byte counts and running batches, never caches, sessions or
searches.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from runtime.backend import OrtBackend
from runtime.batch import DecodeBatch, EncodedSources, SourceStates
from runtime.memory import MemoryModel, bound_process_memory
from runtime.options import RuntimeOptions
from runtime.search import default_max_output
from runtime.stops import StopRules
from runtime.tokenizer import Tokenizer


class ModelText:
    """A model's text side, its tokenizer's (``server.interface.Engine``'s text methods): texts to source ids,
    output ids to texts, and the pieces of each."""

    tokenizer: Tokenizer

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer.encode_source(texts)

    def detokenize(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return self.tokenizer.decode(ids)

    def source_pieces(self, ids: Sequence[int]) -> list[str]:
        return self.tokenizer.source_pieces(ids)

    def target_pieces(self, ids: Sequence[int]) -> list[str]:
        return self.tokenizer.target_pieces(ids)


class Engine(ModelText):
    """An exported model on ONNX Runtime sessions (``server.interface.Engine``): its batches are
    ``runtime.batch.DecodeBatch``es over its backend's step."""

    def __init__(self, folder: str | Path, options: RuntimeOptions | None = None, stop_rules: StopRules = ()) -> None:
        """``stop_rules``: what its batches' searches stop by besides eos and length (runtime/stops.py)."""
        bound_process_memory()
        options = options or RuntimeOptions()
        self.folder, self.options, self.stop_rules = Path(folder), options, stop_rules
        self.backend = OrtBackend(self.folder, options)
        self.config = self.backend.config
        self.tokenizer = self.backend.tokenizer
        manifest = self.backend.manifest
        self.name = manifest["name"]
        self.source_language = manifest["source_language"]
        self.target_language = manifest["target_language"]
        self.version = manifest["checkpoint"]["weights_sha256"][:12]
        self.provider = self.backend.provider
        self.variant = self.backend.variant
        itemsize = np.dtype(self.backend.cache_dtype).itemsize
        self.memory = MemoryModel(self.config, itemsize, self.backend.d_cache)

    # --- text ----------------------------------------------------------------------

    def align(
        self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], kept: Sequence[SourceStates | None] = ()
    ) -> list[np.ndarray]:
        """Where each output token looked in its source (runtime/aligner.py); ``kept``: per pair, its source's
        keys and values from its decoding (``EncodedSources.source``), or None to encode it again."""
        return self.backend.aligner.align(pairs, kept)

    @staticmethod
    def max_length(source_tokens: int, cap: int) -> int:
        """Longest output searched for a source of ``source_tokens`` tokens (eos included, as is the cap)."""
        return default_max_output(source_tokens, cap)

    # --- inference -----------------------------------------------------------------

    def encode(self, sources: Sequence[Sequence[int]]) -> EncodedSources:
        """The sources' cross-attention keys and values on this engine's sessions, for a batch's ``add`` (ONNX
        Runtime's sessions take concurrent runs, so this may run on another thread while the batch steps)."""
        return self.backend.encode_sources(sources)

    def new_batch(self) -> DecodeBatch:
        return self.backend.new_batch(self.backend.decoding(self.stop_rules))

    def warmup(self, lengths: Sequence[int] = (8, 32, 128), beams: Sequence[int] = (1, 4)) -> None:
        """Decode each of ``lengths`` once (greedy and beam) so that first requests find warm allocators."""
        rng = np.random.default_rng(0)
        for length in lengths:
            for beam in beams:
                sources = [rng.integers(4, self.config.vocab_size, size=length).tolist() for _ in range(2)]
                batch = self.new_batch()
                batch.add(range(len(sources)), self.encode(sources), [beam] * len(sources), [8] * len(sources))
                batch.drain()
