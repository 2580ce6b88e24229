"""The inference engine: the one server module that touches ONNX Runtime (through
``export.runtime``). The scheduler sees token ids, numpy arrays and byte counts."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from export.runtime import OrtModel, RuntimeOptions
from model.search import DecodeBatch, pad_sources
from server.config import ServerConfig

# Attention-score tensors alive at once in an encoder layer: the scores and their softmax.
SCORE_COPIES = 2


@dataclass(frozen=True)
class Encoded:
    cross_k: Any
    cross_v: Any
    src_mask: np.ndarray
    seconds: float
    padded_tokens: int
    real_tokens: int


class Engine:
    def __init__(self, config: ServerConfig, verify_files: bool = True, intra_op_threads: int | None = None) -> None:
        self.server_config = config
        if intra_op_threads is None:
            intra_op_threads = config.intra_op_threads
        options = RuntimeOptions(
            variant=config.variant,
            provider=config.provider,
            intra_op_threads=intra_op_threads,
            spinning=config.intra_op_spinning,
            verify_files=verify_files,
        )
        self.model = OrtModel(config.model, options)
        self.config = self.model.config
        self.tokenizer = self.model.tokenizer
        manifest = self.model.manifest
        self.name = manifest["name"]
        self.source_language = manifest["source_language"]
        self.target_language = manifest["target_language"]
        self.version = manifest["checkpoint"]["weights_sha256"][:12]
        self.provider = self.model.provider
        self.variant = self.model.variant
        self.itemsize = np.dtype(self.model.cache_dtype).itemsize

    def replica(self, intra_op_threads: int | None = None) -> Engine:
        """Another engine on the same model files, with its own sessions (and their threads): created on the
        thread that will use it, they inherit that thread's priority. The files were verified by this one."""
        return Engine(self.server_config, verify_files=False, intra_op_threads=intra_op_threads)

    # --- text ----------------------------------------------------------------------

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer.encode_source(texts)

    def detokenize(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return self.tokenizer.decode(ids)

    # --- inference -----------------------------------------------------------------

    def encode(self, sources: Sequence[Sequence[int]]) -> Encoded:
        c = self.config
        start = time.perf_counter()
        src_tokens, src_mask = pad_sources(sources, c.pad_id, c.eos_id)
        cross_k, cross_v = self.model.encode(src_tokens, src_mask)
        return Encoded(cross_k, cross_v, src_mask, time.perf_counter() - start, src_mask.size, int(src_mask.sum()))

    def new_batch(self) -> DecodeBatch:
        return self.model.new_batch()

    # --- memory model ----------------------------------------------------------------

    @property
    def bytes_per_token(self) -> int:
        """Keys + values of one token in every decoder layer."""
        return 2 * self.config.n_decoder_layers * self.config.d_model * self.itemsize

    def source_bytes(self, source_tokens: int) -> int:
        """Cross-attention keys/values of one source (eos included), shared by its beams."""
        return self.bytes_per_token * (source_tokens + 1)

    def target_bytes(self, target_tokens: int, beam: int) -> int:
        """Self-attention cache of one source's beams after target_tokens steps (heads padded as the graph
        keeps them, see export/decoder_step.py)."""
        c = self.config
        return beam * target_tokens * 2 * c.n_decoder_layers * c.n_heads * self.model.d_cache * self.itemsize

    def sequence_bytes(self, source_tokens: int, target_tokens: int, beam: int) -> int:
        """What one source decoding with ``beam`` rows holds at ``target_tokens`` steps: its caches (the
        self-attention cache twice with beam search, whose row reordering gathers into a spare buffer),
        plus what a decoder step allocates for it: the cross-attention keys/values gathered per row.
        The step writes the self-attention cache in place and copies none of it."""
        step_copies = beam * (source_tokens + 1) * self.bytes_per_token
        buffers = 1 if beam == 1 else 2
        return self.source_bytes(source_tokens) + buffers * self.target_bytes(target_tokens, beam) + step_copies

    def encoder_scores_bytes(self, sentences: int, longest: int) -> int:
        """Peak attention-score bytes of an encoder batch: B · H · S² floats, twice."""
        s = longest + 1
        return SCORE_COPIES * sentences * self.config.n_heads * s * s * 4

    def warmup(self, lengths: Sequence[int] = (8, 32, 128), beams: Sequence[int] = (1, 4)) -> None:
        """Run every length bucket once (greedy and beam) so first requests find warm allocators."""
        rng = np.random.default_rng(0)
        for length in lengths:
            for beam in beams:
                sources = [rng.integers(4, self.config.vocab_size, size=length).tolist() for _ in range(2)]
                self.model.translate_ids(sources, beam, max_output_tokens=8)
