"""HTML read into an element tree (``HtmlTree``), every element with its offsets and its start and end tags as
sent, for server/documents/markup.py to split into what is translated and what is kept; markup that is not well-formed,
or too deep or too large to place back, is refused with a ``MarkupError`` that names the tag and where it is.
Which elements stay inside a sentence and which are never translated is decided here (``Node.inline``,
``Node.translated``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser

from server.errors import InvalidRequest


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


class MarkupError(InvalidRequest):
    """Markup that is not well-formed: the message names the tag and where it is."""


@dataclass
class Node:
    tag: str
    attrs: dict[str, str | None]
    start: str  # the start tag as sent
    begin: int  # offsets of the whole element in the source
    end_offset: int = -1
    end: str = ""
    children: list[Node | str | Raw] = field(default_factory=list)

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
        return self.tag in INLINE and all(not isinstance(c, Node) or c.inline for c in self.children)


@dataclass
class Raw:
    text: str  # a comment, declaration or processing instruction, as sent


# Bounds on one text's markup: the tree is walked recursively, and placing tags costs more per element than
# translating costs per word (20,000 empty inline elements held a request for 8.4 s of CPU on 2-core x86-64).
MAX_DEPTH = 100
MAX_ELEMENTS = 2000


class HtmlTree(HTMLParser):
    """The element tree of a fragment, with every element's offsets; raises MarkupError where an
    end tag does not close the innermost open element, an element is never closed, or the markup
    is nested deeper than MAX_DEPTH or has more than MAX_ELEMENTS elements."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self.source = source
        self.root = Node("", {}, "", 0)
        self.stack = [self.root]
        self.lines = [0] + [m.end() for m in re.finditer("\n", source)]
        self.elements = 0

    def parse(self) -> Node:
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
        node = Node(tag, dict(attrs), raw, begin, begin + len(raw))
        self.stack[-1].children.append(node)
        if tag not in VOID and not raw.endswith("/>"):
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        raw = self.get_starttag_text() or f"<{tag}/>"
        begin = self._offset()
        self._count(tag, begin)
        self.stack[-1].children.append(Node(tag, dict(attrs), raw, begin, begin + len(raw)))

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
            self.stack[-1].children.append(Raw(raw))
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

    def _raw(self, usual: str) -> Raw:
        """A comment or declaration as sent. Those that html.parser reads through a parse_* method are replaced
        by exactly what it consumed (``_exactly``); the others are what newer versions report at the end of the
        input for a construct left open ("<!-- x > y"), which runs to the end of the text."""
        begin = self._offset()
        return Raw(usual if self.source.startswith(usual, begin) else self.source[begin:])

    def _exactly(self, parse: Callable[..., int], i: int, *args: int) -> int:
        """Runs one of html.parser's parse_* methods for a comment, declaration or processing instruction and
        keeps what it consumed, byte for byte, as the raw part its handler added: the parser's own reading
        decides where such a part ends ("<!-- x -- >" ends at "-- >" in some Python versions, not in others)."""
        children = self.stack[-1].children
        count = len(children)
        end = parse(i, *args)
        if end > i and len(children) == count + 1 and isinstance(children[-1], Raw):
            children[-1] = Raw(self.rawdata[i:end])
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
