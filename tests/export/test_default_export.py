"""The exported default model: translations identical to PyTorch, int8 quality."""

from __future__ import annotations

from pathlib import Path

import pytest
import sacrebleu

from export.__main__ import main as export
from export.runtime import OrtModel, RuntimeOptions
from model.checkpoint import DEFAULT_CHECKPOINT, length_penalty, load_checkpoint
from model.corpus import corpus_path, read_lines
from model.translate import TorchTranslator
from tests.conftest import MULTI30K, own_sentences


@pytest.fixture(scope="module")
def default_export(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("default_export") / "model"
    assert export(["--out", str(out), "--int8"]) == 0
    return out


def parity_sentences(n: int = 200) -> list[str]:
    """test_2016_flickr when the corpus is there, our own sentences otherwise."""
    if (MULTI30K / "test_2016_flickr.en.gz").exists():
        return read_lines(corpus_path(MULTI30K, "test_2016_flickr", "en"))[:n]
    return own_sentences(n)


@pytest.mark.parametrize("beam", [1, 4])
def test_onnx_translations_identical_to_pytorch(default_export: Path, beam: int):
    model, tokenizer = load_checkpoint(DEFAULT_CHECKPOINT)
    sentences = parity_sentences()
    assert len(sentences) >= 200
    expected = TorchTranslator(model, tokenizer, length_penalty=length_penalty(DEFAULT_CHECKPOINT)).translate(
        sentences, beam=beam
    )
    actual = OrtModel(default_export, RuntimeOptions(provider="cpu")).translate(sentences, beam=beam)
    mismatches = [(s, e, a) for s, e, a in zip(sentences, expected, actual, strict=True) if e != a]
    assert not mismatches, mismatches[:5]


def test_int8_bleu_drop_is_small(default_export: Path, multi30k: Path):
    sources = read_lines(corpus_path(multi30k, "test_2016_flickr", "en"))
    references = read_lines(corpus_path(multi30k, "test_2016_flickr", "de"))
    scores = {}
    for variant in ("fp32", "int8"):
        runtime = OrtModel(default_export, RuntimeOptions(variant=variant, provider="cpu"))
        scores[variant] = sacrebleu.corpus_bleu(runtime.translate(sources), [references]).score
    assert scores["fp32"] - scores["int8"] <= 0.5, scores
