"""A translation cache in front of the scheduler: sentence in, the output it got last time out.

Keyed by everything that decides a sentence's output: the model (name, weights checksum, variant), the
decoding options (beam size, output limit, alternatives wanted) and the sentence as the model sees it (its
source token ids, so inputs that differ only where the tokenizer normalizes them share an entry). Values are
hypotheses: output token ids, confidence and why decoding stopped, and the alternatives the request wanted
(so an entry kept for a request without them never answers one with them). Least recently used entries go first once the
entries' bytes would pass ``max_bytes``. Used from the event loop only: no lock.
"""

from __future__ import annotations

import struct
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from runtime.search import Hypothesis
from server.interface import Engine
from server.scheduling.jobs import DecodeOptions

STOPPED = ("eos", "length", "repetition")  # Hypothesis.stopped, stored as its index
HEADER = struct.Struct("<dBI")  # a hypothesis' score, stop reason and token count, before its tokens
TOKEN_BYTES = array("I").itemsize

# Bytes an entry costs besides its key and value payloads: two bytes objects and an OrderedDict slot
# (tracemalloc, CPython 3.11: 141 bytes per entry over 20,000 entries).
ENTRY_OVERHEAD_BYTES = 144


class TranslationCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(engine: Engine, ids: Sequence[int], options: DecodeOptions) -> bytes:
        model = f"{engine.name}@{engine.version}/{engine.variant}/"
        decoding = f"beam {options.beam}/max {options.max_output_tokens}/alternatives {options.alternatives}/"
        return (model + decoding).encode() + array("I", ids).tobytes()

    def get(self, key: bytes) -> Hypothesis | None:
        value = self._entries.get(key)
        if value is None:
            return None
        self._entries.move_to_end(key)
        hypotheses, offset = [], 0
        while offset < len(value):
            score, stopped, count = HEADER.unpack_from(value, offset)
            offset += HEADER.size + TOKEN_BYTES * count
            tokens = array("I", value[offset - TOKEN_BYTES * count : offset]).tolist()
            hypotheses.append(Hypothesis(tokens, score, STOPPED[stopped]))
        return hypotheses[0]._replace(alternatives=tuple(hypotheses[1:]))

    def put(self, key: bytes, hypothesis: Hypothesis) -> None:
        """Keep ``hypothesis`` for ``key``, evicting the least recently used entries to stay within max_bytes
        (an entry larger than the whole bound is not kept)."""
        value = b"".join(
            HEADER.pack(h.score, STOPPED.index(h.stopped), len(h.tokens)) + array("I", h.tokens).tobytes()
            for h in (hypothesis, *hypothesis.alternatives)
        )
        size = self._size(key, value)
        if size > self.max_bytes:
            return
        if key in self._entries:
            self.bytes -= self._size(key, self._entries.pop(key))
        while self.bytes + size > self.max_bytes:
            old_key, old_value = self._entries.popitem(last=False)
            self.bytes -= self._size(old_key, old_value)
        self._entries[key] = value
        self.bytes += size

    @staticmethod
    def _size(key: bytes, value: bytes) -> int:
        return len(key) + len(value) + ENTRY_OVERHEAD_BYTES
