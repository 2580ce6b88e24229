"""Letter case between a request's text and the model, which learnt from text in ordinary case: a sentence written
in capitals ("A MAN RIDES A BIKE.") is translated in the case the model knows and written back in capitals; an
all-lower-case text, where its translation is lower-cased anyway (LibreTranslate's mirroring), is translated in
that case too. Every change here is one character for one, so offsets in a changed sentence are offsets in its
source.

The case the model knows is sentence case, with a truecaser's guess taken from the model's own tokenizer: a word
its vocabulary writes in fewer pieces capitalized ("John", "York", German nouns: "Mann") is capitalized, and so is
English's "I"; in German, which capitalizes its nouns, a word its vocabulary ranks more common capitalized too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

# A run of letters that starts a word: at the start, or after whitespace, an opening quote or bracket (not inside
# "red-haired" or "don't", whose second part a tokenizer never reads as a word of its own)
WORD = re.compile(r"(?<![^\s\"“‘„‚«‹(\[¿¡])[^\W\d_]+")
CAPITALIZED_EVERYWHERE = {"en": frozenset({"i"})}  # words written capitalized wherever they stand, by language
# Languages that capitalize every noun: where both forms of a word take as many pieces, the one whose rarest piece
# the vocabulary ranks more common (a lower id) wins ("Kind", "Hund"); elsewhere a tie stays lower case (a joint
# vocabulary ranks English "kind" by the German noun's count)
RANKED_TIES = frozenset({"de"})


def fold(text: str) -> str:
    """Lower case, one character for one, so that offsets in the folded text are offsets in the text."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(low if len(low := c.lower()) == 1 else c for c in text)


def in_capitals(sentence: str) -> bool:
    """Written in capitals: no lower-case letter and at least two capitals (a lone "I" or "A" reads the same in
    either case)."""
    return sentence.isupper() and sum(c.isupper() for c in sentence) >= 2


def capitalized(word: str) -> str:
    """The word with its first letter upper case, when that is one character."""
    first = word[:1].upper()
    return first + word[1:] if len(first) == 1 else word


def model_case(sentences: Sequence[str], tokenize: Callable[[list[str]], list[list[int]]], language: str) -> list[str]:
    """Each sentence in the case the model knows (module docstring), the same length as the sentence; one
    tokenizer call for the words of all of them."""
    lowered = [fold(sentence) for sentence in sentences]
    words = sorted({word for sentence in lowered for word in WORD.findall(sentence)})
    pieces = tokenize(words + [capitalized(word) for word in words]) if words else []
    ranked = language in RANKED_TIES
    capital = {
        word
        for word, lower, upper in zip(words, pieces[: len(words)], pieces[len(words) :], strict=True)
        if _more_common(upper, lower, ranked)
    }
    capital |= CAPITALIZED_EVERYWHERE.get(language, frozenset())
    cased = []
    for sentence in lowered:
        sentence = WORD.sub(lambda match: capitalized(match[0]) if match[0] in capital else match[0], sentence)
        first = next((i for i, c in enumerate(sentence) if c.isalpha()), None)
        if first is not None:
            sentence = sentence[:first] + capitalized(sentence[first]) + sentence[first + 1 :]
        cased.append(sentence)
    return cased


def _more_common(pieces: list[int], other: list[int], ranked: bool) -> bool:
    """Whether a word's pieces say its form is the more common: fewer pieces, or with ``ranked`` as many with a
    rarest piece of lower id (a tokenizer's ids rank its pieces by frequency)."""
    if len(pieces) != len(other):
        return len(pieces) < len(other)
    return ranked and max(pieces, default=0) < max(other, default=0)


def written(text: str, capitals: bool) -> str:
    """A translation as its source was written: in capitals when the source was."""
    return text.upper() if capitals else text
