"""gRPC handlers: protobuf in, texts to the shared translation core, protobuf out. Nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections import Counter

import grpc

from proto import translate_pb2, translate_pb2_grpc
from server.config import ServerConfig
from server.documents.detect import Detected
from server.documents.glossaries import GlossaryInfo, new_glossary
from server.documents.glossary import Glossary, inline_glossary
from server.doors.door import Held
from server.errors import InvalidRequest, ServiceError, status_of
from server.interface import Engine
from server.models import Models, model_name
from server.operations.access import (
    ATTEMPT_HEADER,
    PREVIOUS_ATTEMPTS,
    REQUEST_ID_HEADER,
    AccessLog,
    Exchange,
    request_id,
)
from server.operations.keys import KEY_METADATA, KeyGuard
from server.operations.tracing import request_span
from server.options import TranslateOptions
from server.scheduling.jobs import decode_options
from server.translations import Translations

log = logging.getLogger(__name__)
MALFORMED = object()  # what the tolerant deserializer returns for bytes that are no valid message


def _check_parsed(request) -> None:
    if request is MALFORMED:
        raise InvalidRequest("the request is not a valid translation.v1 message (is every text valid UTF-8?)")


def rpc(method: str):
    """An RPC handler's one path for what every RPC does alike: its access record (``Exchange``, passed to
    the handler), and any exception as the status code and message of ``server.errors``' table (the
    call is aborted with it, the record finished with the code). Handlers raise; they never abort."""

    def decorate(handler):
        if inspect.isasyncgenfunction(handler):

            @functools.wraps(handler)
            async def stream(self: TranslatorService, request, context: grpc.aio.ServicerContext):
                exchange = self._exchange(method, context)
                async with self._answering(exchange, context):
                    async for reply in handler(self, request, context, exchange):
                        yield reply

            return stream

        @functools.wraps(handler)
        async def unary(self: TranslatorService, request, context: grpc.aio.ServicerContext):
            exchange = self._exchange(method, context)
            async with self._answering(exchange, context):
                reply = await handler(self, request, context, exchange)
            return reply

        return unary

    return decorate


class TranslatorService(translate_pb2_grpc.TranslatorServicer):
    def __init__(
        self, models: Models, translations: Translations, config: ServerConfig, access: AccessLog, keys: KeyGuard
    ) -> None:
        self.keys = keys
        self.models = models
        self.translations = translations
        self.config = config
        self.access = access

    # --- request -> job ---------------------------------------------------------------

    def _options(
        self, request, context: grpc.aio.ServicerContext, glossary: Glossary | None = None
    ) -> TranslateOptions:
        """The request's options, once: its decoding within the server's limits, its deadline (the caller's,
        as a ``time.monotonic()`` instant), its minimum confidence, its format, its finishing (on unless set
        false) and its glossary (``_glossary``)."""
        options = request.options
        decode = decode_options(
            self.config, options.beam_size, options.max_output_tokens, options.alternatives, prefix="options."
        )
        remaining = context.time_remaining()
        deadline = time.monotonic() + remaining if remaining is not None else None
        return TranslateOptions(
            decode,
            deadline,
            options.min_confidence or None,
            options.format or "text",
            mirror_formatting=options.mirror_formatting,  # unset: false, the model's output (the HTTP API's is true)
            pass_through=not options.HasField("pass_through") or options.pass_through,
            glossary=glossary,
        )

    async def _glossary(self, request, exchange: Exchange) -> Glossary | None:
        """The request's glossary: its own (options.glossary) or one the caller stored (options.glossary_id)."""
        _check_parsed(request)
        options = request.options
        inline = inline_glossary(dict(options.glossary), "options.glossary")
        if not options.glossary_id:
            return inline
        if inline is not None:
            raise InvalidRequest("send options.glossary or options.glossary_id, not both")
        return await self.translations.glossaries.glossary(exchange.caller, options.glossary_id)

    def _model(self, request) -> Engine:
        """The model a (parsed) request chooses."""
        _check_parsed(request)
        return self.models.resolve(request.model, request.source_language, request.target_language)

    def _translation_model(self, request, options: TranslateOptions) -> tuple[Engine | None, Detected | None]:
        """The model a (parsed) translation request chooses, detecting its source language for "auto"; none
        where the texts are in the target language already and come back as sent (``Models.choose``)."""
        _check_parsed(request)
        source, target = request.source_language, request.target_language
        return self.models.choose(request.texts, request.model, source, target, options.format, options.pass_through)

    async def _admit(
        self, request, context: grpc.aio.ServicerContext, exchange: Exchange, chars: int | None = None
    ) -> None:
        """The caller's API key (the x-api-key metadata) and limits (server/operations/keys.py), for the request's
        texts' characters or ``chars``."""
        _check_parsed(request)
        if chars is None:
            chars = sum(map(len, request.texts if hasattr(request, "texts") else [request.text]))
        key = dict(context.invocation_metadata() or ()).get(KEY_METADATA)
        address = context.peer().rsplit(":", 1)[0]  # ipv4:127.0.0.1:5555, ipv6:[::1]:5555: the port varies
        exchange.caller = (await self.keys.admit(key, address, chars)).name

    def _exchange(self, method: str, context: grpc.aio.ServicerContext) -> Exchange:
        """The request's access record; its ID goes back in the trailing metadata, whatever the outcome."""
        metadata = dict(context.invocation_metadata() or ())
        exchange = Exchange(method, request_id(metadata.get(REQUEST_ID_HEADER)))
        exchange.previous_attempts = int(metadata.get(PREVIOUS_ATTEMPTS, "0") or 0)
        exchange.span = request_span(method, metadata, exchange.request_id)
        trailing = [(REQUEST_ID_HEADER, exchange.request_id)]
        if exchange.previous_attempts:  # the caller's gRPC retried: say so, so it can count its retries
            trailing.append((ATTEMPT_HEADER, str(exchange.previous_attempts + 1)))
        context.set_trailing_metadata(tuple(trailing))
        return exchange

    @contextlib.asynccontextmanager
    async def _answering(self, exchange: Exchange, context: grpc.aio.ServicerContext):
        """The RPC's outcome into its access record; an exception aborts the call with its status code."""
        try:
            yield
        except asyncio.CancelledError:
            self.access.finish(exchange, "CANCELLED")
            raise
        except Exception as error:
            await self._fail(exchange, error, context)
        self.access.finish(exchange, "OK")

    async def _fail(self, exchange: Exchange, error: BaseException, context: grpc.aio.ServicerContext) -> None:
        code, message = status_of(error)
        if not isinstance(error, ServiceError):
            log.exception("unexpected error in %s (request %s)", exchange.method, exchange.request_id, exc_info=error)
        self.access.finish(exchange, code.name)
        await context.abort(code, message)

    # --- RPCs (each through ``rpc``: its access record, and its errors as status codes) ---------------

    def _door(self, request) -> Held:
        """The request's place at the front door (server/doors/door.py), or Overloaded before any of its work."""
        _check_parsed(request)
        return self.translations.door.enter(sum(map(len, request.texts)))

    @rpc("Translate")
    async def Translate(self, request, context, exchange: Exchange):  # noqa: N802 (gRPC's method names)
        with self._door(request):
            return await self._translate(request, context, exchange)

    async def _translate(self, request, context, exchange: Exchange) -> translate_pb2.TranslateResponse:
        await self._admit(request, context, exchange)
        options = self._options(request, context, await self._glossary(request, exchange))
        exchange.engine, detected = self._translation_model(request, options)
        exchange.texts = list(request.texts)
        results = await self.translations.translate(exchange.engine, exchange.texts, options, exchange)
        return translate_pb2.TranslateResponse(
            translations=[
                translate_pb2.Translation(**(vars(result) | {"glossary_applied": Counter(result.glossary_applied)}))
                for result in results
            ],
            model=model_name(exchange.engine),
            detected_language=translate_pb2.DetectedLanguage(**vars(detected)) if detected else None,
        )

    @rpc("TranslateStream")
    async def TranslateStream(self, request, context, exchange: Exchange):  # noqa: N802
        with self._door(request):
            async for segment in self._translate_stream(request, context, exchange):
                yield segment

    async def _translate_stream(self, request, context, exchange: Exchange):
        await self._admit(request, context, exchange)
        options = self._options(request, context, await self._glossary(request, exchange))
        if options.format != "text":
            raise InvalidRequest(
                f"options.format={options.format!r}: TranslateStream streams sentences of plain text; "
                "use Translate for markup"
            )
        engine = exchange.engine = self._translation_model(request, options)[0]
        exchange.texts = list(request.texts)
        if engine is None:  # in the target language already: each text as one segment, as sent
            for t, result in enumerate(await self.translations.translate(None, exchange.texts, options, exchange)):
                yield translate_pb2.TranslationSegment(
                    text_index=t, source=result.text, translation=result.text, last_in_text=True
                )
            return
        async for answer in self.translations.streamed(engine, exchange.texts, options, exchange):
            segment, spec = answer.decoded, answer.decoded.spec
            yield translate_pb2.TranslationSegment(
                text_index=spec.text_index,
                segment_index=spec.segment_index,
                source=spec.source,
                translation=answer.translation,
                alternatives=answer.alternatives,
                input_tokens=segment.source_tokens,
                output_tokens=len(segment.output),
                last_in_text=segment.last_in_text,
                model=model_name(engine),
                confidence=segment.result.score,
                guard=segment.guard,
                low_confidence=segment.low_confidence(options.min_confidence),
                glossary_applied=Counter(answer.glossary_applied),
            )

    @rpc("GetModelInfo")
    async def GetModelInfo(self, request, context, exchange: Exchange):  # noqa: N802
        exchange.engine = self._model(request)
        return self._info(exchange.engine)

    @rpc("ListModels")
    async def ListModels(self, request, context, exchange: Exchange):  # noqa: N802
        if request is MALFORMED:
            raise InvalidRequest("the request is not a valid ListModelsRequest")
        return translate_pb2.ListModelsResponse(models=[self._info(engine) for engine in self.models])

    @rpc("Detect")
    async def Detect(self, request, context, exchange: Exchange):  # noqa: N802
        await self._admit(request, context, exchange)
        exchange.texts = [request.text]
        found = self.models.detector.detect(request.text)
        return translate_pb2.DetectResponse(languages=[translate_pb2.DetectedLanguage(**vars(d)) for d in found])

    @rpc("CreateGlossary")
    async def CreateGlossary(self, request, context, exchange: Exchange):  # noqa: N802
        await self._admit(request, context, exchange, sum(len(s) + len(t) for s, t in request.entries.items()))
        source, target = request.source_language, request.target_language
        stored = new_glossary(exchange.caller, request.name, source, target, dict(request.entries))
        self.models.resolve(source=stored.info.source_lang, target=stored.info.target_lang)  # a pair served here
        return _glossary_info(await self.translations.glossaries.create(stored))

    @rpc("ListGlossaries")
    async def ListGlossaries(self, request, context, exchange: Exchange):  # noqa: N802
        await self._admit(request, context, exchange, 0)
        owned = await self.translations.glossaries.owned(exchange.caller)
        return translate_pb2.ListGlossariesResponse(glossaries=[_glossary_info(info) for info in owned])

    @rpc("GetGlossary")
    async def GetGlossary(self, request, context, exchange: Exchange):  # noqa: N802
        await self._admit(request, context, exchange, 0)
        info, entries = await self.translations.glossaries.entries(exchange.caller, request.glossary_id)
        return _glossary_info(info, entries)

    @rpc("DeleteGlossary")
    async def DeleteGlossary(self, request, context, exchange: Exchange):  # noqa: N802
        await self._admit(request, context, exchange, 0)
        await self.translations.glossaries.delete(exchange.caller, request.glossary_id)
        return translate_pb2.DeleteGlossaryResponse()

    def _info(self, engine: Engine) -> translate_pb2.ModelInfo:
        c = self.config
        return translate_pb2.ModelInfo(
            name=engine.name,
            source_language=engine.source_language,
            target_language=engine.target_language,
            version=engine.version,
            provider=engine.provider,
            variant=engine.variant,
            limits=translate_pb2.Limits(
                max_texts=max(c.batch_limit, 0),
                max_source_tokens=c.max_source_tokens,
                long_input_tokens=c.long_input_tokens,
                max_beam_size=c.max_beam_size,
                max_output_tokens=c.max_output_tokens,
                max_message_bytes=c.max_message_bytes,
                long_input_policy=c.long_input,
            ),
        )


def _glossary_info(info: GlossaryInfo, entries: dict[str, str] | None = None) -> translate_pb2.GlossaryInfo:
    return translate_pb2.GlossaryInfo(
        glossary_id=info.glossary_id,
        name=info.name,
        source_language=info.source_lang,
        target_language=info.target_lang,
        entry_count=info.entry_count,
        creation_time=info.creation_time,
        entries=entries or {},
    )
