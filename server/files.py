"""Documents for ``/translate_file``: each format read into texts to translate and written back around their
translations, keeping its structure.

- .txt: each line is a text; every line, blank ones and line endings included, is kept.
- .html: the whole document is one text, as ``format=html`` (the markup kept by server/markup.py).
- .srt and .vtt: each cue's lines, or each speaker's where dialogue dashes start lines, are a text through the
  markup path, with the cue's tags and line breaks; numbers, timings, cue settings and WebVTT's header and
  NOTE, STYLE and REGION blocks are kept byte for byte (server/subtitles.py).
- .docx: each paragraph (body and table cells) is a text, its runs inline spans through the markup path;
  paragraphs, runs and their formatting are kept, a run's text being what the aligner placed inside it.
- .pptx: the same for each paragraph of every shape's text (tables and groups included), slide by slide.
- .odt: the same for each paragraph and heading, its runs being its text and its spans (text:span); other
  elements in it (line breaks, frames, links) stay where they are, untranslated.

.docx, .pptx and .odt need the ``files`` extra (python-docx, python-pptx, odfpy), imported when such a file
arrives.
"""

from __future__ import annotations

import html
import io
import re
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path, PurePath

from server.errors import InvalidRequest
from server.subtitles import read_subtitles

SUFFIXES = (".txt", ".html", ".htm", ".srt", ".vtt", ".docx", ".pptx", ".odt")
RUN_TAG = "span"  # an inline element (server/markup.py): the aligner puts it around the words it enclosed


@dataclass
class Document:
    texts: list[str]  # what to translate
    format: str  # "text" or "html", as /translate takes it
    write: Callable[[list[str]], bytes]  # the file again, around one translation per text


def read_document(name: str, data: bytes) -> Document:
    suffix = PurePath(name).suffix.lower()
    if suffix not in SUFFIXES:
        raise InvalidRequest(f"{name!r}: files of type {suffix or '(none)'} are not translated; send {SUFFIXES}")
    if suffix in (".docx", ".pptx", ".odt"):
        return OFFICE[suffix](data)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"{name!r} is not UTF-8 text (byte {data[e.start]:#04x} at {e.start})") from e
    if suffix == ".txt":
        return _lines(text)
    if suffix in (".srt", ".vtt"):
        texts, write = read_subtitles(text, name, vtt=suffix == ".vtt")
        return Document(texts, "html", lambda out: write(out).encode())
    return Document([text], "html", lambda out: out[0].encode())


def _lines(text: str) -> Document:
    lines = text.splitlines(keepends=True)
    bodies = [line.rstrip("\r\n") for line in lines]
    translated = [i for i, body in enumerate(bodies) if body.strip()]

    def write(out: list[str]) -> bytes:
        result = list(lines)
        for i, translation in zip(translated, out, strict=True):
            result[i] = translation + lines[i][len(bodies[i]) :]
        return "".join(result).encode()

    return Document([bodies[i] for i in translated], "text", write)


def _office(kind: str, data: bytes, load, paragraphs, runs, set_text, save) -> Document:
    """A document of paragraphs made of runs: each paragraph a text whose runs are inline spans."""
    try:
        document = load(io.BytesIO(data))
    except Exception as e:  # the libraries raise whatever their zip and XML readers raise
        raise InvalidRequest(f"the file is not a valid {kind} ({type(e).__name__}: {e})") from e
    found = [(p, runs(p)) for p in paragraphs(document)]
    found = [(p, rs) for p, rs in found if any(text.strip() for _, text in rs)]
    texts = [_spans(rs) for _, rs in found]

    def write(out: list[str]) -> bytes:
        for (_, rs), translation in zip(found, out, strict=True):
            for (run, _), text in zip(rs, _run_texts(translation, len(rs)), strict=True):
                set_text(run, text)
        written = io.BytesIO()
        save(document, written)
        return written.getvalue()

    return Document(texts, "html", write)


def _spans(runs: list) -> str:
    """A paragraph's runs as inline spans that say which run each is."""
    return "".join(
        f'<{RUN_TAG} data-run="{i}">{html.escape(text, quote=False)}</{RUN_TAG}>'
        for i, (_, text) in enumerate(runs)
        if text
    )


def _docx(data: bytes) -> Document:
    return _python_office(".docx", data, _optional("docx").Document, _word_paragraphs)


def _pptx(data: bytes) -> Document:
    return _python_office(".pptx", data, _optional("pptx").Presentation, _slide_paragraphs)


def _python_office(kind: str, data: bytes, load, paragraphs) -> Document:
    """python-docx's and python-pptx's documents: paragraphs of runs whose text can be set."""
    return _office(
        kind,
        data,
        load,
        paragraphs,
        lambda paragraph: [(run, run.text) for run in paragraph.runs],
        lambda run, text: setattr(run, "text", text),
        lambda document, out: document.save(out),
    )


def _odt(data: bytes) -> Document:
    _optional("odf")
    from odf import opendocument, teletype, text

    def runs(paragraph):
        return [
            (node, node.data if node.nodeType == node.TEXT_NODE else teletype.extractText(node))
            for node in paragraph.childNodes
            if node.nodeType == node.TEXT_NODE or node.qname == text.Span().qname
        ]

    def set_text(node, value: str) -> None:
        if node.nodeType == node.TEXT_NODE:
            node.data = value
            return
        texts = [child for child in node.childNodes if child.nodeType == child.TEXT_NODE]
        if not texts:
            node.addText(value)
            return
        texts[0].data = value  # the span's elements (a nested span, a line break) stay; its text is the first's
        for child in texts[1:]:
            child.data = ""

    return _office(
        ".odt",
        data,
        opendocument.load,
        lambda document: [*document.getElementsByType(text.P), *document.getElementsByType(text.H)],
        runs,
        set_text,
        lambda document, out: document.write(out),
    )


OFFICE = {".docx": _docx, ".pptx": _pptx, ".odt": _odt}


def _word_paragraphs(document):
    yield from document.paragraphs
    for table in document.tables:
        for row in table.rows:
            for cell in row.cells:
                yield from cell.paragraphs


def _slide_paragraphs(presentation):
    def shapes(group):
        for shape in group:
            if shape.shape_type is not None and hasattr(shape, "shapes"):  # a group
                yield from shapes(shape.shapes)
            elif getattr(shape, "has_table", False):
                for row in shape.table.rows:
                    for cell in row.cells:
                        yield cell.text_frame
            elif getattr(shape, "has_text_frame", False):
                yield shape.text_frame

    for slide in presentation.slides:
        for frame in shapes(slide.shapes):
            yield from frame.paragraphs


class _RunTexts(HTMLParser):
    """The text inside each run's span; text outside every span goes to the run before it (the first run for
    text before any)."""

    def __init__(self, count: int) -> None:
        super().__init__(convert_charrefs=True)
        self.texts = [""] * count
        self.current: int | None = None
        self.last = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        run = dict(attrs).get("data-run")
        if tag == RUN_TAG and run is not None and run.isdigit() and int(run) < len(self.texts):
            self.current = self.last = int(run)

    def handle_endtag(self, tag: str) -> None:
        if tag == RUN_TAG:
            self.current = None

    def handle_data(self, data: str) -> None:
        self.texts[self.current if self.current is not None else self.last] += data


def _run_texts(translation: str, count: int) -> list[str]:
    parser = _RunTexts(count)
    parser.feed(translation)
    parser.close()
    return parser.texts


def _optional(module: str):
    try:
        return __import__(module)
    except ImportError as e:
        raise InvalidRequest(
            f"this server cannot read such files: it lacks {module} (pip install 'translation-service[files]')"
        ) from e


class FileStore:
    """Translated files until their one download, or for ttl_s: only inside folder, under names made here."""

    NAME = re.compile(r"[0-9a-f]{32}-[A-Za-z0-9._-]{1,100}")

    def __init__(self, folder: Path | None, ttl_s: float) -> None:
        if folder is None:
            folder = Path(tempfile.mkdtemp(prefix="translation-files-"))  # 0700: this user's alone
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.ttl_s = folder, ttl_s

    def save(self, original: str, data: bytes) -> str:
        self.expire()
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", PurePath(original).name)[-100:] or "file"
        name = f"{uuid.uuid4().hex}-{safe}"
        (self.folder / name).write_bytes(data)
        return name

    def take(self, name: str) -> bytes:
        """The file's bytes, once: it is deleted as it is read."""
        self.expire()
        path = self.folder / name
        if not self.NAME.fullmatch(name) or not path.is_file():
            raise FileNotFoundError(name)
        data = path.read_bytes()
        path.unlink(missing_ok=True)
        return data

    def expire(self) -> None:
        oldest = time.time() - self.ttl_s
        for path in self.folder.iterdir():
            if self.NAME.fullmatch(path.name) and path.stat().st_mtime < oldest:
                path.unlink(missing_ok=True)
