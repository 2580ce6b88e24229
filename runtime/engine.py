"""The inference engine: an exported model folder on ONNX Runtime, as a server decodes with it. It
implements ``server.interface``: the scheduler sees token ids, byte counts and running batches, never
caches, sessions or searches.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.search import DecodeBatch, Hypothesis, default_max_output, new_search, pad_sources
from runtime.sessions import OrtModel, RuntimeOptions, bound_process_memory

# An encoder call's working memory, measured as what stays resident after it (the heap keeps its
# high-water mark below MMAP_THRESHOLD): one (B, H, S, S) attention-score tensor and up to 24 (B, S, D)
# states besides the feed-forward hidden states (6.8 MiB at 257 tokens, 11 MiB at 1,025; estimate 7.9, 44).
SCORE_COPIES = 1
ENCODER_STATES = 24
# Per row, a decoder step holds the logits, their float32 copy and the log-probabilities (V each) ...
STEP_LOGITS_COPIES = 3
# ... and a few (D) states besides the feed-forward hidden state.
STEP_STATES = 8
PAGE = 4096  # bytes: resident memory grows by pages


@dataclass(frozen=True)
class Joined:
    """What joining sources to a batch cost: the encoder call and the padding of its batch."""

    seconds: float
    padded_tokens: int
    real_tokens: int


@dataclass(frozen=True)
class EncodedSources:
    """Encoder outputs waiting to join a batch (``server.interface.Encoded``)."""

    cross_k: Any
    cross_v: Any
    src_mask: np.ndarray
    seconds: float


class RunningBatch:
    """Sources being decoded together on one engine (``server.interface.Batch``)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._batch: DecodeBatch = engine.model.new_batch()

    @property
    def rows(self) -> int:
        """Hypotheses being decoded (a source has one per beam)."""
        return self._batch.rows

    def __len__(self) -> int:
        return len(self._batch)

    @property
    def cache_bytes(self) -> int:
        """Self-attention cache allocated now (paged in as it is written)."""
        return self._batch.cache.nbytes

    @property
    def cross_bytes(self) -> int:
        """Cross-attention keys/values held now."""
        return self._batch.cross_nbytes

    @property
    def narrow(self) -> bool:
        """Whether it steps and encodes on the engine's narrow sessions (RuntimeOptions.narrow_threads)."""
        return self._batch.narrow

    @narrow.setter
    def narrow(self, narrow: bool) -> None:
        self._batch.narrow = narrow

    def encode(self, sources: Sequence[Sequence[int]]) -> EncodedSources:
        """The sources' cross-attention keys and values, for ``add`` (ONNX Runtime's sessions take
        concurrent runs, so this may run on another thread while the batch steps)."""
        start, c = time.perf_counter(), self._engine.config
        src_tokens, src_mask = pad_sources(sources, c.pad_id, c.eos_id)
        cross_k, cross_v = self._engine.model.encode(src_tokens, src_mask, self._batch.narrow)
        return EncodedSources(cross_k, cross_v, src_mask, time.perf_counter() - start)

    def add(
        self, keys: Sequence[Hashable], encoded: EncodedSources, beams: Sequence[int], max_lengths: Sequence[int]
    ) -> Joined:
        """Add encoded sources, each with its beam size and longest output (tokens with eos); they decode from
        the next step on."""
        engine = self._engine
        alpha, eos = engine.model.length_penalty, engine.config.eos_id
        searches = [new_search(beam, n, eos, alpha, engine.guard) for beam, n in zip(beams, max_lengths, strict=True)]
        mask = encoded.src_mask
        self._batch.add(keys, searches, encoded.cross_k, encoded.cross_v, mask)
        return Joined(encoded.seconds, mask.size, int(mask.sum()))

    def step(self) -> list[tuple[Hashable, Hypothesis]]:
        """One decoder step of every row; the sources it finished, with their hypotheses."""
        return self._batch.step()

    def remove(self, key: Hashable) -> None:
        """Drop a source mid-way; its rows and caches go at once."""
        self._batch.remove(key)


class Engine:
    """An exported model on ONNX Runtime sessions (``server.interface.Engine``)."""

    def __init__(self, folder: str | Path, options: RuntimeOptions | None = None, guard: int | None = None) -> None:
        """``guard``: the runaway-output guard's ``max_repeats`` (runtime.search; None: off)."""
        bound_process_memory()
        options = options or RuntimeOptions()
        self.folder, self.options, self.guard = Path(folder), options, guard
        self.model = OrtModel(self.folder, options)
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

    def replica(self, intra_op_threads: int | None = None, narrow_threads: int | None = None) -> Engine:
        """Another engine on the same model files, with its own sessions (and their threads; None: this one's
        count, without its small-batch sessions), and narrow ones of ``narrow_threads`` (None: none): created
        on the thread that will use it, they inherit that thread's priority. The files were verified by this
        one."""
        threads = self.options.intra_op_threads if intra_op_threads is None else intra_op_threads
        options = dataclasses.replace(
            self.options,
            intra_op_threads=threads,
            small_batch_threads=None,
            narrow_threads=narrow_threads,
            verify_files=False,
        )
        return Engine(self.folder, options, self.guard)

    # --- text ----------------------------------------------------------------------

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer.encode_source(texts)

    def detokenize(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return self.tokenizer.decode(ids)

    def source_pieces(self, ids: Sequence[int]) -> list[str]:
        return self.tokenizer.source_pieces(ids)

    def target_pieces(self, ids: Sequence[int]) -> list[str]:
        return self.tokenizer.target_pieces(ids)

    def align(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[np.ndarray]:
        """Where each output token looked in its source (runtime.sessions.OrtModel.align)."""
        return self.model.align(pairs)

    @staticmethod
    def max_length(source_tokens: int, cap: int) -> int:
        """Longest output searched for a source of ``source_tokens`` tokens (eos included, as is the cap)."""
        return default_max_output(source_tokens + 1, cap)

    # --- inference -----------------------------------------------------------------

    def new_batch(self) -> RunningBatch:
        return RunningBatch(self)

    # --- memory model ----------------------------------------------------------------
    # What the process holds, as resident memory: caches are zeroed lazily by the OS and paged in as
    # they are written (bound_process_memory), so they count by the page, per (layer, head) block.

    def _paged(self, floats: int) -> int:
        return -(-floats * self.itemsize // PAGE) * PAGE

    def source_bytes(self, source_tokens: int) -> int:
        """Cross-attention keys/values of one source (eos included), shared by its beams."""
        c = self.config
        return 2 * c.n_decoder_layers * c.n_heads * self._paged((source_tokens + 1) * c.d_head)

    def target_bytes(self, target_tokens: int, beam: int) -> int:
        """Self-attention cache of one source's beams after target_tokens steps (heads padded as the graph
        keeps them, see export/decoder_step.py)."""
        c = self.config
        return beam * 2 * c.n_decoder_layers * c.n_heads * self._paged(target_tokens * self.model.d_cache)

    def sequence_bytes(self, source_tokens: int, target_tokens: int, beam: int) -> int:
        """What one source decoding with ``beam`` rows holds at ``target_tokens`` steps: its caches (with
        beam search, plus the temporary its reordered rows go through) and what a decoder step allocates
        for its rows (the logits and log-probabilities, the feed-forward
        layer's hidden states and a few model-wide states each). The step writes the self-attention
        cache in place and reads the cross-attention keys/values where they are."""
        c = self.config
        cache = self.target_bytes(target_tokens, beam)
        if beam > 1:  # reordering rows copies them through a temporary, one layer's keys or values at a time
            cache += cache // (2 * c.n_decoder_layers)
        step = beam * (STEP_LOGITS_COPIES * c.vocab_size + c.d_ff + STEP_STATES * c.d_model) * 4
        return self.source_bytes(source_tokens) + cache + step

    def encoder_scores_bytes(self, sentences: int, longest: int) -> int:
        """Peak working memory of an encoder call: its attention scores (B · H · S² floats) and activations
        (ENCODER_STATES states of S · D floats, the feed-forward layer's S · d_ff)."""
        c, s = self.config, longest + 1
        activations = ENCODER_STATES * s * c.d_model + s * c.d_ff
        return sentences * (SCORE_COPIES * c.n_heads * s * s + activations) * 4

    def warmup(self, lengths: Sequence[int] = (8, 32, 128), beams: Sequence[int] = (1, 4)) -> None:
        """Run every length bucket once (greedy and beam) so first requests find warm allocators."""
        rng = np.random.default_rng(0)
        for length in lengths:
            for beam in beams:
                sources = [rng.integers(4, self.config.vocab_size, size=length).tolist() for _ in range(2)]
                self.model.translate_ids(sources, beam, max_output_tokens=8)
        if self.model.narrow_decoder is not self.model.decoder:  # a server's longer lane runs on them too
            batch = self.new_batch()
            batch.narrow = True
            sources = [rng.integers(4, self.config.vocab_size, size=length).tolist() for length in lengths]
            batch.add(range(len(sources)), batch.encode(sources), [max(beams)] * len(sources), [8] * len(sources))
            while len(batch):
                batch.step()
