"""A translation cache in front of the scheduler: sentence in, the output it got last time out.

Keyed by everything that decides a sentence's output: the model (name, weights checksum, variant), the
decoding options (beam size, output limit) and the sentence as the model sees it (its source token ids,
so inputs that differ only where the tokenizer normalizes them share an entry). Values are hypotheses:
output token ids, confidence and why decoding stopped. Least recently used entries go first once the
entries' bytes would pass ``max_bytes``. Used from the event loop only: no lock.
"""

from __future__ import annotations

import struct
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from model.search import Hypothesis
from server.interface import Engine

STOPPED = ("eos", "length", "repetition")  # Hypothesis.stopped, stored as its index
HEADER = struct.Struct("<dB")  # a hypothesis' score and stop reason, before its tokens

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
    def key(engine: Engine, ids: Sequence[int], beam: int, max_output_tokens: int) -> bytes:
        model = f"{engine.name}@{engine.version}/{engine.variant}/beam {beam}/max {max_output_tokens}/"
        return model.encode() + array("I", ids).tobytes()

    def get(self, key: bytes) -> Hypothesis | None:
        value = self._entries.get(key)
        if value is None:
            return None
        self._entries.move_to_end(key)
        score, stopped = HEADER.unpack_from(value)
        return Hypothesis(array("I", value[HEADER.size :]).tolist(), score, STOPPED[stopped])

    def put(self, key: bytes, hypothesis: Hypothesis) -> None:
        """Keep ``hypothesis`` for ``key``, evicting the least recently used entries to stay within max_bytes
        (an entry larger than the whole bound is not kept)."""
        header = HEADER.pack(hypothesis.score, STOPPED.index(hypothesis.stopped))
        value = header + array("I", hypothesis.tokens).tobytes()
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
