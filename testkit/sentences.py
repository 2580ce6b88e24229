"""Sentences the tests and benchmarks send: in the default model's domain, written for them (not from the corpus);
and short texts cut from the corpus's sentences."""

from __future__ import annotations

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


def first_words(sentences: list[str]) -> list[str]:
    """Each sentence's first one, two or three words, in turn: short texts, where language detectors differ."""
    return [" ".join(s.split()[: 1 + i % 3]) for i, s in enumerate(sentences)]
