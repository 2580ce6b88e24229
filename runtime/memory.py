"""Memory: what a decoding sentence holds (``MemoryModel``, which the server's budget admits by), and the
process settings that make resident memory follow what the engine holds (``bound_process_memory``)."""

from __future__ import annotations

import contextlib
import ctypes

from runtime.cpu import usable_cores
from runtime.model_config import ModelConfig

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters
# Allocations over this get their own mapping, returned on free: long inputs' encoder states and the
# caches. Below it, a decoder step's many allocations reuse the heap: a lower threshold (128 KiB) cost
# 40% of batch-32 throughput in mmap/munmap page faults (2-core x86-64, int8, one run, alternating).
MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 64 << 20  # heap kept before it is given back: trimming every step costs as much
# Heaps (arenas) threads allocate from, per usable core (glibc's default is 8): each keeps up to TRIM_THRESHOLD
# free, and a server has a decoding thread per lane. Both default models under 32 clients, beam 4, on 2 cores
# (one lane per core and size): resident 1.44x idle after the load with glibc's default, 1.24x with 1 per core.
ARENAS_PER_CORE = 1

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


def bound_process_memory() -> None:
    """Make the process's resident memory follow what it holds, so a memory budget can be kept: numpy no
    longer asks for transparent huge pages (a lazily zeroed cache buffer would be paged in 2 MiB at a
    time as slots are written: 2.5x the estimate at 256 tokens), and glibc serves allocations over
    MMAP_THRESHOLD with their own mappings, returned on free (by default it raises that threshold after
    large frees, and then keeps freed encoder intermediates), from ARENAS_PER_CORE heaps per usable core.
    Process-wide; the engine calls it."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    if hasattr(multiarray, "_set_madvise_hugepage"):
        multiarray._set_madvise_hugepage(False)
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        libc.mallopt(M_ARENA_MAX, max(2, ARENAS_PER_CORE * usable_cores()))
    except OSError:  # not glibc
        pass


def release_free_memory() -> None:
    """Give the heaps' free memory back to the OS (glibc's malloc_trim; elsewhere nothing happens): for an
    idle server, whose heaps kept up to TRIM_THRESHOLD each from its last load."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class MemoryModel:
    """What the process holds for a model's decoding, as resident memory: caches are zeroed lazily by the OS and
    paged in as they are written (bound_process_memory), so they count by the page, per (layer, head) block."""

    def __init__(self, config: ModelConfig, itemsize: int, d_cache: int) -> None:
        """``itemsize``: the self-attention cache's bytes per number; ``d_cache``: its padded head size."""
        self.config, self.itemsize, self.d_cache = config, itemsize, d_cache

    def _paged(self, floats: int) -> int:
        return -(-floats * self.itemsize // PAGE) * PAGE

    def source_bytes(self, source_tokens: int) -> int:
        """Cross-attention keys/values of one source (eos included), shared by its beams."""
        c = self.config
        return 2 * c.n_decoder_layers * c.n_heads * self._paged((source_tokens + 1) * c.d_head)

    def target_bytes(self, target_tokens: int, beam: int) -> int:
        """Self-attention cache of one source's beams after target_tokens steps (each head padded to d_cache, as
        runtime/contract.py's cache shape has it)."""
        c = self.config
        return beam * 2 * c.n_decoder_layers * c.n_heads * self._paged(target_tokens * self.d_cache)

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
