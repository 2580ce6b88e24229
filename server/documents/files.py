"""Documents for ``/translate_file``: each format read into texts to translate and written back around their
translations, keeping its structure.

- .txt: each line is a text; every line, blank ones and line endings included, is kept.
- .html: the whole document is one text, as ``format=html`` (the markup kept by server/documents/markup.py).
- .srt and .vtt: each cue's lines, or each speaker's where dialogue dashes start lines, are a text through the
  markup path, with the cue's tags and line breaks; numbers, timings, cue settings and WebVTT's header and
  NOTE, STYLE and REGION blocks are kept byte for byte (server/documents/subtitles.py).
- .docx, .pptx, .odt and .odp: each paragraph is a text, its runs inline spans through the markup path;
  paragraphs, runs and their formatting are kept (server/documents/office.py). They need the ``files`` extra.
- .epub: each XHTML document in it (a member named .xhtml, .html or .htm) is one text, as .html; every other
  member (the package, navigation's NCX, styles, images) is kept byte for byte, and ``mimetype`` stays the
  first, stored member, as EPUB readers require. The book's title in its package is not translated.

A zip format is opened only once its central directory says that it unpacks within MAX_UNZIPPED_BYTES and that
no large member is packed tighter than MAX_MEMBER_RATIO: a zip bomb (a few KiB sent, GiB unpacked) is refused
before a member is read. The directory cannot understate a member: Python's zipfile, which every reader here
unpacks with, stops at the size the directory declares and fails the member's CRC.
"""

from __future__ import annotations

import io
import re
import tempfile
import time
import uuid
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePath

from server.config import MIB
from server.documents.office import OFFICE, read_office
from server.documents.subtitles import read_subtitles
from server.errors import InvalidRequest

SUFFIXES = (".txt", ".html", ".htm", ".srt", ".vtt", ".docx", ".pptx", ".odt", ".odp", ".epub")
XHTML = (".xhtml", ".html", ".htm")  # an EPUB's documents
ZIPPED = (*OFFICE, ".epub")
# What a zip format may unpack to, all its members together: 25 times the default upload bound (max_message_bytes,
# 4 MiB), as text XML deflates to a tenth of its size or so and images hardly at all
MAX_UNZIPPED_BYTES = 100 * MIB
# The tightest packing allowed of a member over a MiB unpacked: deflate reaches about 1000:1 on the repeated bytes
# of a bomb, while a document's XML and media stay well under 100:1
MAX_MEMBER_RATIO = 100


@dataclass
class Document:
    texts: list[str]  # what to translate
    format: str  # "text" or "html", as /translate takes it
    write: Callable[[list[str]], bytes]  # the file again, around one translation per text


def read_document(name: str, data: bytes) -> Document:
    suffix = PurePath(name).suffix.lower()
    if suffix not in SUFFIXES:
        raise InvalidRequest(f"{name!r}: files of type {suffix or '(none)'} are not translated; send {SUFFIXES}")
    if suffix in ZIPPED:
        _check_unzipped(name, suffix, data)
    if suffix in OFFICE:
        texts, write = read_office(suffix, data)
        return Document(texts, "html", write)
    if suffix == ".epub":
        return _epub(data)
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


def _check_unzipped(name: str, suffix: str, data: bytes) -> None:
    """Refuses a zip whose central directory says it unpacks past MAX_UNZIPPED_BYTES or MAX_MEMBER_RATIO."""
    try:
        members = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError) as e:  # the last: a zip version it lacks
        raise InvalidRequest(f"the file is not a valid {suffix} ({type(e).__name__}: {e})") from e
    unzipped = sum(info.file_size for info in members)
    if unzipped > MAX_UNZIPPED_BYTES:
        raise InvalidRequest(
            f"{name!r} unpacks to {unzipped:,} bytes, over the limit of {MAX_UNZIPPED_BYTES:,} (MAX_UNZIPPED_BYTES)"
        )
    for info in members:
        if info.file_size > MIB and info.file_size > MAX_MEMBER_RATIO * max(info.compress_size, 1):
            raise InvalidRequest(
                f"{name!r}: {info.filename!r} unpacks to {info.file_size:,} bytes from {info.compress_size:,}, "
                f"packed tighter than the limit of {MAX_MEMBER_RATIO}:1 (MAX_MEMBER_RATIO)"
            )


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


def _epub(data: bytes) -> Document:
    try:
        book = zipfile.ZipFile(io.BytesIO(data))
        members = [(info, book.read(info)) for info in book.infolist()]
        chapters = [i for i, (info, _) in enumerate(members) if PurePath(info.filename).suffix.lower() in XHTML]
        texts = [members[i][1].decode("utf-8-sig") for i in chapters]
    except (zipfile.BadZipFile, UnicodeDecodeError, EOFError, NotImplementedError, RuntimeError, zlib.error) as e:
        # the last three: a compression method zipfile lacks, an encrypted member, a corrupt stream
        raise InvalidRequest(f"the file is not a valid .epub ({type(e).__name__}: {e})") from e

    def write(out: list[str]) -> bytes:
        translated = dict(zip(chapters, out, strict=True))
        written = io.BytesIO()
        with zipfile.ZipFile(written, "w") as result:
            for i, (info, content) in enumerate(members):
                result.writestr(info, translated[i].encode() if i in translated else content)
        return written.getvalue()

    return Document(texts, "html", write)


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
