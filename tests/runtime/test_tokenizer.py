"""SentencePiece tokenization (runtime/tokenizer.py): one joint model, or OPUS-MT's separate source and target
models over a shared vocabulary, saved and loaded as a folder's record says; short and long lists encode alike;
special ids never reach the text; files that cannot be loaded are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.tokenizer import LIST_CALL_MIN, SpecialIds, Tokenizer, TokenizerError, kind_spec
from testkit.sentences import own_sentences
from tests.torch_fixtures import build_marian_tokenizer


@pytest.fixture(scope="module")
def marian_tokenizer(tmp_path_factory) -> Tokenizer:
    """OPUS-MT's layout: separate source and target models, one vocabulary."""
    folder = tmp_path_factory.mktemp("marian_tokenizer")
    build_marian_tokenizer(folder)
    return Tokenizer.load(folder, kind_spec("marian"))


def test_tokenizer_round_trip(trained_tokenizer):
    tokenizer, _ = trained_tokenizer
    ids = tokenizer.encode_source(["a man rides a horse", "zwei hunde"])
    assert all(isinstance(i, int) for row in ids for i in row)
    assert tokenizer.decode(ids) == ["a man rides a horse", "zwei hunde"]
    special = tokenizer.special_ids
    assert (special.pad, special.unk, special.bos, special.eos) == (0, 1, 2, 3)


def test_target_language_token_stays_one_piece(marian_tokenizer: Tokenizer):
    tokenizer = marian_tokenizer
    vocab = {**tokenizer.vocab, ">>fr<<": len(tokenizer.vocab)}
    multilingual = Tokenizer(tokenizer.source, tokenizer.target, vocab)
    [with_code] = multilingual.encode_source([">>fr<< Two dogs are playing."])
    assert with_code == [vocab[">>fr<<"], *tokenizer.encode_source(["Two dogs are playing."])[0]]


def test_a_marian_vocabulary_assigns_the_ids(marian_tokenizer: Tokenizer):
    vocab = marian_tokenizer.vocab
    assert marian_tokenizer.kind == "marian" and marian_tokenizer.vocab_size == len(vocab)
    # No <s> in OPUS-MT's vocabulary: bos is eos.
    assert marian_tokenizer.special_ids == SpecialIds(pad=len(vocab) - 1, unk=1, bos=0, eos=0)
    [ids] = marian_tokenizer.encode_source(["A ☃ is here."])
    assert marian_tokenizer.special_ids.unk in ids  # a piece the vocabulary lacks
    pieces = marian_tokenizer.source_pieces(ids)
    assert pieces[0] == "▁A" and "<unk>" in pieces and [vocab[piece] for piece in pieces] == ids


def test_a_saved_tokenizer_loads_as_its_record_says(trained_tokenizer, marian_tokenizer: Tokenizer, tmp_path: Path):
    texts = own_sentences(5)
    for tokenizer in (trained_tokenizer[0], marian_tokenizer):
        folder = tmp_path / tokenizer.kind
        folder.mkdir()
        spec = tokenizer.save(folder)
        assert spec == tokenizer.spec == kind_spec(tokenizer.kind)
        assert sorted(path.name for path in folder.iterdir()) == sorted(spec["files"])
        loaded = Tokenizer.load(folder, spec)
        assert (loaded.kind, loaded.vocab_size, loaded.special_ids) == (
            tokenizer.kind,
            tokenizer.vocab_size,
            tokenizer.special_ids,
        )
        assert loaded.encode_source(texts) == tokenizer.encode_source(texts)
        assert loaded.decode(tokenizer.encode_target(texts)) == tokenizer.decode(tokenizer.encode_target(texts))
    # An older manifest's record: a bare file name, or none at all, means one joint model.
    joint = trained_tokenizer[0].encode_source(texts)
    for older in ("sentencepiece.model", None):
        assert Tokenizer.load(tmp_path / "joint", older).encode_source(texts) == joint


def test_tokenizer_files_that_cannot_be_loaded_are_named(tmp_path: Path):
    with pytest.raises(TokenizerError, match="unknown tokenizer .*expected kind joint or marian"):
        Tokenizer.load(tmp_path, {"kind": "wordpiece", "files": ["vocab.txt"]})
    with pytest.raises(TokenizerError, match="unknown tokenizer"):
        Tokenizer.load(tmp_path, {"kind": "marian", "files": ["source.spm", "target.spm"]})
    with pytest.raises(TokenizerError, match=r"source.spm is missing"):
        Tokenizer.load(tmp_path, kind_spec("marian"))
    with pytest.raises(TokenizerError, match=r"sentencepiece.model is missing"):
        Tokenizer.load(tmp_path)


def test_long_lists_encode_and_decode_as_their_texts_one_at_a_time(trained_tokenizer):
    """Lists of LIST_CALL_MIN texts or more go to SentencePiece in one call, shorter ones text by text."""
    tokenizer, _ = trained_tokenizer
    texts = own_sentences(LIST_CALL_MIN + 4)
    for encode in (tokenizer.encode_source, tokenizer.encode_target):
        assert encode(texts) == [encode([text])[0] for text in texts]
    ids = tokenizer.encode_target(texts)
    assert tokenizer.decode(ids) == [tokenizer.decode([row])[0] for row in ids]


@pytest.mark.parametrize("kind", ["joint", "marian"])
def test_special_ids_never_reach_the_text(trained_tokenizer, marian_tokenizer: Tokenizer, kind: str):
    tokenizer = trained_tokenizer[0] if kind == "joint" else marian_tokenizer
    special = tokenizer.special_ids
    [ids] = tokenizer.encode_target(["a dog runs"])
    assert tokenizer.decode([[special.bos, *ids, special.eos, special.pad, special.pad]]) == tokenizer.decode([ids])
    assert tokenizer.decode([ids]) == ["a dog runs"]
