"""The LibreTranslate-compatible HTTP API (aiohttp), on the same scheduler as gRPC.

    POST /translate   JSON or form: q (a string, or a list of strings in JSON), source, target,
                      format ("text" or "html"), min_confidence, mirror_formatting and pass_through (ours,
                      default true: server/documents/formatting.py); answers {"translatedText": str | [str],
                      "confidence": float | [float]} and, when a text is flagged, "flags": [str] | [[str]]
                      ("repetition", "length": a runaway-output guard stopped it; "low_confidence")
    GET  /languages   [{"code", "name", "targets"}]
    POST /translate_file, GET /download_file/NAME   a file (server/documents/files.py), translated, downloaded
                      once
    GET  /             a page to try it (server/page/: plain HTML and JavaScript on this API)
    GET  /frontend/settings, GET /spec   what LibreTranslate's page reads; the OpenAPI document
                      (server/doors/openapi.py)
    POST /detect      q (a string): [{"confidence": 0-100, "language": code}], best first: a language no model
                      reads first where it is the verdict, else the served ones (server/documents/detect.py)
    GET  /health      {"status": "ok"} once the server serves (as gRPC's health service), else 503 with
                      "starting" (warming up) or "draining" (SIGTERM)
    POST /suggest     q, s (the suggested translation), source, target: {"success": true} once stored
                      (server/documents/suggestions.py); 403 unless the server runs with --suggestions, as
                      LibreTranslate
    POST /glossaries, GET /glossaries, GET|DELETE /glossaries/ID   stored glossaries (server/documents/glossaries.py)

``source`` and ``target`` choose among the server's models (``server.models``); ``source: "auto"`` detects the
texts' language (together: one request, one model) and the answer carries ``detectedLanguage``
({"confidence", "language"}, a list of them for a list q). Language codes are read in any case; a target that is
the source (given, or detected), or "auto" on texts without letters, answers the texts unchanged, as LibreTranslate
does (server.models.Models.choose). ``api_key`` is the caller's
key where the server has keys (server/operations/keys.py). ``alternatives: N`` (0 to max_beam_size - 1) asks for up to N
other translations, from beam search's n-best (the beam widened to N + 1): the answer carries
``"alternatives": [str]`` (a list of them per text for a list q), as LibreTranslate's. A translation names the
model that answered in ``X-Translation-Model`` (``name@version``).

Every answer carries CORS headers for the origins of ``--cors-origins`` (default ``*``: any web page may call the
API, as LibreTranslate's; where API keys are on, a page's key then travels from its visitors' browsers, so name
the origins instead), and a browser's preflight (``OPTIONS`` on any route) is answered 204.

Errors are JSON ``{"error": message}`` with the status of ``server.errors`` (400, 403, 429 with Retry-After,
503, 504, 500), and 404/405/413 for unknown paths, wrong methods and bodies over max_message_bytes.

Here are the routes; server/doors/http_request.py reads a request's fields and the options and model they ask for,
server/doors/http_glossaries.py has the stored glossaries' routes, server/doors/frontend.py the page and what
LibreTranslate's page reads.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from server.config import ServerConfig
from server.documents.files import Document, FileStore, read_document
from server.documents.glossary import Glossary, inline_glossary
from server.documents.suggestions import suggestion_of, suggestion_store
from server.doors import frontend, openapi
from server.doors.http_glossaries import GlossaryRoutes
from server.doors.http_middleware import REQUEST_ID, cors, error_response, json_errors, request_ids
from server.doors.http_request import file_options, model_of, request_fields, texts_of, translate_options
from server.errors import InvalidRequest, PermissionDenied, ServiceError, http_status_of, status_of
from server.interface import Engine
from server.models import Models, model_name
from server.operations.access import AccessLog, Exchange
from server.operations.keys import Caller, KeyGuard
from server.operations.tracing import request_span
from server.options import TranslateOptions
from server.translations import Translations

log = logging.getLogger(__name__)


def model_header(engine: Engine | None) -> dict[str, str]:
    """The model that answered, for X-Translation-Model; none where no model did."""
    return {"X-Translation-Model": model_name(engine)} if engine is not None else {}


class HttpApi:
    def __init__(
        self, models: Models, translations: Translations, config: ServerConfig, access: AccessLog, keys: KeyGuard
    ) -> None:
        self.keys = keys
        self.files = FileStore(config.files_dir, config.file_ttl_s)
        self.models = models
        self.translations = translations
        self.config = config
        self.access = access
        self.suggestions = suggestion_store(config)
        self.serving = False  # the server sets it once warm, as gRPC's health service turns SERVING

    def application(self) -> web.Application:
        middlewares = [cors(self.config.cors_origins), request_ids, json_errors]
        app = web.Application(middlewares=middlewares, client_max_size=self.config.max_message_bytes)
        app.router.add_post("/translate", self.translate)
        app.router.add_get("/languages", self.languages)
        app.router.add_post("/detect", self.detect)
        app.router.add_get("/frontend/settings", self.frontend_settings)
        app.router.add_post("/translate_file", self.translate_file)
        app.router.add_get("/download_file/{name}", self.download_file, name="download_file")
        app.router.add_get("/spec", self.spec)
        app.router.add_get("/health", self.health)
        app.router.add_post("/suggest", self.suggest)
        glossaries = GlossaryRoutes(self.models, self.translations.glossaries)
        app.router.add_post("/glossaries", self.glossary_route(glossaries.create))
        app.router.add_get("/glossaries", self.glossary_route(glossaries.list))
        app.router.add_get("/glossaries/{glossary_id}", self.glossary_route(glossaries.get))
        app.router.add_delete("/glossaries/{glossary_id}", self.glossary_route(glossaries.delete))
        for path, (file, content_type) in frontend.PAGE_FILES.items():
            app.router.add_get(path, functools.partial(self.page, file, content_type))
        return app

    async def _admit(self, request: web.Request, fields: dict[str, Any], texts: list[str]) -> Caller:
        key = fields.get("api_key")
        if key is not None and not isinstance(key, str):
            raise InvalidRequest("api_key must be a string")
        return await self.keys.admit(key, request.remote or "", sum(map(len, texts)))

    # --- routes ---------------------------------------------------------------------------

    async def _answer(self, exchange: Exchange, respond: Callable[[], Awaitable[web.Response]]) -> web.Response:
        """What ``respond`` answers, with the outcome in the exchange's access record: an error as its status
        (server.errors), while aiohttp's own refusals and a client that went away are recorded and go on up."""
        try:
            response = await respond()
        except web.HTTPException as error:  # aiohttp's own (a body over client_max_size): json_errors answers it
            self.access.finish(exchange, "RESOURCE_EXHAUSTED" if error.status == 413 else "INVALID_ARGUMENT")
            raise
        except asyncio.CancelledError:  # the client went away
            self.access.finish(exchange, "CANCELLED")
            raise
        except Exception as error:
            return self._fail(exchange, error)
        self.access.finish(exchange, "OK")
        return response

    async def translate(self, request: web.Request) -> web.Response:
        exchange = Exchange("HTTP /translate", request[REQUEST_ID])
        exchange.span = request_span("HTTP /translate", request.headers, exchange.request_id)
        return await self._answer(exchange, lambda: self._translate(request, exchange))

    async def _translate(self, request: web.Request, exchange: Exchange) -> web.Response:
        # The body's length bounds its characters: a request the door has no room for is refused unread.
        with self.translations.door.enter(request.content_length or 0) as held:
            fields = await request_fields(request)
            texts, as_list = texts_of(fields)
            held.resize(sum(map(len, texts)))
            return await self._translated(request, exchange, fields, texts, as_list)

    async def _translated(
        self, request: web.Request, exchange: Exchange, fields: dict[str, Any], texts: list[str], as_list: bool
    ) -> web.Response:
        """The answer to /translate's ``fields``, whose texts are ``texts`` (``as_list``: q came as a list)."""
        options = translate_options(fields, self.config)
        caller = await self._admit(request, fields, texts)
        exchange.caller = caller.name
        options = replace(options, glossary=await self._glossary(fields, caller))
        engine, detected = model_of(self.models, fields, texts, options)
        exchange.engine = engine
        exchange.texts = texts
        results = await self.translations.translate(engine, texts, options, exchange)
        one = (lambda values: values) if as_list else (lambda values: values[0])
        body = {
            "translatedText": one([result.text for result in results]),
            "confidence": one([round(result.confidence, 4) for result in results]),
        }
        if options.decode.alternatives:
            body["alternatives"] = one([list(result.alternatives) for result in results])
        if detected is not None:
            body["detectedLanguage"] = one([vars(detected)] * len(results))
        flags = [[flag for flag in (r.guard, "low_confidence" if r.low_confidence else "") if flag] for r in results]
        if any(flags):
            body["flags"] = one(flags)
        if options.glossary is not None:
            body["glossaryApplied"] = one([dict(Counter(result.glossary_applied)) for result in results])
        return web.json_response(body, headers=model_header(engine))

    async def _glossary(self, fields: dict[str, Any], caller: Caller) -> Glossary | None:
        """The request's glossary: its own (``glossary``: an object, or its JSON text in a form) or a stored one of
        the caller's (``glossary_id``), not both."""
        inline = inline_glossary(fields.get("glossary"))
        glossary_id = fields.get("glossary_id")
        if glossary_id in (None, ""):
            return inline
        if inline is not None:
            raise InvalidRequest("send glossary (its entries) or glossary_id (a stored one), not both")
        return await self.translations.glossaries.glossary(caller.name, glossary_id)

    def glossary_route(self, handle: Callable[[web.Request, dict[str, Any], Caller], Awaitable[web.Response]]):
        """A /glossaries route: its fields read, its caller admitted, its outcome recorded."""

        async def route(request: web.Request) -> web.Response:
            exchange = Exchange("HTTP /glossaries", request[REQUEST_ID])

            async def respond() -> web.Response:
                fields = await request_fields(request) if request.method == "POST" else dict(request.query)
                entries = fields.get("entries")
                caller = await self._admit(request, fields, [entries] if isinstance(entries, str) else [])
                exchange.caller = caller.name
                return await handle(request, fields, caller)

            return await self._answer(exchange, respond)

        return route

    async def languages(self, request: web.Request) -> web.Response:
        """Each source language with the targets the server translates it into, in model order."""
        self.access.finish(Exchange("HTTP /languages", request[REQUEST_ID]), "OK")
        return web.json_response(frontend.languages(self.models))

    async def translate_file(self, request: web.Request) -> web.Response:
        """LibreTranslate's /translate_file: a multipart form with file, source, target (and api_key); answers
        {"translatedFileUrl"}, the file's one download (server/documents/files.py has the formats)."""
        exchange = Exchange("HTTP /translate_file", request[REQUEST_ID])
        exchange.span = request_span("HTTP /translate_file", request.headers, exchange.request_id)
        return await self._answer(exchange, lambda: self._translate_file(request, exchange))

    async def _translate_file(self, request: web.Request, exchange: Exchange) -> web.Response:
        with self.translations.door.enter(request.content_length or 0) as held:  # as /translate's
            fields = await request_fields(request)
            upload = fields.get("file")
            if not isinstance(upload, web.FileField):
                raise InvalidRequest("Invalid request: missing file parameter (a multipart/form-data upload)")
            data = upload.file.read()
            held.resize(len(data))  # its bytes first, its texts once read (a zipped format's may be more)
            document = await self.translations.work(len(data), lambda: read_document(upload.filename or "", data))
            held.resize(sum(map(len, document.texts)))
            return await self._translated_file(request, exchange, fields, upload, document)

    async def _translated_file(
        self,
        request: web.Request,
        exchange: Exchange,
        fields: dict[str, Any],
        upload: web.FileField,
        document: Document,
    ) -> web.Response:
        """The answer to /translate_file's ``fields``, whose ``upload`` was read as ``document``."""
        if len(document.texts) > self.config.max_file_texts:
            raise InvalidRequest(
                f"{upload.filename!r} has {len(document.texts)} texts (lines, paragraphs or subtitles), over "
                f"the limit of {self.config.max_file_texts} (max_file_texts)"
            )
        exchange.texts = document.texts
        caller = await self._admit(request, fields, document.texts)
        exchange.caller = caller.name
        options = replace(file_options(document.format, self.config), glossary=await self._glossary(fields, caller))
        engine, _ = model_of(self.models, fields, document.texts, options)
        exchange.engine = engine
        translations = await self._translate_all(engine, document.texts, options, exchange)
        name = self.files.save(upload.filename or "file", document.write(translations))
        url = request.url.origin().join(request.app.router["download_file"].url_for(name=name))
        return web.json_response({"translatedFileUrl": str(url)}, headers=model_header(engine))

    async def _translate_all(
        self, engine: Engine | None, texts: list[str], options: TranslateOptions, exchange: Exchange
    ) -> list[str]:
        """Every text, in requests of at most batch_limit decoding at once (none: as sent, Models.choose)."""
        step = self.config.batch_limit if self.config.batch_limit > 0 else max(len(texts), 1)
        parts = await asyncio.gather(
            *(
                self.translations.translate(engine, texts[i : i + step], options, exchange)
                for i in range(0, len(texts), step)
            )
        )
        return [result.text for part in parts for result in part]

    async def download_file(self, request: web.Request) -> web.Response:
        """A translated file, once; then it is gone (or after file_ttl_s)."""
        name = request.match_info["name"]
        try:
            data = self.files.take(name)
        except FileNotFoundError:
            return error_response(404, f"no file {name!r}: each is downloaded once, within file_ttl_s of its making")
        self.access.finish(Exchange("HTTP /download_file", request[REQUEST_ID]), "OK")
        original = name.split("-", 1)[1]
        headers = {"Content-Disposition": f'attachment; filename="{original}"'}
        return web.Response(body=data, content_type="application/octet-stream", headers=headers)

    async def detect(self, request: web.Request) -> web.Response:
        """LibreTranslate's /detect: [{"confidence": 0-100, "language": code}], best first: a language no model
        reads first where it is the verdict, else the served source languages (server/documents/detect.py)."""
        exchange = Exchange("HTTP /detect", request[REQUEST_ID])
        return await self._answer(exchange, lambda: self._detect(request, exchange))

    async def _detect(self, request: web.Request, exchange: Exchange) -> web.Response:
        fields = await request_fields(request)
        q = fields.get("q")
        if not isinstance(q, str) or not q.strip():
            raise InvalidRequest("Invalid request: missing q parameter (a string)")
        exchange.texts = [q]
        exchange.caller = (await self._admit(request, fields, [q])).name
        found = self.models.detector.detect(q)
        return web.json_response([{"confidence": d.confidence, "language": d.language} for d in found])

    async def frontend_settings(self, request: web.Request) -> web.Response:
        """What LibreTranslate's page reads first (server/doors/frontend.py)."""
        self.access.finish(Exchange("HTTP /frontend/settings", request[REQUEST_ID]), "OK")
        return web.json_response(frontend.frontend_settings(self.models, self.keys, self.config))

    async def page(self, file: str, content_type: str, request: web.Request) -> web.Response:
        """The page at / and its files."""
        self.access.finish(Exchange(f"HTTP {request.path}", request[REQUEST_ID]), "OK")
        return frontend.page_file(file, content_type)

    async def spec(self, request: web.Request) -> web.Response:
        """The OpenAPI document of this API (server/doors/openapi.py)."""
        self.access.finish(Exchange("HTTP /spec", request[REQUEST_ID]), "OK")
        return web.json_response(openapi.spec(self.models, self.config.max_beam_size - 1))

    async def health(self, request: web.Request) -> web.Response:
        """LibreTranslate's {"status": "ok"} while the server serves; 503 with "starting" before it is warm and
        "draining" once it refuses new work (SIGTERM), so a load balancer sends requests elsewhere."""
        self.access.finish(Exchange("HTTP /health", request[REQUEST_ID]), "OK")
        if not self.translations.scheduler.accepting:
            return web.json_response({"status": "draining"}, status=503)
        if not self.serving:
            return web.json_response({"status": "starting"}, status=503)
        return web.json_response({"status": "ok"})

    async def suggest(self, request: web.Request) -> web.Response:
        """LibreTranslate's /suggest: q, s (the suggested translation), source and target, stored
        (server/documents/suggestions.py); 403 unless the server runs with --suggestions."""
        exchange = Exchange("HTTP /suggest", request[REQUEST_ID])
        return await self._answer(exchange, lambda: self._suggest(request, exchange))

    async def _suggest(self, request: web.Request, exchange: Exchange) -> web.Response:
        if self.suggestions is None:
            raise PermissionDenied("Suggestions are disabled on this server.")
        fields = await request_fields(request)
        suggestion = suggestion_of(fields)
        exchange.texts = [suggestion["q"], suggestion["s"]]
        exchange.caller = (await self._admit(request, fields, exchange.texts)).name
        await self.suggestions.add(suggestion)
        return web.json_response({"success": True})

    def _fail(self, exchange: Exchange, error: BaseException) -> web.Response:
        status, message = http_status_of(error)
        if not isinstance(error, ServiceError):
            log.exception("unexpected error in %s (request %s)", exchange.method, exchange.request_id, exc_info=error)
        self.access.finish(exchange, status_of(error)[0].name)
        headers = model_header(exchange.engine)
        if isinstance(error, ServiceError) and error.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
        return error_response(status, message, headers)
