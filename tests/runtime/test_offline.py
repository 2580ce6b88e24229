"""Offline decoding (runtime/offline.py): sources encoded in groups by length decode as in one group, each within
its output limit; texts are translated in length-sorted batches, at once on several workers or in their own
order, and come back in the order they were given."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import offline
from runtime.backend import OrtBackend
from runtime.options import EngineSettings, RuntimeOptions
from tests.conftest import own_sentences


@pytest.fixture(scope="module")
def engine(tiny_export: Path) -> OrtBackend:
    return OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu", intra_op_threads=1)))


@pytest.mark.parametrize("beam", [1, 2])
def test_sources_encoded_in_several_groups_decode_as_in_one(engine: OrtBackend, monkeypatch, beam: int):
    sources = [ids[: 2 + 3 * i] for i, ids in enumerate(engine.tokenizer.encode_source(own_sentences(7)))]
    together = offline.hypotheses(engine, sources, beam, max_output_tokens=12)
    encoded = []
    encode = engine.encode_sources
    monkeypatch.setattr(engine, "encode_sources", lambda group: encoded.append(len(group)) or encode(group))
    monkeypatch.setattr(offline, "ENCODER_GROUP", 2)
    grouped = offline.hypotheses(engine, sources[::-1], beam, max_output_tokens=12)[::-1]
    assert encoded == [2, 2, 2, 1]
    assert [(h.tokens, h.score) for h in grouped] == [(h.tokens, h.score) for h in together]
    assert all(len(h.tokens) < 12 for h in together)  # the limit counts eos
    assert offline.translate_ids(engine, sources, beam, max_output_tokens=12) == [h.tokens for h in together]


def test_translate_is_translate_ids_between_the_tokenizers_two_ends(engine: OrtBackend):
    texts = own_sentences(5)
    ids = offline.translate_ids(engine, engine.tokenizer.encode_source(texts), max_output_tokens=10)
    assert offline.translate(engine, texts, batch_size=8, max_output_tokens=10) == engine.tokenizer.decode(ids)


class WordLengths:
    """A tokenizer whose ids are its words' lengths."""

    def encode_source(self, texts: list[str]) -> list[list[int]]:
        return [[len(word) for word in text.split()] for text in texts]

    def decode(self, ids: list[list[int]]) -> list[str]:
        return [" ".join(map(str, row)) for row in ids]


TEXTS = ["a bb ccc", "dddd", "ee f gg hhh iiii", "j", "kk ll"]  # 3, 1, 5, 1 and 2 words


def translated(**options) -> tuple[list[str], list[list[list[int]]]]:
    """TEXTS through translate_in_batches, reversing each text's ids; and the batches as they were asked."""
    batches = []

    def reverse(batch: list[list[int]]) -> list[list[int]]:
        batches.append(batch)
        return [row[::-1] for row in batch]

    return offline.translate_in_batches(WordLengths(), TEXTS, reverse, batch_size=2, **options), batches


def test_texts_are_translated_in_length_sorted_batches_and_come_back_in_their_order():
    texts, batches = translated()
    assert texts == ["3 2 1", "4", "4 3 2 1 2", "1", "2 2"]
    assert [[len(row) for row in batch] for batch in batches] == [[1, 1], [2, 3], [5]]
    in_order, batches = translated(by_length=False)
    assert in_order == texts and [[len(row) for row in batch] for batch in batches] == [[3, 1], [5, 1], [2]]
    on_workers, batches = translated(workers=3)
    assert on_workers == texts and len(batches) == 3
