"""Sentencepiece tokenization: one joint model, or separate source and target
models mapped through a shared vocabulary (the Marian / OPUS-MT scheme)."""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

SPECIAL_PIECES = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    unk: int
    bos: int
    eos: int


class Tokenizer:
    """Text <-> ids. With a shared ``vocab`` (piece -> id), the sentencepiece
    models only split text into pieces and the vocabulary assigns ids."""

    def __init__(
        self,
        source: spm.SentencePieceProcessor,
        target: spm.SentencePieceProcessor | None = None,
        vocab: dict[str, int] | None = None,
    ) -> None:
        self.source = source
        self.target = target or source
        self.vocab = vocab
        self.pieces = {i: p for p, i in vocab.items()} if vocab else None

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        return cls(spm.SentencePieceProcessor(model_file=str(path)))

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, model_type: str = "bpe") -> tuple[Tokenizer, bytes]:
        """Train a joint model on texts; returns the tokenizer and its serialized model."""
        buffer = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=buffer,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=1.0,
            pad_id=0,
            unk_id=1,
            bos_id=2,
            eos_id=3,
            input_sentence_size=2_000_000,
            shuffle_input_sentence=True,
            minloglevel=2,
        )
        blob = buffer.getvalue()
        return cls(spm.SentencePieceProcessor(model_proto=blob)), blob

    @property
    def vocab_size(self) -> int:
        return len(self.vocab) if self.vocab else self.source.get_piece_size()

    @property
    def special_ids(self) -> SpecialIds:
        if self.vocab:
            v = self.vocab
            return SpecialIds(v[SPECIAL_PIECES["pad"]], v[SPECIAL_PIECES["unk"]], v.get("<s>", v["</s>"]), v["</s>"])
        s = self.source
        return SpecialIds(s.pad_id(), s.unk_id(), s.bos_id(), s.eos_id())

    def _to_ids(self, processor: spm.SentencePieceProcessor, texts: Sequence[str]) -> list[list[int]]:
        if self.vocab is None:
            return processor.encode(list(texts), out_type=int)
        unk = self.special_ids.unk
        return [[self.vocab.get(p, unk) for p in pieces] for pieces in processor.encode(list(texts), out_type=str)]

    def encode_source(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of source texts, without bos/eos."""
        return self._to_ids(self.source, texts)

    def encode_target(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of target texts, without bos/eos."""
        return self._to_ids(self.target, texts)

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Detokenized target texts; special ids are dropped."""
        special = set(vars(self.special_ids).values())
        rows = [[i for i in row if i not in special] for row in ids]
        if self.pieces is None:
            return self.target.decode(rows)
        return [self.target.decode_pieces([self.pieces[i] for i in row]) for row in rows]
