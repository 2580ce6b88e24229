"""Glossaries: source terms the caller wants translated as given target terms.

A ``Glossary`` finds its terms in a document's pieces (server/documents/markup.py) as whole words, case-insensitively
unless asked otherwise, the longest first and never two overlapping, with an Aho-Corasick automaton
(pyahocorasick), so that the work is linear in the text and not in the glossary. Each occurrence becomes an
*atom that covers its words*: the words stay in the text the model reads (it translates the sentence around
them as it would), and server/documents/placement.py writes the target term in place of the output words aligned to
them, or, where none is, before the word aligned to the source word after them, as any atom. So the target term is in
the output once per occurrence, verbatim (capitalised where the occurrence started a sentence with a capital), and
nothing of the mechanism reaches the output. Matching only sees the pieces' text: tags, attributes,
``notranslate`` spans and protected atoms (placeholders, URLs…) were taken out of it before.
"""

from __future__ import annotations

import csv
import functools
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import ahocorasick

from server.documents.casing import fold
from server.documents.markup import Atom, ParsedText, Piece
from server.errors import InvalidRequest

MAX_INLINE_ENTRIES = 1_000  # entries in a request's own glossary; more belong in a stored one
MAX_STORED_ENTRIES = 10_000  # entries in a stored glossary (DeepL's limit is by size, about as many)
MAX_TERM_CHARS = 200  # a term's characters, source or target
KEPT_INLINE = 256  # inline glossaries whose matcher a process keeps, by their entries (least recently used go)
MAX_NAME_CHARS = 200
ENTRY_FORMATS = ("tsv", "csv", "json")
SENTENCE_END = ".!?…:\"'»”"


@dataclass(frozen=True)
class Occurrence:
    start: int
    end: int
    key: str  # the entry's source term, as the glossary holds it


@dataclass(frozen=True, eq=False)
class Glossary:
    """Source term → target term, for one language pair ("" where any: an inline glossary takes the request's)."""

    entries: Mapping[str, str]
    source_language: str = ""
    target_language: str = ""
    case_sensitive: bool = False
    name: str = ""
    glossary_id: str = ""

    @cached_property
    def _automaton(self) -> ahocorasick.Automaton:
        automaton = ahocorasick.Automaton()
        for source in self.entries:
            folded = source if self.case_sensitive else fold(source)
            automaton.add_word(folded, (source, len(folded)))
        automaton.make_automaton()
        return automaton

    def find(self, text: str) -> list[Occurrence]:
        """The entries' whole-word occurrences in ``text``: the longest first (then the leftmost), none overlapping,
        in order of position."""
        if not self.entries or not text:
            return []
        haystack = text if self.case_sensitive else fold(text)
        found = []
        for last, (key, length) in self._automaton.iter(haystack):
            start, end = last + 1 - length, last + 1
            if _bounded(text, start, end):
                found.append(Occurrence(start, end, key))
        taken = bytearray(len(text))
        chosen = []
        for occurrence in sorted(found, key=lambda o: (o.start - o.end, o.start)):
            if not any(taken[occurrence.start : occurrence.end]):
                taken[occurrence.start : occurrence.end] = b"\x01" * (occurrence.end - occurrence.start)
                chosen.append(occurrence)
        return sorted(chosen, key=lambda o: o.start)

    def check_pair(self, source_language: str, target_language: str) -> None:
        """InvalidRequest unless the glossary is for this pair (or for any)."""
        for mine, theirs in ((self.source_language, source_language), (self.target_language, target_language)):
            if mine and mine != theirs:
                named = f"glossary {self.name or self.glossary_id!r}"
                raise InvalidRequest(
                    f"{named} is for {self.source_language}→{self.target_language}, not the request's "
                    f"{source_language}→{target_language}: use a glossary of that pair"
                )

    def apply(self, documents: Sequence[ParsedText]) -> tuple[list[ParsedText], list[list[str]]]:
        """The documents with each occurrence made an atom of its piece (see the module's doc), new pieces where
        one matched (``documents`` are left as they are); and per document, the entries applied (their source
        terms), one per occurrence, in order."""
        glossed, applied = [], []
        for document in documents:
            parts, keys = [], []
            for part in document.parts:
                if isinstance(part, Piece) and part.translatable:
                    part, found = self._apply(part)
                    keys += found
                parts.append(part)
            glossed.append(ParsedText(parts) if keys else document)
            applied.append(keys)
        return glossed, applied

    def _apply(self, piece: Piece) -> tuple[Piece, list[str]]:
        """The piece with its occurrences as atoms (a new one where any matched), and the entries applied."""
        atoms, applied = [], []
        inside = sorted(atom.offset for atom in piece.atoms)
        for occurrence in self.find(piece.text):
            start, end = occurrence.start, occurrence.end
            if any(start < offset < end for offset in inside) or len(set(piece.paths[start:end])) > 1:
                continue  # across a placeholder or an inline element's edge: the words are not one term there
            target = self.entries[occurrence.key]
            if _starts_sentence(piece.text, start) and piece.text[start].isupper() and target[:1].islower():
                target = target[0].upper() + target[1:]
            text = html.escape(target, quote=False) if piece.html else target
            before = piece.text[:start][len(piece.text[:start].rstrip()) :]
            atoms.append(Atom(text, start, before, piece.paths[start], covers=end - start))
            applied.append(occurrence.key)
        if not atoms:
            return piece, applied
        # in order of offset, an atom taken out at a term's start before the term
        return replace(
            piece, atoms=sorted(piece.atoms + atoms, key=lambda atom: (atom.offset, atom.covers > 0))
        ), applied


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _bounded(text: str, start: int, end: int) -> bool:
    """Whole words: no word character runs on past either end of a term that ends in one."""
    if _word(text[start]) and start > 0 and _word(text[start - 1]):
        return False
    return not (_word(text[end - 1]) and end < len(text) and _word(text[end]))


def _starts_sentence(text: str, start: int) -> bool:
    before = text[:start].rstrip()
    return not before or before[-1] in SENTENCE_END


# --- entries and limits ----------------------------------------------------------------------------------------


def checked_entries(entries: Any, limit: int, what: str, case_sensitive: bool = False) -> dict[str, str]:
    """Entries as a glossary holds them (terms stripped), or InvalidRequest naming the rule they break."""
    if not isinstance(entries, Mapping):
        raise InvalidRequest(f'{what} must be an object of source term → target term, e.g. {{"bike": "Velo"}}')
    if len(entries) > limit:
        raise InvalidRequest(f"{what} has {len(entries)} entries, over the limit of {limit} entries")
    checked: dict[str, str] = {}
    seen: dict[str, str] = {}
    for source, target in entries.items():
        if not isinstance(source, str) or not isinstance(target, str):
            raise InvalidRequest(f"{what}: each source and target term must be a string")
        source, target = source.strip(), target.strip()
        if not source or not target:
            raise InvalidRequest(f"{what}: a source or target term is empty (entry {source!r} → {target!r})")
        longest = max(len(source), len(target))
        if longest > MAX_TERM_CHARS:
            raise InvalidRequest(
                f"{what}: a term has {longest} characters, over the limit of {MAX_TERM_CHARS} characters per term"
            )
        key = source if case_sensitive else fold(source)
        if key in seen:
            raise InvalidRequest(f"{what}: {seen[key]!r} and {source!r} are the same source term")
        seen[key] = source
        checked[source] = target
    return checked


def inline_glossary(value: Any, field: str = "glossary") -> Glossary | None:
    """A request's own glossary: an object, or (a form's field) its JSON text; None when absent or empty."""
    if value in (None, "", {}):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise InvalidRequest(f"{field} is not valid JSON ({e.msg}); send an object of source → target") from e
    if not (isinstance(value, Mapping) and all(isinstance(t, str) for entry in value.items() for t in entry)):
        value = checked_entries(value, MAX_INLINE_ENTRIES, field)  # says what is wrong
    return _kept_glossary(field, tuple(value.items()))


@functools.lru_cache(maxsize=KEPT_INLINE)
def _kept_glossary(field: str, sent: tuple[tuple[Any, Any], ...]) -> Glossary:
    """An inline glossary as sent, checked and its matcher built once for the requests that send the same entries
    (a client sends its glossary with every request: checking 50 entries and building their matcher each time
    cost about 0.4 ms, 8% of a single-sentence request's CPU; benchmarks/glossary_cost.md). Entries that break a
    rule raise, and an error is never kept."""
    return Glossary(checked_entries(dict(sent), MAX_INLINE_ENTRIES, field))


def parse_entries(text: str, entries_format: str) -> dict[str, Any]:
    """DeepL's entry formats: TSV or CSV lines of source and target term (further columns, as DeepL's CSV
    languages, are ignored), or a JSON object."""
    entries_format = entries_format.lower()
    if entries_format == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidRequest(f"entries are not valid JSON ({e.msg}); send an object of source → target") from e
    if entries_format not in ENTRY_FORMATS:
        raise InvalidRequest(
            f"entries_format={entries_format!r} is not supported; use one of {', '.join(ENTRY_FORMATS)}"
        )
    # Lines as str.splitlines sees them (a lone carriage return ends one too), so the csv module never meets a
    # line break inside an unquoted field; a term holds none.
    rows = csv.reader(text.splitlines(), delimiter="\t" if entries_format == "tsv" else ",")
    entries: dict[str, Any] = {}
    try:
        for number, row in enumerate(rows, 1):
            if not any(cell.strip() for cell in row):
                continue
            if len(row) < 2:
                separator = "," if entries_format == "csv" else "<TAB>"
                raise InvalidRequest(f"entries line {number} has no target term: send source{separator}target")
            if row[0].strip() in entries:
                raise InvalidRequest(f"entries line {number}: {row[0].strip()!r} is there twice")
            entries[row[0].strip()] = row[1]
    except csv.Error as e:  # a field past the csv module's size limit, a stray quote...
        raise InvalidRequest(f"entries are not valid {entries_format.upper()} ({e}); send one entry per line") from e
    return entries
