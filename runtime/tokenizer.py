"""Sentencepiece tokenization: one joint model, or separate source and target
models mapped through a shared vocabulary (the Marian / OPUS-MT scheme)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import sentencepiece as spm

SPECIAL_PIECES = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}
# SentencePiece's list calls cost 80-110 µs each however short the list, its one-string calls 5-14 µs
# (sentencepiece 0.2.3, 2-core x86-64, one test_2016_flickr sentence per call): lists shorter than this go
# one string at a time (a server request is usually one sentence).
LIST_CALL_MIN = 16
# The files of each kind of tokenizer, as a checkpoint or an exported folder records them
# ({"kind": ..., "files": [...]}). Folders written before the record existed hold one joint model.
TOKENIZER_FILES = {"joint": ("sentencepiece.model",), "marian": ("source.spm", "target.spm", "vocab.json")}


class TokenizerError(ValueError):
    """Tokenizer files that cannot be loaded; the message names the file."""


def kind_spec(kind: str) -> dict[str, Any]:
    """The record of a tokenizer kind with its standard file names."""
    return {"kind": kind, "files": list(TOKENIZER_FILES[kind])}


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
        return cls(_processor(path))

    @classmethod
    def load(cls, directory: str | Path, spec: dict[str, Any] | str | None = None) -> Tokenizer:
        """The tokenizer of a folder, as its spec records it: {"kind", "files"}; a bare file
        name (an older manifest's form) or None mean one joint sentencepiece model."""
        directory = Path(directory)
        if spec is None or isinstance(spec, str):
            spec = {"kind": "joint", "files": [spec]} if spec else kind_spec("joint")
        kind, files = spec.get("kind"), spec.get("files", [])
        if kind not in TOKENIZER_FILES or len(files) != len(TOKENIZER_FILES[kind]):
            raise TokenizerError(f"{directory}: unknown tokenizer {spec}; expected kind joint or marian with its files")
        paths = [directory / name for name in files]
        for path in paths:
            if not path.is_file():
                raise TokenizerError(f"{path} is missing")
        if kind == "joint":
            return cls.from_file(paths[0])
        source, target, vocab = paths
        return cls(_processor(source), _processor(target), json.loads(vocab.read_text(encoding="utf-8")))

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
    def kind(self) -> str:
        return "joint" if self.vocab is None else "marian"

    @property
    def spec(self) -> dict[str, Any]:
        return kind_spec(self.kind)

    def save(self, directory: str | Path) -> dict[str, Any]:
        """Write the tokenizer's files into directory; returns its spec."""
        directory = Path(directory)
        if self.vocab is None:
            (directory / TOKENIZER_FILES["joint"][0]).write_bytes(self.source.serialized_model_proto())
            return self.spec
        source, target, vocab = TOKENIZER_FILES["marian"]
        (directory / source).write_bytes(self.source.serialized_model_proto())
        (directory / target).write_bytes(self.target.serialized_model_proto())
        (directory / vocab).write_text(json.dumps(self.vocab, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        return self.spec

    @property
    def vocab_size(self) -> int:
        return len(self.vocab) if self.vocab else self.source.get_piece_size()

    @cached_property
    def special_ids(self) -> SpecialIds:
        if self.vocab:
            v = self.vocab
            return SpecialIds(v[SPECIAL_PIECES["pad"]], v[SPECIAL_PIECES["unk"]], v.get("<s>", v["</s>"]), v["</s>"])
        s = self.source
        return SpecialIds(s.pad_id(), s.unk_id(), s.bos_id(), s.eos_id())

    def _to_ids(self, processor: spm.SentencePieceProcessor, texts: Sequence[str]) -> list[list[int]]:
        if self.vocab is None:
            if len(texts) < LIST_CALL_MIN:
                return [processor.encode(text, out_type=int) for text in texts]
            return processor.encode(list(texts), out_type=int)
        unk = self.special_ids.unk
        return [[self.vocab.get(p, unk) for p in _marian_pieces(processor, text)] for text in texts]

    def encode_source(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of source texts, without bos/eos."""
        return self._to_ids(self.source, texts)

    def encode_target(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of target texts, without bos/eos."""
        return self._to_ids(self.target, texts)

    def source_pieces(self, ids: Sequence[int]) -> list[str]:
        """The pieces of source ids ("▁" starts a word)."""
        return [self.pieces[i] for i in ids] if self.pieces else self.source.id_to_piece(list(map(int, ids)))

    def target_pieces(self, ids: Sequence[int]) -> list[str]:
        """The pieces of target ids ("▁" starts a word)."""
        return [self.pieces[i] for i in ids] if self.pieces else self.target.id_to_piece(list(map(int, ids)))

    @cached_property
    def _special(self) -> frozenset[int]:
        return frozenset(vars(self.special_ids).values())

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Detokenized target texts; special ids are dropped."""
        special = self._special
        rows = [[i for i in row if i not in special] for row in ids]
        if self.pieces is None:
            return [self.target.decode(row) for row in rows] if len(rows) < LIST_CALL_MIN else self.target.decode(rows)
        return [self.target.decode_pieces([self.pieces[i] for i in row]) for row in rows]


def _processor(path: str | Path) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(path))


def _marian_pieces(processor: spm.SentencePieceProcessor, text: str) -> list[str]:
    """Pieces of text; a leading target-language token (">>fr<<", multilingual OPUS-MT
    models) stays one piece, as MarianTokenizer keeps it."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return [text[: end + 2], *processor.encode(text[end + 2 :], out_type=str)]
    return processor.encode(text, out_type=str)
