"""Subtitles for ``/translate_file``: .srt and WebVTT .vtt read into texts for the markup path (``format=html``)
and written back around their translations; every line that is not cue text (numbers, timings and cue settings,
WebVTT's header and its NOTE, STYLE and REGION blocks) is kept byte for byte.

A cue's lines are split into segments at dialogue dashes: a line that starts with one ("- Hi.") opens a segment,
a line that does not continues the segment before it. Each segment is one text, in which
- a tag that opens and closes inside it (``<i>``, ``<b>``, ``<u>``, ``<font color=...>``, WebVTT's ``<c.loud>``,
  ``<v Bob>``...) is an inline element, put back around the output words aligned to the words it enclosed;
- a line break is an atom, put back before the output word aligned to the word that began the next line, so that
  a sentence wrapped over two lines is translated whole (docs/serving.md has the measurement);
- what is neither (override tags such as ``{\\an8}``, a tag closed in another segment or never, WebVTT's
  ``<00:01.000>`` timestamps) is an atom too;
and what comes before its first word and after its last (the dash, overrides, tags around all its words) is kept
outside the translation, as it was.
"""

from __future__ import annotations

import bisect
import html
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser

from server.errors import InvalidRequest

# An override tag ({\an8}, {\i1}), a tag (<i>, </font>, <c.loud>, <v Bob>) or a WebVTT timestamp (<00:01.000>).
TOKEN = re.compile(r"\{\\[^{}]*\}|<(/?)([A-Za-z][\w-]*)(?:[.\s][^<>]*)?>|<\d[\d:.]*>")
DASH = re.compile(r"\s*[-‐–—](?!\d)\s*")  # a dialogue dash, not a minus sign
SRT_TIME = r"\s*\d+:\d{1,2}:\d{1,2}(?:[,.:]\d{1,3})?\s*"
SRT_TIMING = re.compile(f"{SRT_TIME}-->{SRT_TIME}(?:\\s.*)?")
VTT_BLOCK = re.compile(r"(?:NOTE|STYLE|REGION)(?:\s|$)")  # kept whole, as the header is
BREAK = "\n"


@dataclass
class _Token:
    text: str  # as in the file
    kind: str  # "text", "open", "close", "dash", "break" or "kept"
    name: str = ""  # a tag's name, lower case
    partner: int | None = None  # the index of the tag that closes (opens) this one, if any
    plain: str = ""  # a text's characters (entities decoded for WebVTT)


@dataclass
class _Segment:
    prefix: str  # before its first word, as in the file
    html: str  # the text to translate ("" when it has no words)
    suffix: str  # after its last word, as in the file
    entries: list[str | tuple[str, str]] = field(default_factory=list)  # by data-cue / comment number
    breaks: list[float] = field(default_factory=list)  # where its line breaks were, as shares of its characters


def read_subtitles(text: str, name: str, vtt: bool) -> tuple[list[str], Callable[[list[str]], str]]:
    """The texts of a .srt (``vtt`` false) or .vtt file and the function that writes the file again around one
    translation per text; raises InvalidRequest for a file that is not one."""
    parts = re.split(r"(\r\n|\r|\n)", text)
    lines = [*zip(parts[0::2], parts[1::2], strict=False), (parts[-1], "")]
    ending = parts[1] if len(parts) > 1 else "\n"
    cues = [
        (start, end, [_segment(group, vtt) for group in _groups([body for body, _ in lines[start:end]], vtt)])
        for start, end in (_vtt_cues if vtt else _srt_cues)(lines, name)
        if end > start
    ]
    texts = [s.html for _, _, segments in cues for s in segments if s.html]

    def write(out: list[str]) -> str:
        assert len(out) == len(texts), (len(out), len(texts))
        translations = iter(out)
        result, position = [], 0
        for start, end, segments in cues:
            result += [body + newline for body, newline in lines[position:start]]
            rendered = [_render(s, next(translations) if s.html else "", vtt) for s in segments]
            content = [line for line in BREAK.join(rendered).split(BREAK) if line.strip()]
            result.append(ending.join(content) + lines[end - 1][1])
            position = end
        return "".join(result + [body + newline for body, newline in lines[position:]])

    return texts, write


def _blocks(lines: list[tuple[str, str]]) -> Iterator[tuple[int, int]]:
    """The (start, end) line ranges of the runs of lines that are not blank."""
    start = None
    for n, (body, _) in enumerate([*lines, ("", "")]):
        if body.strip() and start is None:
            start = n
        elif not body.strip() and start is not None:
            yield start, n
            start = None


def _srt_cues(lines: list[tuple[str, str]], name: str) -> Iterator[tuple[int, int]]:
    """Each subtitle's text lines: after its number (which may be missing) and its timing."""
    for start, end in _blocks(lines):
        if SRT_TIMING.fullmatch(lines[start][0]):
            yield start + 1, end
        elif end - start > 1 and lines[start][0].strip().isdigit() and SRT_TIMING.fullmatch(lines[start + 1][0]):
            yield start + 2, end
        else:
            found = " / ".join(body for body, _ in lines[start : min(end, start + 2)])[:60]
            raise InvalidRequest(
                f"{name!r} is not a valid .srt file (line {start + 1}: a subtitle's number and times, such as "
                f"'00:00:01,000 --> 00:00:02,500', were expected, not {found!r})"
            )


def _vtt_cues(lines: list[tuple[str, str]], name: str) -> Iterator[tuple[int, int]]:
    """Each cue's text lines: after its timing line (and the identifier before it); the header's block and NOTE,
    STYLE and REGION blocks are no cues."""
    if not re.match(r"WEBVTT(?:[ \t]|$)", lines[0][0]):
        raise InvalidRequest(f"{name!r} is not a valid .vtt file (its first line must be WEBVTT)")
    for start, end in _blocks(lines):
        if start == 0 or VTT_BLOCK.match(lines[start][0]):
            continue
        timing = next((n for n in range(start, min(end, start + 2)) if "-->" in lines[n][0]), None)
        if timing is not None:
            yield timing + 1, end


def _groups(lines: list[str], vtt: bool) -> list[list[str]]:
    """A cue's lines in segments: a line with a dialogue dash starts one."""
    groups: list[list[str]] = []
    for line in lines:
        if not groups or _dash(_tokens(line, vtt)) is not None:
            groups.append([line])
        else:
            groups[-1].append(line)
    return groups


def _tokens(line: str, vtt: bool) -> list[_Token]:
    tokens, position = [], 0
    for match in TOKEN.finditer(line):
        tokens.append(_text(line[position : match.start()], vtt))
        kind = ("close" if match[1] else "open") if match[2] else "kept"
        tokens.append(_Token(match[0], kind, (match[2] or "").lower()))
        position = match.end()
    tokens.append(_text(line[position:], vtt))
    return [t for t in tokens if t.text]


def _text(text: str, vtt: bool) -> _Token:
    return _Token(text, "text", plain=html.unescape(text) if vtt else text)  # WebVTT escapes & < > as HTML does


def _dash(tokens: list[_Token]) -> int | None:
    """The text token that starts with the line's dialogue dash (only tags may come before it), if any."""
    for n, token in enumerate(tokens):
        if token.kind == "text" and token.plain.strip():
            return n if DASH.match(token.text) else None
    return None


def _pair(tokens: list[_Token]) -> None:
    """Each end tag's partner: the innermost open tag of its name; tags opened inside that one stay unpaired."""
    open_tags: list[int] = []
    by_name: dict[str, list[int]] = {}  # where in open_tags each name's are, innermost last
    for n, token in enumerate(tokens):
        if token.kind == "open":
            by_name.setdefault(token.name, []).append(len(open_tags))
            open_tags.append(n)
        elif token.kind == "close" and by_name.get(token.name):
            at = by_name[token.name][-1]
            for closed in open_tags[at:]:
                by_name[tokens[closed].name].pop()
            token.partner, tokens[open_tags[at]].partner = open_tags[at], n
            del open_tags[at:]


def _segment(lines: list[str], vtt: bool) -> _Segment:
    tokens: list[_Token] = []
    for n, line in enumerate(lines):
        found = _tokens(line, vtt)
        dash = _dash(found) if n == 0 else None
        if dash is not None:  # the dash a token of its own, the words after it another
            text = found[dash].text
            cut = DASH.match(text).end()
            found[dash : dash + 1] = [_Token(text[:cut], "dash"), _text(text[cut:], vtt)]
        tokens += ([_Token(BREAK, "break")] if n else []) + [t for t in found if t.text]
    _pair(tokens)
    words = [n for n, t in enumerate(tokens) if t.kind == "text" and t.plain.strip()]
    if not words:
        return _Segment("".join(t.text for t in tokens), "", "")
    first, last = words[0], words[-1]
    start = 0
    while start < first and _outside(tokens[start], lambda partner: partner > last):
        start += 1
    end = len(tokens)
    while end - 1 > last and _outside(tokens[end - 1], lambda partner: partner < start):
        end -= 1
    segment = _Segment("".join(t.text for t in tokens[:start]), "", "".join(t.text for t in tokens[end:]))
    segment.html = _markup(tokens, start, end, segment)
    return segment


def _outside(token: _Token, partner_outside: Callable[[int], bool]) -> bool:
    """Whether a token before the first word (after the last) may stay out of the translation: anything but a
    tag whose partner is among the words."""
    return token.kind not in ("open", "close") or token.partner is None or partner_outside(token.partner)


def _markup(tokens: list[_Token], start: int, end: int, segment: _Segment) -> str:
    """Tokens start..end as format=html: tags paired among them as spans, the rest but text as comments (atoms);
    a line break is " <!--n-->", the whitespace around it dropped."""
    out: list[str] = []
    entries, characters = segment.entries, 0
    for n in range(start, end):
        token = tokens[n]
        if token.kind == "text":
            plain = token.plain.lstrip() if n and tokens[n - 1].kind == "break" else token.plain
            plain = plain.rstrip() if n + 1 < len(tokens) and tokens[n + 1].kind == "break" else plain
            out.append(html.escape(plain, quote=False))
            characters += len(plain)
        elif token.kind == "open" and token.partner is not None and token.partner < end:
            entries.append((token.text, tokens[token.partner].text))
            out.append(f'<span data-cue="{len(entries) - 1}">')
        elif token.kind == "close" and token.partner is not None and token.partner >= start:
            out.append("</span>")
        else:
            entries.append(token.text)
            out.append(f"{' ' if token.kind == 'break' else ''}<!--{len(entries) - 1}-->")
            if token.kind == "break":
                segment.breaks.append(characters)
    segment.breaks = [at / max(characters, 1) for at in segment.breaks]
    return "".join(out)


def _render(segment: _Segment, translation: str, vtt: bool) -> str:
    """The segment with its translation in the file's terms, the whitespace around each break dropped. Where the
    aligner placed a break first or last (a one-word line in the source, a reordered translation), the lines are
    broken again where the source's were, in shares of the characters, at the nearest spaces outside tags."""
    parser = _Written(segment.entries, vtt)
    parser.feed(translation)
    parser.close()
    lines = "".join(parser.out).split(BREAK)
    lines = [line.lstrip() if n else line for n, line in enumerate(lines)]
    lines = [line.rstrip() if n < len(lines) - 1 else line for n, line in enumerate(lines)]
    body = BREAK.join(line for line in lines if line.strip())
    if body.count(BREAK) < len(segment.breaks):
        body = _wrap(body.replace(BREAK, " "), segment.breaks)
    return segment.prefix + body + segment.suffix


def _wrap(text: str, breaks: list[float]) -> str:
    """``text`` broken at the spaces nearest to each share of its length, as many as it has spaces for."""
    outside = bytearray(b"\x01") * len(text)
    for match in TOKEN.finditer(text):
        outside[match.start() : match.end()] = bytes(match.end() - match.start())
    spaces = [n for n, c in enumerate(text) if c == " " and outside[n]]
    chosen = set()
    for share in breaks:
        at = bisect.bisect(spaces, share * len(text))
        near = [n for n in spaces[max(at - 1, 0) : at + 1] if n not in chosen]
        if near:
            chosen.add(min(near, key=lambda n: abs(n - share * len(text))))
    return "".join(BREAK if n in chosen else c for n, c in enumerate(text))


class _Written(HTMLParser):
    """A segment's translation in the file's terms: spans and comments replaced by what they stand for."""

    def __init__(self, entries: list[str | tuple[str, str]], vtt: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.entries, self.vtt = entries, vtt
        self.out: list[str] = []
        self.open: list[str] = []

    def _entry(self, number: str | None) -> str | tuple[str, str] | None:
        return self.entries[int(number)] if number and number.isdigit() and int(number) < len(self.entries) else None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        entry = self._entry(dict(attrs).get("data-cue"))
        start, end = entry if isinstance(entry, tuple) else ("", "")
        self.out.append(start)
        self.open.append(end)

    def handle_endtag(self, tag: str) -> None:
        self.out.append(self.open.pop() if self.open else "")

    def handle_comment(self, data: str) -> None:
        entry = self._entry(data)
        self.out.append(entry if isinstance(entry, str) else "")

    def handle_data(self, data: str) -> None:
        self.out.append(html.escape(data, quote=False) if self.vtt else data)
