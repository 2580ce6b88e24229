"""The exported default models (en→de, de→en): translations identical to PyTorch, int8 quality."""

from __future__ import annotations

from pathlib import Path

import pytest
import sacrebleu

from export.__main__ import main as export
from export.runtime import OrtModel, RuntimeOptions
from model.checkpoint import DEFAULT_CHECKPOINT, DEFAULT_DE_EN_CHECKPOINT, length_penalty, load_checkpoint
from model.corpus import corpus_path, read_lines
from model.translate import TorchTranslator
from tests.conftest import MULTI30K, OWN_SENTENCES, own_sentences

# checkpoint, source and target language
DIRECTIONS = {"en-de": (DEFAULT_CHECKPOINT, "en", "de"), "de-en": (DEFAULT_DE_EN_CHECKPOINT, "de", "en")}


@pytest.fixture(scope="module", params=list(DIRECTIONS))
def direction(request) -> tuple[Path, str, str]:
    return DIRECTIONS[request.param]


@pytest.fixture(scope="module")
def default_export(direction, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("default_export") / "model"
    assert export(["--checkpoint", str(direction[0]), "--out", str(out), "--int8"]) == 0
    return out


def parity_sentences(source: str, n: int = 200) -> list[str]:
    """test_2016_flickr when the corpus is there, our own sentences otherwise."""
    if (MULTI30K / f"test_2016_flickr.{source}.gz").exists():
        return read_lines(corpus_path(MULTI30K, "test_2016_flickr", source))[:n]
    if source == "en":
        return own_sentences(n)
    return [german for _, german in OWN_SENTENCES] * (n // len(OWN_SENTENCES))


@pytest.mark.parametrize("beam", [1, 4])
def test_onnx_translations_identical_to_pytorch(direction, default_export: Path, beam: int):
    checkpoint, source, _ = direction
    model, tokenizer = load_checkpoint(checkpoint)
    sentences = parity_sentences(source)
    assert len(sentences) >= 200
    expected = TorchTranslator(model, tokenizer, length_penalty=length_penalty(checkpoint)).translate(
        sentences, beam=beam
    )
    actual = OrtModel(default_export, RuntimeOptions(provider="cpu")).translate(sentences, beam=beam)
    mismatches = [(s, e, a) for s, e, a in zip(sentences, expected, actual, strict=True) if e != a]
    assert not mismatches, mismatches[:5]


def test_int8_bleu_drop_is_small(direction, default_export: Path, multi30k: Path):
    _, source, target = direction
    sources = read_lines(corpus_path(multi30k, "test_2016_flickr", source))
    references = read_lines(corpus_path(multi30k, "test_2016_flickr", target))
    scores = {}
    for variant in ("fp32", "int8"):
        runtime = OrtModel(default_export, RuntimeOptions(variant=variant, provider="cpu"))
        scores[variant] = sacrebleu.corpus_bleu(runtime.translate(sources), [references]).score
    assert scores["fp32"] - scores["int8"] <= 0.5, scores
