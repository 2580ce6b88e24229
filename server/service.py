"""gRPC handlers: protobuf in, texts to the shared translation core, protobuf out. Nothing else."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from proto import translate_pb2, translate_pb2_grpc
from server.config import ServerConfig
from server.errors import InvalidRequest, ServiceError, status_of
from server.interface import Engine
from server.metrics import Metrics
from server.scheduler import Scheduler
from server.translations import Translations

log = logging.getLogger(__name__)
MALFORMED = object()  # what the tolerant deserializer returns for bytes that are no valid message


def _check_parsed(request) -> None:
    if request is MALFORMED:
        raise InvalidRequest("the request is not a valid translation.v1 message (is every text valid UTF-8?)")


class TranslatorService(translate_pb2_grpc.TranslatorServicer):
    def __init__(
        self,
        engine: Engine,
        scheduler: Scheduler,
        config: ServerConfig,
        metrics: Metrics,
        translations: Translations | None = None,
    ) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.config = config
        self.metrics = metrics
        self.translations = translations or Translations(engine, scheduler, config, metrics)

    # --- request -> job ---------------------------------------------------------------

    def _options(self, request: translate_pb2.TranslateRequest) -> tuple[int, int]:
        beam = request.options.beam_size or self.config.default_beam_size
        if beam > self.config.max_beam_size:
            raise InvalidRequest(
                f"options.beam_size={beam} is over the limit {self.config.max_beam_size} (max_beam_size)"
            )
        max_output = request.options.max_output_tokens or self.config.max_output_tokens
        if max_output > self.config.max_output_tokens:
            raise InvalidRequest(
                f"options.max_output_tokens={max_output} is over the limit {self.config.max_output_tokens} (max_output_tokens)"
            )
        return beam, max_output

    def _job(self, request, context: grpc.aio.ServicerContext) -> tuple[list[str], int, int, float | None]:
        """The request's texts, beam, output limit and deadline (a ``time.monotonic()`` instant, or None)."""
        _check_parsed(request)
        beam, max_output = self._options(request)
        remaining = context.time_remaining()
        return list(request.texts), beam, max_output, time.monotonic() + remaining if remaining is not None else None

    async def _fail(self, method: str, error: BaseException, context: grpc.aio.ServicerContext) -> None:
        code, message = status_of(error)
        if not isinstance(error, ServiceError):
            log.exception("unexpected error in %s", method, exc_info=error)
        self.metrics.requests.labels(method, code.name).inc()
        await context.abort(code, message)

    # --- RPCs -------------------------------------------------------------------------

    async def Translate(self, request, context):  # noqa: N802 (gRPC's method names)
        try:
            results = await self.translations.translate(*self._job(request, context))
        except asyncio.CancelledError:
            self.metrics.requests.labels("Translate", "CANCELLED").inc()
            raise
        except Exception as error:
            await self._fail("Translate", error, context)
        self.metrics.requests.labels("Translate", "OK").inc()
        return translate_pb2.TranslateResponse(
            translations=[translate_pb2.Translation(**vars(result)) for result in results],
            model=f"{self.engine.name}@{self.engine.version}",
        )

    async def TranslateStream(self, request, context):  # noqa: N802
        started = time.monotonic()
        segments = []
        last_of_text: dict[int, int] = {}
        try:
            async for segment in self.translations.segments(*self._job(request, context)):
                if not last_of_text:
                    for s in segment.job.specs:
                        last_of_text[s.text_index] = max(last_of_text.get(s.text_index, 0), s.segment_index)
                segments.append(segment)
                spec = segment.spec
                yield translate_pb2.TranslationSegment(
                    text_index=spec.text_index, segment_index=spec.segment_index, source=spec.source,
                    translation=self.engine.detokenize([segment.output])[0], input_tokens=segment.source_tokens,
                    output_tokens=len(segment.output), last_in_text=spec.segment_index == last_of_text[spec.text_index],
                )  # fmt: skip
        except asyncio.CancelledError:
            self.metrics.requests.labels("TranslateStream", "CANCELLED").inc()
            raise
        except Exception as error:
            await self._fail("TranslateStream", error, context)
        self.translations.observe(segments, started)
        self.metrics.requests.labels("TranslateStream", "OK").inc()

    async def GetModelInfo(self, request, context):  # noqa: N802
        if request is MALFORMED:
            await self._fail("GetModelInfo", InvalidRequest("the request is not a valid GetModelInfoRequest"), context)
        c = self.config
        self.metrics.requests.labels("GetModelInfo", "OK").inc()
        return translate_pb2.ModelInfo(
            name=self.engine.name, source_language=self.engine.source_language, target_language=self.engine.target_language,
            version=self.engine.version, provider=self.engine.provider, variant=self.engine.variant,
            limits=translate_pb2.Limits(
                max_texts=c.max_texts, max_source_tokens=c.max_source_tokens, long_input_tokens=c.long_input_tokens,
                max_beam_size=c.max_beam_size, max_output_tokens=c.max_output_tokens,
                max_message_bytes=c.max_message_bytes, long_input_policy=c.long_input,
            ),
        )  # fmt: skip
