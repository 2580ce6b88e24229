"""Coverage-guided fuzz targets (atheris: libFuzzer driving Python, the server's modules instrumented). Each
target's docstring states the invariant it checks; any other exception, or a failed check, is a crash that
libFuzzer saves as a file to replay. tests/server/test_fuzz.py runs each for a bounded time in CI, starting
from the seeds in tests/server/fuzz_seeds/TARGET/ (small, hand-written).

    python -m tests.server.fuzz TARGET [--model DIR] [libFuzzer flags] [corpus folders]

e.g. ``python -m tests.server.fuzz markup -max_total_time=600 /tmp/markup tests/server/fuzz_seeds/markup``
explores for ten minutes; ``python -m tests.server.fuzz markup crash-…`` replays a crash. The ``http`` and
``grpc`` targets serve the model given by ``--model`` (the tiny test model in CI).
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["server"]):
    from server.documents.aligned import AlignedSentence
    from server.documents.files import read_document
    from server.documents.glossary import MAX_INLINE_ENTRIES, Glossary, checked_entries
    from server.documents.html_tree import MarkupError
    from server.documents.markup import WORD, ParsedText, Piece, parse
    from server.documents.placement import place
    from server.documents.text import TextLimits, segment_texts, split_sentences
    from server.errors import InvalidRequest
    from testkit.servers import DOCUMENTED_CODES, RunningServer, free_port, server_config  # the rest of server/

Provider = atheris.FuzzedDataProvider
CHOICES = b"\xff"  # never in UTF-8: an input is its text, then the bytes a target draws its choices from


def _split(data: bytes) -> tuple[str, Provider]:
    """The input's text (UTF-8; what does not decode, U+FFFD) and a provider of the choices after it, so that
    seeds are plain text files."""
    text, _, choices = data.partition(CHOICES)
    return text.decode("utf-8", "replace"), Provider(choices)


def _translation(fdp: Provider, piece: Piece) -> AlignedSentence:
    """A 'translation' of the piece: made-up words w0, w1… each aligned to a source word the input picks (or
    to none), in any order, so that placement meets every arrangement of the source's words."""
    words = len(WORD.findall(piece.text))
    units = [f"w{i}" for i in range(fdp.ConsumeIntInRange(0, words + 3))]
    aligned = [fdp.ConsumeIntInRange(-1, words - 1) if words else -1 for _ in units]
    spaces = [fdp.ConsumeBool() for _ in units]
    return AlignedSentence(0, units, spaces, [None if a < 0 else a for a in aligned], fdp.ConsumeUnicodeNoSurrogates(2))


def markup(data: bytes) -> None:
    """HTML markup (server/documents/markup.py) and its placement (server/documents/placement.py): parsing raises
    nothing but MarkupError; what parses renders back to what it was read as; any translation placed back is well-formed
    markup (it parses again) holding every output word once, in order, and every atom (placeholders, URLs, <code>…)."""
    text, fdp = _split(data)
    try:
        document = parse(text, "html")
    except MarkupError:
        return
    rendered = document.render(["".join(p.source) for p in document.pieces])
    assert _read(parse(rendered, "html")) == _read(document), (rendered, text)
    outputs = []
    for piece in document.pieces:
        sentence = _translation(fdp, piece)
        outputs.append(place(piece, [sentence]))
        if sentence.units:  # (no words at all: the piece comes back as sent)
            assert re.findall(r"w\d+", _without_atoms(outputs[-1], piece)) == sentence.units, (outputs[-1], piece)
        _assert_atoms_kept(piece, outputs[-1])
    parse(document.render(outputs), "html")


def _read(document: ParsedText) -> list[str]:
    """What the parser read: raw parts as sent, and each piece's text (character references decoded, as
    html.parser decodes them: not inside a tag left open at the end, "<i&mp;")."""
    return [part if isinstance(part, str) else part.text for part in document.parts]


def _without_atoms(output: str, piece: Piece) -> str:
    """The output's words: its atoms and tags taken out (the longest first: one may hold another)."""
    markup = {a.text for a in piece.atoms} | {tag for e in piece.elements for tag in (e.start, e.end)}
    for text in sorted(markup - {""}, key=len, reverse=True):
        output = output.replace(text, " ")
    return output


def _assert_atoms_kept(piece: Piece, output: str) -> None:
    for atom, count in Counter(a.text for a in piece.atoms).items():
        assert output.count(atom) >= count, (atom, output)


def glossary(data: bytes) -> None:
    """Glossaries (server/documents/glossary.py) over text or HTML: the input's text is a document and, after NUL bytes,
    source terms; more terms are cut from the document itself (so they overlap, nest, hold placeholders, tags or
    regular-expression characters). Whatever the translation around them, each entry's target term is in the output
    exactly once per occurrence applied, every output word not tied to a term is there once and in order (one tied
    to a term is there or gives way to it), every atom is kept, and HTML stays well-formed."""
    text, fdp = _split(data)
    document_text, *terms = text.split("\x00")
    for _ in range(fdp.ConsumeIntInRange(0, 6)):
        start = fdp.ConsumeIntInRange(0, max(len(document_text) - 1, 0))
        terms.append(document_text[start : start + fdp.ConsumeIntInRange(1, 12)])
    format = "html" if fdp.ConsumeBool() else "text"
    mark = next(chr(c) for c in range(0xE000, 0xF900) if chr(c) not in text)  # in no atom, tag or raw part
    try:
        targets = {t: f"{mark}T{i}{mark}" for i, t in enumerate(terms[:MAX_INLINE_ENTRIES])}
        entries = checked_entries(targets, 10**6, "glossary")
        document = parse(document_text, format)
    except (InvalidRequest, MarkupError):
        return
    (document,), (terms_of,) = Glossary(entries).apply([document])
    outputs = []
    for piece in document.pieces:
        sentence = _translation(fdp, piece)
        sentence = replace(sentence, units=[f"{mark}{unit}{mark}" for unit in sentence.units])
        starts = [m.start() for m in WORD.finditer(piece.text)]
        covered = {
            w for a in piece.atoms if a.covers for w, s in enumerate(starts) if a.offset <= s < a.offset + a.covers
        }
        outputs.append(place(piece, [sentence]))
        kept = [u for u, a in zip(sentence.units, sentence.aligned, strict=True) if a not in covered]
        if sentence.units:  # in order, each once; a word tied to a term may give way to it, no other word
            found = re.findall(f"{mark}w\\d+{mark}", outputs[-1])
            assert found == [u for u in sentence.units if u in set(found)], (outputs[-1], piece)
            assert set(kept) <= set(found), (outputs[-1], piece)
        _assert_atoms_kept(piece, outputs[-1])
    rendered = document.render(outputs)
    for source, count in Counter(terms_of).items():
        assert rendered.count(entries[source]) == count, (source, rendered)
    if format == "html":
        parse(rendered, "html")


def placeholders(data: bytes) -> None:
    """Protected spans in plain text (placeholders, URLs, e-mail addresses, amounts; server/documents/markup.py's
    PROTECTED): each comes back byte-identical, as often as it was sent, whatever the translation around it."""
    text, fdp = _split(data)
    document = parse(text, "text")
    for piece in document.pieces:
        _assert_atoms_kept(piece, place(piece, [_translation(fdp, piece)]))


def sentences(data: bytes) -> None:
    """Sentence splitting and limits (server/documents/text.py): the sentences, with their separators, are the text; a
    text becomes segments or an InvalidRequest, and no segment is longer than long_input_tokens or
    max_source_tokens, and a truncated text no longer than long_input_tokens in all."""
    text, fdp = _split(data)
    texts = text.split("\x00")[:4]  # up to 4 texts, as a request's
    for text in texts:
        split = split_sentences(text)
        leading = text[: len(text) - len(text.lstrip())]
        assert leading + "".join(s + separator for s, separator in split) == (text if split else leading)
    limits = TextLimits(4, -1, fdp.ConsumeIntInRange(1, 64), fdp.ConsumeIntInRange(1, 16), fdp.PickValueInList(LONG))
    try:
        segmented = segment_texts(texts, _characters, limits)
    except InvalidRequest:
        return
    for segments in segmented:
        assert all(len(s.ids) <= limits.sentence_tokens for s in segments)
        if any(s.truncated for s in segments):
            assert sum(len(s.ids) for s in segments) <= limits.long_input_tokens


LONG = ["split", "truncate", "reject"]


def _characters(texts: list[str]) -> list[list[int]]:
    """A tokenizer of one token per character but spaces: limits meet texts of every length in tokens."""
    return [[ord(c) for c in text if not c.isspace()] for text in texts]


def files(data: bytes) -> None:
    """Documents for /translate_file (server/documents/files.py), of any name: reading raises nothing but
    InvalidRequest; a document read is written back around its own texts, and that file reads back to the
    same texts."""
    name, _, content = data.partition(b"\n")  # the file's name on the first line, then the file
    name = name.decode("utf-8", "replace")
    try:
        document = read_document(name, content)
    except InvalidRequest:
        return
    again = read_document(name, document.write(document.texts))
    assert again.texts == document.texts, (again.texts, document.texts)


class Served:
    """A server on the given model (the tiny one in CI), started once per fuzzing process."""

    def __init__(self, model: Path) -> None:
        config = server_config(model, http_port=free_port(), max_output_tokens=8, max_batch_delay_ms=1.0)
        self.running = RunningServer(config)
        self.http = http.client.HTTPConnection("127.0.0.1", self.running.server.http_port, timeout=60)


def http_target(served: Served) -> Callable[[bytes], None]:
    def request(data: bytes) -> None:
        """The HTTP API (server/doors/http.py): any method, path, query string, headers and body is answered, and
        never 5xx: a refusal is 4xx with a JSON {"error": message} (or aiohttp's plain-text message for what is
        not HTTP at all)."""
        head, _, body = data.partition(b"\n\n")  # "METHOD /path?query", its headers, a blank line, the body
        request_line, *header_lines = head.decode("latin-1").split("\n")
        method, _, path = request_line.partition(" ")
        headers = dict(line.partition(": ")[::2] for line in header_lines)
        try:
            served.http.request(method, "/" + urllib.parse.quote(path.lstrip("/"), "/?=&"), body, headers)
        except (ValueError, http.client.HTTPException):  # what http.client will not send reaches no server
            served.http.close()
            return
        response = served.http.getresponse()
        body = response.read()
        assert response.status < 500, (response.status, body[:500])
        if response.status >= 400 and response.headers.get_content_type() == "application/json":
            assert isinstance(json.loads(body)["error"], str), body[:500]
        elif response.status >= 400:  # aiohttp's own refusals of what is not HTTP, before any route: plain text
            assert body, response.status

    return request


GRPC_METHODS = ["Translate", "TranslateStream", "Detect", "GetModelInfo", "ListModels"]


def grpc_target(served: Served) -> Callable[[bytes], None]:
    import grpc

    calls = {
        name: getattr(served.running.channel, "unary_stream" if name == "TranslateStream" else "unary_unary")(
            f"/translation.v1.Translator/{name}"
        )
        for name in GRPC_METHODS
    }

    def request(data: bytes) -> None:
        """The gRPC API (server/doors/service.py): any bytes as any method's request get OK or a documented code
        (INVALID_ARGUMENT, RESOURCE_EXHAUSTED), never INTERNAL or UNKNOWN."""
        method = GRPC_METHODS[data[0] % len(GRPC_METHODS)] if data else "Translate"  # then the request's bytes
        try:
            answer = calls[method](data[1:], timeout=60)
            if method == "TranslateStream":
                list(answer)
        except grpc.RpcError as error:
            assert error.code() in DOCUMENTED_CODES, (error.code(), error.details())

    return request


TARGETS: dict[str, Callable[[bytes], None]] = {
    "markup": markup,
    "placeholders": placeholders,
    "glossary": glossary,
    "sentences": sentences,
    "files": files,
}
SERVED_TARGETS = {"http": http_target, "grpc": grpc_target}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", choices=[*TARGETS, *SERVED_TARGETS])
    parser.add_argument("--model", type=Path, help="the exported model the http and grpc targets serve")
    args, libfuzzer = parser.parse_known_args()
    if args.target in SERVED_TARGETS:
        if args.model is None:
            parser.error(f"{args.target} serves a model: give --model DIR")
        served = Served(args.model)  # held here while fuzzing: its channel closes when it is collected
        target = SERVED_TARGETS[args.target](served)
    else:
        target = TARGETS[args.target]
    atheris.Setup([sys.argv[0], *libfuzzer], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
