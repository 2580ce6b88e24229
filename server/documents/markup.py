"""Markup and placeholders kept through translation.

A text is parsed into a ``ParsedText``: raw parts the model never sees (block tags, comments in
between blocks, ``<script>``, ``translate="no"`` content) and ``Piece``s, the runs of text between
block boundaries that the model translates. A piece holds its plain text, the inline elements
(``<b>``, ``<a href>``…) that enclosed each character, and its *atoms*: what must come back byte
for byte and is taken out of the text before translation (placeholders such as ``{name}``,
``%1$s`` or ``${x}``, URLs, e-mail addresses, numbers with units, inline void elements like
``<img>``, untranslatable inline elements like ``<code>``).

After translation, server/documents/placement.py puts them back. HTML is read into an element tree by
server/documents/html_tree.py (the standard library's ``html.parser``); only the protected patterns are regular
expressions.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from server.documents.html_tree import VOID, HtmlTree, Node, Raw
from server.errors import InvalidRequest

FORMATS = ("text", "html")

# What comes back byte-identical in both formats, first match wins. Every pattern's work is linear in the text:
# a pattern that may start anywhere in a run (an address's or a number's) starts only at the run's start, and
# printf's flags, width, precision and position are bounded; unbounded, 20,000 digits took 27 s of CPU.
PROTECTED = re.compile(
    r"""
      (?:https?|ftp)://[^\s<>"']*[^\s<>"'.,;:!?)\]]     # URLs
    | www\.[^\s<>"']*[^\s<>"'.,;:!?)\]]
    | (?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+         # e-mail addresses
    | \{\{[^{}]*\}\}                                    # {{mustache}}
    | \$\{[^{}]*\}                                      # ${x}
    | \{[\w.:,-]*\}                                     # {name} {0} {} {count:d}
    | %\([\w]+\)[-+0#]{0,4}\d{0,3}(?:\.\d{1,3})?[sdifxXeEgGcr]      # %(name)s
    | %(?:\d{1,3}\$)?[-+0#]{0,4}\d{0,3}(?:\.\d{1,3})?[sdifuxXeEgGcp@]   # %s %d %1$s %.2f %@
    | [$€£¥]\s?\d+(?:[.,]\d+)*                          # $5 €10.50
    | (?<!\d)(?<!\d[.,])\d+(?:[.,]\d+)*\s?(?:%|°[CF]|[$€£¥]  # 10% 20 °C 5 €, and 12 km 3.5 GB…
        |(?:km/h|mph|km|kg|mg|cm|mm|ml|GB|MB|KB|TB|GiB|MiB|KiB|px|em|rem|ms|min|g|m|l|h|s)(?!\w))
    """,
    re.VERBOSE,
)
# A character or pair every protected pattern starts with or holds; a text without one has nothing to protect,
# and finding that out is 5x cheaper than trying every pattern at every position (4 MiB of letters: 0.06 s, not 0.33).
MAY_PROTECT = re.compile(r"[@{%$€£¥\d]|://|www\.")
PUNCTUATION = ".,;:!?)\\]}»“”\"'…"  # closing punctuation: a word of its own, as in "<b>Hund</b>."
CLOSING_PUNCTUATION = re.compile(f"^[{PUNCTUATION}]+$")
# Words as unit_spans makes them from tokens: runs of closing punctuation, and runs of anything else
# but whitespace.
WORD = re.compile(f"[{PUNCTUATION}]+|[^\\s{PUNCTUATION}]+")
SPACE_TAIL = re.compile(r"\s*$")


@dataclass
class Element:
    """An inline element of a piece."""

    start: str  # its start tag, as sent
    end: str = ""  # its end tag, as sent
    parent: int | None = None  # the element enclosing it, in the same piece
    offset: int = 0  # where it starts in the piece's text


@dataclass
class Atom:
    text: str  # what is written back, byte for byte
    offset: int  # where in the piece's text it was taken out
    before: str  # the whitespace before it in the source
    path: tuple[int, ...]  # the inline elements enclosing it, outermost first
    # Characters of the piece's text from offset that it stands for: a glossary term (server/documents/glossary.py)
    # stays in the text the model reads, and the atom replaces the output words aligned to it; 0 for an atom taken out
    covers: int = 0


@dataclass
class Piece:
    """A run of text between block boundaries, with its inline markup and atoms."""

    html: bool
    text: str = ""
    paths: list[tuple[int, ...]] = field(default_factory=list)  # per character of text
    elements: list[Element] = field(default_factory=list)
    atoms: list[Atom] = field(default_factory=list)
    source: list[str] = field(default_factory=list)  # the piece as sent, for pieces with nothing to translate
    _open: list[int] = field(default_factory=list)

    @property
    def translatable(self) -> bool:
        return any(c.isalnum() for c in self.text)

    @property
    def plain(self) -> bool:
        """Nothing to put back: the text is translated as any other."""
        return not self.elements and not self.atoms

    def add_text(self, text: str) -> None:
        self.source.append(html.escape(text, quote=False) if self.html else text)
        position = 0
        for match in PROTECTED.finditer(text) if MAY_PROTECT.search(text) else ():
            self._append(text[position : match.start()])
            self.add_atom(html.escape(match.group(), quote=False) if self.html else match.group(), record=False)
            position = match.end()
        self._append(text[position:])

    def _append(self, text: str) -> None:
        if not text:
            return
        if self.atoms and self.atoms[-1].offset == len(self.text):  # right after an atom: no double spaces,
            if self.text[-1:].isspace() and text[0].isspace():  # no space before closing punctuation
                text = text.lstrip()
            elif self.text[-1:].isspace() and CLOSING_PUNCTUATION.match(text[0]):
                self.text = self.text.rstrip()
                del self.paths[len(self.text) :]
                for atom in reversed(self.atoms):  # in order of offset: only the last ones were past the space
                    if atom.offset <= len(self.text):
                        break
                    atom.offset = len(self.text)
        self.text += text
        self.paths += [tuple(self._open)] * len(text)

    def add_atom(self, text: str, record: bool = True) -> None:
        if record:
            self.source.append(text)
        previous = self.atoms[-1].offset if self.atoms else 0
        before = "" if self.atoms and previous == len(self.text) else SPACE_TAIL.search(self.text[previous:]).group()
        self.atoms.append(Atom(text, len(self.text), before, tuple(self._open)))

    def open(self, start: str) -> None:
        self.source.append(start)
        parent = self._open[-1] if self._open else None
        self.elements.append(Element(start, parent=parent, offset=len(self.text)))
        self._open.append(len(self.elements) - 1)

    def close(self, end: str) -> None:
        self.source.append(end)
        self.elements[self._open.pop()].end = end


@dataclass
class ParsedText:
    parts: list[str | Piece]

    @property
    def pieces(self) -> list[Piece]:
        """The pieces to translate, in order."""
        return [p for p in self.parts if isinstance(p, Piece) and p.translatable]

    def render(self, translations: Sequence[str]) -> str:
        """The document with its pieces replaced by ``translations`` (one per ``pieces``, in order)."""
        it = iter(translations)
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif part.translatable:
                out.append(next(it))
            else:
                out.append("".join(part.source))
        return "".join(out)


def parse(text: str, format: str) -> ParsedText:
    """The document of a request text; raises MarkupError for malformed HTML."""
    if format == "text":
        piece = Piece(html=False)
        piece.add_text(text)
        return ParsedText([piece])
    if format != "html":
        raise InvalidRequest(f"format={format!r} is not supported; use one of {', '.join(FORMATS)}")
    root = HtmlTree(text).parse()
    parts: list[str | Piece] = []
    _walk(root, text, parts)
    return ParsedText([p for p in parts if not (isinstance(p, Piece) and not p.source)])


def _walk(node: Node, source: str, parts: list[str | Piece]) -> None:
    """Flattens the tree into raw parts and pieces (the last part, when a piece, is the open one)."""

    def piece() -> Piece:
        if not parts or not isinstance(parts[-1], Piece):
            parts.append(Piece(html=True))
        return parts[-1]

    for child in node.children:
        if isinstance(child, str):
            piece().add_text(child)
        elif isinstance(child, Raw):
            piece().add_atom(child.text)
        elif child.inline and (child.tag in VOID or not child.translated):
            piece().add_atom(source[child.begin : child.end_offset])
        elif child.inline:
            piece().open(child.start)
            _walk(child, source, parts)
            piece().close(child.end)
        elif child.tag in VOID or not child.translated:
            parts.append(source[child.begin : child.end_offset])
        else:
            parts.append(child.start)
            _walk(child, source, parts)
            parts.append(child.end)
