"""Fixtures shared by every test package."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from common.corpus import MULTI30K
from testkit.sentences import OWN_SENTENCES, own_sentences

if TYPE_CHECKING:
    from runtime.tokenizer import Tokenizer

pytest_plugins = ["tests.torch_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_TEXTS = ["a man rides a horse", "zwei hunde spielen im schnee", "a dog runs", "ein mann fährt fahrrad"] * 50


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--provider",
        default="cpu",
        choices=["cpu", "cuda"],
        help="execution provider of the engine's device-path tests (IOBinding, device cache, fp16): cpu runs "
        "the CUDA code paths on the CPU provider; cuda runs them on a GPU (onnxruntime-gpu)",
    )


@pytest.fixture(scope="session")
def provider(request: pytest.FixtureRequest) -> str:
    """The provider the device-path tests run on (``pytest --provider cuda`` on a GPU machine)."""
    return request.config.getoption("--provider")


@pytest.fixture(scope="session")
def multi30k() -> Path:
    if not (MULTI30K / "test_2016_flickr.en.gz").exists():
        pytest.skip(f"Multi30k corpus not found at {MULTI30K} (common/corpus.py's MULTI30K: place it there)")
    return MULTI30K


@pytest.fixture(scope="session")
def trained_tokenizer() -> tuple[Tokenizer, bytes]:
    """A joint sentencepiece tokenizer trained on a few English and German phrases, and its serialized model."""
    from runtime.tokenizer import Tokenizer

    return Tokenizer.train(TOKENIZER_TEXTS, vocab_size=40)


def make_tiny_checkpoint(directory: Path, seed: int, metadata: dict, decoder_layers: int = 2) -> Path:
    """A random-weight model (``seed``) with a real (small) sentencepiece tokenizer, saved as a checkpoint."""
    import torch

    from model.checkpoint import save_checkpoint
    from model.transformer import Transformer
    from runtime.model_config import ModelConfig
    from runtime.tokenizer import Tokenizer

    texts = own_sentences(240) + [german for _, german in OWN_SENTENCES]
    tokenizer, blob = Tokenizer.train(texts * 3, vocab_size=120)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=decoder_layers,
        d_ff=64,
        dropout=0.0,
    )
    torch.manual_seed(seed)
    save_checkpoint(directory, Transformer(config), blob, metadata)
    return directory


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A random-weight model with a real (small) sentencepiece tokenizer, saved as a checkpoint."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_checkpoint"), 0, {"name": "tiny-test"})


@pytest.fixture(scope="session")
def tiny_export(tiny_checkpoint: Path, tmp_path_factory) -> Path:
    """The tiny checkpoint exported with every variant."""
    from export.__main__ import main

    out = tmp_path_factory.mktemp("tiny_export") / "model"
    assert main(["--checkpoint", str(tiny_checkpoint), "--out", str(out), "--int8", "--fp16"]) == 0
    return out


@pytest.fixture(scope="session")
def tiny_reverse_export(tmp_path_factory) -> Path:
    """A second tiny model (other random weights) named as German→English, exported (fp32 only): the other
    half of a two-model server."""
    from export.__main__ import main

    metadata = {"name": "tiny-de-en", "source_language": "de", "target_language": "en"}
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_reverse_checkpoint"), 1, metadata)
    out = tmp_path_factory.mktemp("tiny_reverse_export") / "model"
    assert main(["--checkpoint", str(checkpoint), "--out", str(out)]) == 0
    return out
