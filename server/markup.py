"""Markup and placeholders kept through translation.

A text is parsed into a ``Document``: raw parts the model never sees (block tags, comments in
between blocks, ``<script>``, ``translate="no"`` content) and ``Piece``s, the runs of text between
block boundaries that the model translates. A piece holds its plain text, the inline elements
(``<b>``, ``<a href>``…) that enclosed each character, and its *atoms*: what must come back byte
for byte and is taken out of the text before translation (placeholders such as ``{name}``,
``%1$s`` or ``${x}``, URLs, e-mail addresses, numbers with units, inline void elements like
``<img>``, untranslatable inline elements like ``<code>``).

After translation, server/placement.py puts them back. HTML is parsed by the standard library's
``html.parser``; only the protected patterns are regular expressions.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser

from server.errors import InvalidRequest

FORMATS = ("text", "html")


def _tags(names: str) -> frozenset[str]:
    return frozenset(names.split())


# Elements that stay inside a sentence; every other element is a block and splits the text there.
INLINE = _tags("a abbr b bdi bdo cite data del dfn em font i ins mark q s small span strong sub sup time u")
# Void elements kept inside a sentence, as atoms (<br>, <hr> and the others split it).
INLINE_VOID = frozenset({"img", "input", "wbr"})
VOID = _tags("area base br col embed hr img input link meta param source track wbr")
# Content never translated: kept as it was sent (inline ones as atoms).
UNTRANSLATED = _tags("script style code kbd samp var pre textarea svg math template noscript")
INLINE_UNTRANSLATED = frozenset({"code", "kbd", "samp", "var"})

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


class MarkupError(InvalidRequest):
    """Markup that is not well-formed: the message names the tag and where it is."""


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
                for atom in self.atoms:
                    atom.offset = min(atom.offset, len(self.text))
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
class Document:
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


def parse(text: str, format: str) -> Document:
    """The document of a request text; raises MarkupError for malformed HTML."""
    if format == "text":
        piece = Piece(html=False)
        piece.add_text(text)
        return Document([piece])
    if format != "html":
        raise InvalidRequest(f"format={format!r} is not supported; use one of {', '.join(FORMATS)}")
    root = _Tree(text).parse()
    parts: list[str | Piece] = []
    _walk(root, text, parts)
    return Document([p for p in parts if not (isinstance(p, Piece) and not p.source)])


@dataclass
class _Node:
    tag: str
    attrs: dict[str, str | None]
    start: str  # the start tag as sent
    begin: int  # offsets of the whole element in the source
    end_offset: int = -1
    end: str = ""
    children: list[_Node | str | _Raw] = field(default_factory=list)

    @property
    def translated(self) -> bool:
        classes = (self.attrs.get("class") or "").split()
        return self.tag not in UNTRANSLATED and self.attrs.get("translate") != "no" and "notranslate" not in classes

    @property
    def inline(self) -> bool:
        if self.tag in VOID:
            return self.tag in INLINE_VOID
        if not self.translated:
            return self.tag in INLINE or self.tag in INLINE_UNTRANSLATED
        return self.tag in INLINE and all(not isinstance(c, _Node) or c.inline for c in self.children)


@dataclass
class _Raw:
    text: str  # a comment, declaration or processing instruction, as sent


# Bounds on one text's markup: the tree is walked recursively, and placing tags costs more per element than
# translating costs per word (20,000 empty inline elements held a request for 8.4 s of CPU on 2-core x86-64).
MAX_DEPTH = 100
MAX_ELEMENTS = 2000


class _Tree(HTMLParser):
    """The element tree of a fragment, with every element's offsets; raises MarkupError where an
    end tag does not close the innermost open element, an element is never closed, or the markup
    is nested deeper than MAX_DEPTH or has more than MAX_ELEMENTS elements."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self.source = source
        self.root = _Node("", {}, "", 0)
        self.stack = [self.root]
        self.lines = [0] + [m.end() for m in re.finditer("\n", source)]
        self.elements = 0

    def parse(self) -> _Node:
        try:
            self.feed(self.source)
            self.close()
        except AssertionError as e:  # how html.parser refuses a marked section such as "<![ x": the fuzzer's find
            raise MarkupError(f"format=html: a declaration does not parse ({e}); write &lt;! for the text") from e
        if len(self.stack) > 1:
            node = self.stack[-1]
            raise MarkupError(f"format=html: <{node.tag}> at {self._where(node.begin)} is never closed")
        return self.root

    def _offset(self) -> int:
        line, column = self.getpos()
        return self.lines[line - 1] + column

    def _where(self, offset: int) -> str:
        line = sum(1 for start in self.lines if start <= offset)
        return f"line {line}, column {offset - self.lines[line - 1] + 1}"

    def _count(self, tag: str, begin: int) -> None:
        self.elements += 1
        if self.elements > MAX_ELEMENTS:
            raise MarkupError(
                f"format=html: <{tag}> at {self._where(begin)} is element {self.elements:,}; a text may hold "
                f"{MAX_ELEMENTS:,}: send the document in parts"
            )
        if len(self.stack) > MAX_DEPTH:
            raise MarkupError(
                f"format=html: <{tag}> at {self._where(begin)} is nested deeper than {MAX_DEPTH} elements, the limit"
            )

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        raw = self.get_starttag_text() or f"<{tag}>"
        begin = self._offset()
        self._count(tag, begin)
        node = _Node(tag, dict(attrs), raw, begin, begin + len(raw))
        self.stack[-1].children.append(node)
        if tag not in VOID and not raw.endswith("/>"):
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        raw = self.get_starttag_text() or f"<{tag}/>"
        begin = self._offset()
        self._count(tag, begin)
        self.stack[-1].children.append(_Node(tag, dict(attrs), raw, begin, begin + len(raw)))

    def parse_endtag(self, i: int) -> int:
        """html.parser drops "</>" (as browsers do), which would take it out of the text sent back."""
        if self.cdata_elem is None and self.rawdata.startswith("</>", i):
            raise MarkupError(
                f"format=html: </> at {self._where(self._offset())} is an end tag without a name; write &lt;/&gt; "
                "for the text"
            )
        return super().parse_endtag(i)

    def handle_endtag(self, tag: str) -> None:
        begin = self._offset()
        raw = self.source[begin : self.source.index(">", begin) + 1]
        top = self.stack[-1]
        if tag in VOID and top.tag != tag:  # </br>, </img>: browsers ignore them or read <br>; kept as sent
            self.stack[-1].children.append(_Raw(raw))
            return
        if top is self.root:
            raise MarkupError(f"format=html: </{tag}> at {self._where(begin)} closes no open element")
        if top.tag != tag:
            raise MarkupError(
                f"format=html: </{tag}> at {self._where(begin)} while <{top.tag}> from {self._where(top.begin)} is "
                f"still open; close elements in the order they were opened"
            )
        top.end, top.end_offset = raw, begin + len(raw)
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        """Text, in one piece however html.parser hands it over (a bare "<" splits it), so that protected
        patterns are found across such splits."""
        children = self.stack[-1].children
        if children and isinstance(children[-1], str):
            children[-1] += data
        else:
            children.append(data)

    def _raw(self, usual: str) -> _Raw:
        """A comment or declaration as sent. Those that html.parser reads through a parse_* method are replaced
        by exactly what it consumed (``_exactly``); the others are what newer versions report at the end of the
        input for a construct left open ("<!-- x > y"), which runs to the end of the text."""
        begin = self._offset()
        return _Raw(usual if self.source.startswith(usual, begin) else self.source[begin:])

    def _exactly(self, parse: Callable[..., int], i: int, *args: int) -> int:
        """Runs one of html.parser's parse_* methods for a comment, declaration or processing instruction and
        keeps what it consumed, byte for byte, as the raw part its handler added: the parser's own reading
        decides where such a part ends ("<!-- x -- >" ends at "-- >" in some Python versions, not in others)."""
        children = self.stack[-1].children
        count = len(children)
        end = parse(i, *args)
        if end > i and len(children) == count + 1 and isinstance(children[-1], _Raw):
            children[-1] = _Raw(self.rawdata[i:end])
        return end

    def parse_comment(self, i: int, report: int = 1) -> int:
        return self._exactly(super().parse_comment, i, report)

    def parse_html_declaration(self, i: int) -> int:
        return self._exactly(super().parse_html_declaration, i)

    def parse_bogus_comment(self, i: int, report: int = 1) -> int:
        return self._exactly(super().parse_bogus_comment, i, report)

    def parse_pi(self, i: int) -> int:
        return self._exactly(super().parse_pi, i)

    def handle_comment(self, data: str) -> None:
        self.stack[-1].children.append(self._raw(f"<!--{data}-->"))

    def handle_decl(self, decl: str) -> None:
        self.stack[-1].children.append(self._raw(f"<!{decl}>"))

    def handle_pi(self, data: str) -> None:
        self.stack[-1].children.append(self._raw(f"<?{data}>"))

    def unknown_decl(self, data: str) -> None:
        self.stack[-1].children.append(self._raw(f"<![{data}]>"))


def _walk(node: _Node, source: str, parts: list[str | Piece]) -> None:
    """Flattens the tree into raw parts and pieces (the last part, when a piece, is the open one)."""

    def piece() -> Piece:
        if not parts or not isinstance(parts[-1], Piece):
            parts.append(Piece(html=True))
        return parts[-1]

    for child in node.children:
        if isinstance(child, str):
            piece().add_text(child)
        elif isinstance(child, _Raw):
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
