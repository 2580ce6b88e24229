"""Office documents for ``/translate_file`` (server/documents/files.py): paragraphs made of runs, each paragraph a text
whose runs are inline spans through the markup path, its runs and their formatting kept, a run's text being what the
aligner placed inside it.

- .docx: each paragraph of the body and of table cells.
- .pptx: each paragraph of every shape's text (tables and groups included), slide by slide.
- .odt and .odp (OpenDocument text and presentation): each paragraph and heading, on a page or a slide, its runs
  being its text and its spans (text:span); other elements in it (line breaks, frames, links) stay where they
  are, untranslated.

They need the ``files`` extra (python-docx, python-pptx, odfpy), imported when such a file arrives.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable
from html.parser import HTMLParser

from server.errors import InvalidRequest

RUN_TAG = "span"  # an inline element (server/documents/markup.py): the aligner puts it around the words it enclosed
Read = tuple[list[str], Callable[[list[str]], bytes]]  # the texts to translate, and the file around their translations


def _office(kind: str, data: bytes, load, paragraphs, runs, set_text, save) -> Read:
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

    return texts, write


def _spans(runs: list) -> str:
    """A paragraph's runs as inline spans that say which run each is."""
    return "".join(
        f'<{RUN_TAG} data-run="{i}">{html.escape(text, quote=False)}</{RUN_TAG}>'
        for i, (_, text) in enumerate(runs)
        if text
    )


def _docx(kind: str, data: bytes) -> Read:
    return _python_office(kind, data, _optional("docx").Document, _word_paragraphs)


def _pptx(kind: str, data: bytes) -> Read:
    return _python_office(kind, data, _optional("pptx").Presentation, _slide_paragraphs)


def _python_office(kind: str, data: bytes, load, paragraphs) -> Read:
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


def _open_document(kind: str, data: bytes) -> Read:
    """An OpenDocument file (.odt, .odp): odfpy reads both, their paragraphs the same elements."""
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
        kind,
        data,
        opendocument.load,
        lambda document: [*document.getElementsByType(text.P), *document.getElementsByType(text.H)],
        runs,
        set_text,
        lambda document, out: document.write(out),
    )


OFFICE = {".docx": _docx, ".pptx": _pptx, ".odt": _open_document, ".odp": _open_document}


def read_office(suffix: str, data: bytes) -> Read:
    """An office document's texts (its paragraphs, runs as spans) and what writes it around their translations."""
    return OFFICE[suffix](suffix, data)


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
