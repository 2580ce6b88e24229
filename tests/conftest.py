"""Fixtures shared by every test package."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.torch_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"

# Sentences written for these tests (not from the corpus), in the default model's
# domain, with our own reference translations.
OWN_SENTENCES = [
    ("A man is riding a bicycle down the street.", "Ein Mann fährt mit einem Fahrrad die Straße hinunter."),
    ("Two dogs are playing in the snow.", "Zwei Hunde spielen im Schnee."),
    ("A woman is sitting on a bench in the park.", "Eine Frau sitzt auf einer Bank im Park."),
    ("A young boy plays soccer on a green field.", "Ein kleiner Junge spielt Fußball auf einem grünen Feld."),
    ("Three people are walking on the beach.", "Drei Personen gehen am Strand spazieren."),
    ("A little girl is eating an ice cream.", "Ein kleines Mädchen isst ein Eis."),
    ("A black dog is running through the grass.", "Ein schwarzer Hund rennt durch das Gras."),
    ("Two men are playing basketball.", "Zwei Männer spielen Basketball."),
    ("A group of people stand in front of a building.", "Eine Gruppe von Menschen steht vor einem Gebäude."),
    ("A man in a red shirt is climbing a rock.", "Ein Mann in einem roten Hemd klettert einen Felsen hinauf."),
]


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
        pytest.skip(f"Multi30k corpus not found at {MULTI30K} (place it in ../shared/data/multi30k)")
    return MULTI30K


def own_sentences(n: int) -> list[str]:
    """n distinct English sentences of the default model's domain, generated from templates."""
    subjects = [
        "A man",
        "A woman",
        "A young boy",
        "A little girl",
        "Two dogs",
        "An old man",
        "Three children",
        "A black cat",
    ]
    verbs = ["is walking", "is running", "is sitting", "is playing", "is standing", "is waiting"]
    places = ["on the street", "in the park", "near the water", "in front of a building", "on the grass"]
    sentences = [f"{s} {v} {p}." for s in subjects for v in verbs for p in places]
    return sentences[:n]


def make_tiny_checkpoint(directory: Path, seed: int, metadata: dict) -> Path:
    """A random-weight model (``seed``) with a real (small) sentencepiece tokenizer, saved as a checkpoint."""
    import torch

    from model.checkpoint import save_checkpoint
    from model.config import ModelConfig
    from model.transformer import Transformer
    from runtime.tokenizer import Tokenizer

    texts = own_sentences(240) + [german for _, german in OWN_SENTENCES]
    tokenizer, blob = Tokenizer.train(texts * 3, vocab_size=120)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
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
