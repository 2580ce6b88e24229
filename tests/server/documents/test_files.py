"""/translate_file and /download_file: each format comes back with its structure, once, within its limits."""

from __future__ import annotations

import io
import json
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.config import MIB
from server.documents.files import MAX_UNZIPPED_BYTES, FileStore, read_document
from server.errors import InvalidRequest
from testkit.servers import RunningServer, free_port, http, server_config, upload

docx = pytest.importorskip("docx", reason="python-docx (the files extra) not installed")
srt = pytest.importorskip("srt", reason="srt (the test extra) not installed")
pptx = pytest.importorskip("pptx", reason="python-pptx (the files extra) not installed")
odf = pytest.importorskip("odf", reason="odfpy (the files extra) not installed")


@pytest.fixture(scope="module")
def site(tiny_export: Path) -> Iterator[RunningServer]:
    config = server_config(tiny_export, http_port=free_port(), max_output_tokens=12, max_file_texts=20)
    server = RunningServer(config)
    yield server
    server.close()


def translated(site: RunningServer, name: str, data: bytes) -> bytes:
    status, answer = upload(site, name, data)
    assert status == 200, answer
    with urllib.request.urlopen(answer["translatedFileUrl"], timeout=30) as response:
        return response.read()


def translate(site: RunningServer, texts: list[str], format: str = "text") -> list[str]:
    """As files are translated: as the model wrote them, not mirrored (server/documents/formatting.py)."""
    fields = {"q": texts, "source": "en", "target": "de", "format": format, "mirror_formatting": False}
    _, _, answer = http(site, "/translate", fields)
    return answer["translatedText"]


def test_a_text_file_keeps_every_line(site: RunningServer):
    lines = ["A man is walking.", "", "A woman reads a book.", "  "]
    out = translated(site, "notes.txt", "\r\n".join(lines).encode()).decode()
    assert out.split("\r\n")[1::2] == ["", "  "]
    assert out.split("\r\n")[0::2] == translate(site, ["A man is walking.", "A woman reads a book."])


SUBTITLES = """1
00:00:01,000 --> 00:00:02,500
{\\an8}<i>A man in a blue shirt walks 5 km
to the old market every day.</i>

2
00:00:03,000 --> 00:00:04,000
- A <b>black</b> dog is running.
- <font color="red">Two</font> children are playing.

3
00:00:05,000 --> 00:00:06,000
<i>- A woman sings.
- A man plays the guitar.</i>

"""


def test_a_subtitle_file_keeps_timings_tags_line_breaks_and_dialogue_dashes(site: RunningServer):
    out = translated(site, "film.srt", SUBTITLES.encode()).decode()
    before, after = list(srt.parse(SUBTITLES)), list(srt.parse(out))
    assert [(s.index, s.start, s.end) for s in after] == [(s.index, s.start, s.end) for s in before]
    assert [line for line in out.splitlines() if not line or line[0].isdigit()] == [
        line for line in SUBTITLES.splitlines() if not line or line[0].isdigit()
    ]
    wrapped, dialogue, italic = [s.content.split("\n") for s in after]
    assert len(wrapped) == 2 and wrapped[0].startswith("{\\an8}<i>") and wrapped[1].endswith("</i>")
    assert len(dialogue) == 2 and all(line.startswith("- ") for line in dialogue)
    assert dialogue[0].count("<b>") == dialogue[0].count("</b>") == 1
    assert dialogue[1].count('<font color="red">') == dialogue[1].count("</font>") == 1
    assert italic[0].startswith("<i>- ") and italic[1].startswith("- ") and italic[1].endswith("</i>")


WEBVTT = """WEBVTT - a film

NOTE the speakers' names
are kept --> as they are

STYLE
::cue(.loud) { font-weight: bold }

intro
00:00:01.000 --> 00:00:02.500 align:start line:10%
<v Bob>Tom &amp; Jerry walk 5 km
to the <c.loud>old</c> market.

00:00:03.000 --> 00:00:04.000
- A dog &lt;3 runs.
- <i>Two</i> children play.
"""


def test_a_webvtt_file_keeps_its_header_settings_blocks_tags_and_lines(site: RunningServer):
    out = translated(site, "film.vtt", WEBVTT.encode()).decode()
    blocks, sent = out.split("\n\n"), WEBVTT.split("\n\n")
    assert blocks[:3] == sent[:3] and len(blocks) == len(sent)
    first, second = blocks[3].split("\n"), blocks[4].rstrip("\n").split("\n")
    assert first[:2] == sent[3].split("\n")[:2] and second[0] == sent[4].split("\n")[0]  # name, timing, settings
    first, second = first[2:], second[1:]
    assert len(first) == 2 and first[0].startswith("<v Bob>") and first[1].count("<c.loud>") == 1
    assert len(second) == 2 and all(line.startswith("- ") for line in second) and second[1].count("<i>") == 1


def test_an_html_file_keeps_its_markup(site: RunningServer):
    page = "<html><body><h1>A man</h1><p>A <b>dog</b> runs.</p></body></html>"
    out = translated(site, "page.html", page.encode()).decode()
    assert out == translate(site, [page], "html")[0] and out.count("<b>") == 1 and out.count("<p>") == 1


def test_a_word_document_keeps_paragraphs_runs_and_their_formatting(site: RunningServer):
    document = docx.Document()
    document.add_paragraph("A man is walking.")
    styled = document.add_paragraph("A ")
    styled.add_run("black").bold = True
    styled.add_run(" dog runs.").italic = True
    document.add_paragraph("")
    document.add_table(rows=1, cols=1).cell(0, 0).paragraphs[0].add_run("A cat.")
    data = io.BytesIO()
    document.save(data)
    back = docx.Document(io.BytesIO(translated(site, "letter.docx", data.getvalue())))
    assert len(back.paragraphs) == 3 and [len(p.runs) for p in back.paragraphs] == [1, 3, 0]
    runs = back.paragraphs[1].runs
    assert (runs[1].bold, runs[2].italic) == (True, True) and not runs[0].bold
    assert back.paragraphs[0].text == translate(site, ["A man is walking."])[0]
    assert back.tables[0].cell(0, 0).text == translate(site, ["A cat."])[0]


def test_a_presentation_keeps_slides_shapes_runs_and_their_formatting(site: RunningServer):
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])  # title only
    slide.shapes.title.text = "A man is walking."
    box = slide.shapes.add_textbox(0, 0, 100, 100).text_frame
    box.paragraphs[0].add_run().text = "A "
    bold = box.paragraphs[0].add_run()
    bold.text, bold.font.bold = "dog", True
    table = slide.shapes.add_table(1, 1, 0, 0, 100, 100).table
    table.cell(0, 0).text = "A cat."
    data = io.BytesIO()
    deck.save(data)
    back = pptx.Presentation(io.BytesIO(translated(site, "deck.pptx", data.getvalue()))).slides[0]
    title, text_box, frame = back.shapes[0], back.shapes[1], back.shapes[2]
    assert title.text_frame.text == translate(site, ["A man is walking."])[0]
    runs = text_box.text_frame.paragraphs[0].runs
    assert len(runs) == 2 and runs[1].font.bold and not runs[0].font.bold
    assert frame.table.cell(0, 0).text == translate(site, ["A cat."])[0]


def test_an_open_document_keeps_paragraphs_spans_and_their_styles(site: RunningServer):
    from odf import opendocument, style, teletype, text

    document = opendocument.OpenDocumentText()
    bold = style.Style(name="Bold", family="text")
    bold.addElement(style.TextProperties(fontweight="bold"))
    document.automaticstyles.addElement(bold)
    document.text.addElement(text.H(outlinelevel=1, text="A man is walking."))
    paragraph = text.P(text="A ")
    paragraph.addElement(text.Span(stylename=bold, text="black"))
    paragraph.addText(" dog runs.")
    document.text.addElement(paragraph)
    data = io.BytesIO()
    document.write(data)
    back = opendocument.load(io.BytesIO(translated(site, "letter.odt", data.getvalue())))
    headings, paragraphs = back.getElementsByType(text.H), back.getElementsByType(text.P)
    assert len(headings) == 1 and len(paragraphs) == 1
    assert teletype.extractText(headings[0]) == translate(site, ["A man is walking."])[0]
    spans = paragraphs[0].getElementsByType(text.Span)
    assert len(spans) == 1 and spans[0].getAttribute("stylename") == "Bold"
    assert teletype.extractText(paragraphs[0]).strip()  # text around the span is where the aligner put words


def test_an_open_document_presentation_keeps_slides_frames_and_spans(site: RunningServer):
    from odf import draw, opendocument, style, teletype, text

    deck = opendocument.OpenDocumentPresentation()
    layout = style.PageLayout(name="Screen")
    deck.automaticstyles.addElement(layout)
    master = style.MasterPage(name="Default", pagelayoutname=layout)
    deck.masterstyles.addElement(master)
    bold = style.Style(name="Bold", family="text")
    bold.addElement(style.TextProperties(fontweight="bold"))
    deck.automaticstyles.addElement(bold)
    for words in ("A man is walking.", "A cat."):
        page = draw.Page(masterpagename=master)
        box = draw.TextBox()
        paragraph = text.P(text=words)
        box.addElement(paragraph)
        frame = draw.Frame(width="20cm", height="3cm", x="1cm", y="1cm")
        frame.addElement(box)
        page.addElement(frame)
        deck.presentation.addElement(page)
    paragraph.addElement(text.Span(stylename=bold, text=" A black dog."))
    data = io.BytesIO()
    deck.write(data)
    back = opendocument.load(io.BytesIO(translated(site, "deck.odp", data.getvalue())))
    pages = back.getElementsByType(draw.Page)
    assert len(pages) == 2 and all(len(page.getElementsByType(draw.Frame)) == 1 for page in pages)
    first = pages[0].getElementsByType(text.P)[0]
    assert teletype.extractText(first) == translate(site, ["A man is walking."])[0]
    spans = pages[1].getElementsByType(text.Span)
    assert len(spans) == 1 and spans[0].getAttribute("stylename") == "Bold"


CHAPTER = """<?xml version="1.0" encoding="utf-8"?>
<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml"><head><title>A dog</title><link href="s.css" rel="stylesheet"/></head>
<body><h1>A dog</h1><p>A man is <i>walking</i>.<br/>A cat.</p></body></html>"""


def epub(chapters: dict[str, str]) -> bytes:
    """A minimal EPUB: mimetype first and stored, a container, a package and its chapters."""
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as book:
        book.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip", zipfile.ZIP_STORED)
        book.writestr("META-INF/container.xml", '<container><rootfiles><rootfile full-path="OEBPS/book.opf"/>')
        book.writestr("OEBPS/book.opf", "<package><manifest/></package>")
        book.writestr("OEBPS/s.css", "p { margin: 0 }")
        for name, chapter in chapters.items():
            book.writestr(f"OEBPS/{name}", chapter)
    return data.getvalue()


def test_an_epub_translates_its_xhtml_and_keeps_every_other_member(site: RunningServer):
    sent = epub({"one.xhtml": CHAPTER, "two.html": "<p>A cat.</p>"})
    original, back = (zipfile.ZipFile(io.BytesIO(data)) for data in (sent, translated(site, "book.epub", sent)))
    assert back.namelist() == original.namelist() and back.infolist()[0].compress_type == zipfile.ZIP_STORED
    for name in ("mimetype", "META-INF/container.xml", "OEBPS/book.opf", "OEBPS/s.css"):
        assert back.read(name) == original.read(name)
    chapter = back.read("OEBPS/one.xhtml").decode()
    assert chapter == translate(site, [CHAPTER], "html")[0]
    assert chapter.startswith('<?xml version="1.0"') and chapter.count("<i>") == chapter.count("<br/>") == 1
    assert back.read("OEBPS/two.html").decode() == translate(site, ["<p>A cat.</p>"], "html")[0]


def test_a_file_is_downloaded_once(site: RunningServer):
    status, answer = upload(site, "a.txt", b"A man.\n")
    assert status == 200
    urllib.request.urlopen(answer["translatedFileUrl"], timeout=30).read()
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(answer["translatedFileUrl"], timeout=30)
    assert error.value.code == 404 and "downloaded once" in json.loads(error.value.read())["error"]
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(f"http://127.0.0.1:{site.server.http_port}/download_file/..%2F..%2Fetc%2Fpasswd")
    assert error.value.code == 404


@pytest.mark.parametrize(
    "name, data, status, message",
    [
        ("photo.png", b"\x89PNG", 400, "files of type .png are not translated"),
        ("notes.txt", "\n".join(["A man."] * 21).encode(), 400, "21 texts (lines, paragraphs or subtitles), over"),
        ("notes.txt", b"\xff\xfe", 400, "is not UTF-8 text"),
        ("broken.docx", b"PK not a zip", 400, "not a valid .docx"),
        ("broken.srt", b"1\nnot a time\nA man.\n", 400, "not a valid .srt"),
        ("huge.srt", b"1\n00:00:01" + b"0" * 90 + b",000 --> 00:00:02,000\nA man.\n", 400, "not a valid .srt"),
        ("broken.pptx", b"PK not a zip", 400, "not a valid .pptx"),
        ("broken.odt", b"PK not a zip", 400, "not a valid .odt"),
        ("broken.odp", b"PK not a zip", 400, "not a valid .odp"),
        ("broken.epub", b"PK not a zip", 400, "not a valid .epub"),
        ("big.txt", b"A man.\n" * 700_000, 413, ""),
    ],
)
def test_bad_files_are_refused_with_a_reason(site: RunningServer, name: str, data: bytes, status: int, message: str):
    got, answer = upload(site, name, data)
    assert got == status and message in answer["error"], answer


def zip_bomb(unpacked: int) -> bytes:
    """A zip of one member of ``unpacked`` zero bytes, deflated about 1000:1."""
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as archive, archive.open("content.xml", "w") as member:
        for _ in range(unpacked // MIB):
            member.write(bytes(MIB))
    return data.getvalue()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return zip_bomb(MAX_UNZIPPED_BYTES + MIB)


@pytest.mark.parametrize("name", ["bomb.docx", "bomb.pptx", "bomb.odt", "bomb.odp", "bomb.epub"])
def test_a_zip_bomb_is_refused_naming_the_limit(site: RunningServer, bomb: bytes, name: str):
    assert len(bomb) < MIB  # a small upload
    got, answer = upload(site, name, bomb)
    assert got == 400 and "over the limit of 104,857,600 (MAX_UNZIPPED_BYTES)" in answer["error"], answer


def test_a_member_packed_like_a_bomb_is_refused_under_the_total_limit():
    with pytest.raises(InvalidRequest, match=r"'content.xml' unpacks to 2,097,152 bytes from .* limit of 100:1"):
        read_document("tight.odt", zip_bomb(2 * MIB))


def test_files_not_downloaded_expire(tmp_path: Path):
    store = FileStore(tmp_path, ttl_s=0.05)
    name = store.save("../../x y.txt", b"data")
    assert (tmp_path / name).exists() and name.endswith("-x_y.txt")
    time.sleep(0.1)
    store.expire()
    assert not (tmp_path / name).exists()


def test_the_documents_texts(tmp_path: Path):
    assert read_document("a.TXT", b"x\n\ny").texts == ["x", "y"]
    assert read_document("a.htm", b"<p>x</p>").format == "html"
