"""LibreTranslate's finishing of a plain text's translation, each a default a request can turn off
(``TranslateOptions.mirror_formatting`` and ``pass_through``; HTTP fields and gRPC TranslateOptions of the same
names):

- ``mirror``: the translation takes the source's final punctuation and its case. An all-lower-case source gives
  an all-lower-case translation, an all-capitals one all capitals; otherwise the translation's first letter
  takes the case of the source's. A source ending in one of PUNCTUATION ends its translation with the same
  mark; a source ending in none takes the model's mark off the translation's end ("Hello world" gives
  "Hallo Welt", not "Hallo Welt.").
- ``nothing_to_translate``: a text without a letter of any script (emoji, symbols, digits, punctuation) is its
  own translation; the model never sees it (models write words for emoji they never learnt).
"""

from __future__ import annotations

from collections.abc import Sequence

# The final marks mirrored: LibreTranslate's, with the ideographic full stop
PUNCTUATION = frozenset("!?.,;。")


def mirrored(sources: Sequence[str], renders: Sequence[Sequence[str]]) -> list[list[str]]:
    """Each render (a translation of every text, or an alternative's) with each text's mirrored onto it."""
    return [list(map(mirror, sources, render)) for render in renders]


def nothing_to_translate(text: str) -> bool:
    """True for a text with something in it but no letter of any script."""
    return bool(text.strip()) and not any(character.isalpha() for character in text)


def mirror(source: str, translation: str) -> str:
    """The translation with the source's final punctuation and case (module docstring); whitespace around
    both kept as the translation has it."""
    source, body = source.strip(), translation.strip()
    if not source or not body:
        return translation
    if source[-1] in PUNCTUATION:
        body = (body[:-1] if body[-1] in PUNCTUATION else body) + source[-1]
    elif body[-1] in PUNCTUATION:
        body = body[:-1].rstrip()
    if source.islower():
        body = body.lower()
    elif source.isupper():
        body = body.upper()
    elif source[0].isalpha() and body[0].isalpha():
        body = (body[0].upper() if source[0].isupper() else body[0].lower()) + body[1:]
    start = len(translation) - len(translation.lstrip())
    return translation[:start] + body + translation[start + len(translation.strip()) :]
