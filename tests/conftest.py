"""Fixtures shared by every test package."""

from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def multi30k() -> Path:
    if not (MULTI30K / "test_2016_flickr.en.gz").exists():
        pytest.skip(f"Multi30k corpus not found at {MULTI30K} (place it in ../shared/data/multi30k)")
    return MULTI30K
