"""gRPC handlers: protobuf in, plain jobs to the scheduler, protobuf out. Nothing else."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc

from proto import translate_pb2, translate_pb2_grpc
from server.config import ServerConfig
from server.errors import InvalidRequest, ServiceError, status_of
from server.interface import Engine
from server.metrics import Metrics, length_bucket
from server.scheduler import Job, Scheduler, Segment
from server.text import SegmentSpec, TextLimits, segment_texts

log = logging.getLogger(__name__)
MALFORMED = object()  # what the tolerant deserializer returns for bytes that are no valid message


def _check_parsed(request) -> None:
    if request is MALFORMED:
        raise InvalidRequest("the request is not a valid translation.v1 message (is every text valid UTF-8?)")


class TranslatorService(translate_pb2_grpc.TranslatorServicer):
    def __init__(self, engine: Engine, scheduler: Scheduler, config: ServerConfig, metrics: Metrics) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.config = config
        self.metrics = metrics
        self.limits = TextLimits(
            config.max_texts, config.max_source_tokens, config.long_input_tokens, config.long_input
        )

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

    def _specs(self, request: translate_pb2.TranslateRequest) -> list[list[SegmentSpec]]:
        long_inputs = self.metrics.long_inputs
        return segment_texts(
            list(request.texts), self.engine.tokenize, self.limits, lambda p: long_inputs.labels(p).inc()
        )

    async def _run(
        self, request: translate_pb2.TranslateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Segment]:
        """Submit the request and yield its segments in order as they finish."""
        _check_parsed(request)
        beam, max_output = self._options(request)
        specs = [spec for text in self._specs(request) for spec in text]
        loop = asyncio.get_running_loop()
        finished: asyncio.Queue[Segment | ServiceError | None] = asyncio.Queue()
        remaining = context.time_remaining()
        job = Job(
            specs, beam, max_output,
            on_segment=lambda segment: loop.call_soon_threadsafe(finished.put_nowait, segment),
            on_done=lambda error: loop.call_soon_threadsafe(finished.put_nowait, error),
            deadline=time.monotonic() + remaining if remaining is not None else None,
        )  # fmt: skip
        self.scheduler.submit(job)
        ready: dict[int, Segment] = {}
        order = {id(spec): i for i, spec in enumerate(specs)}
        next_index = 0
        try:
            while next_index < len(specs):
                item = await finished.get()
                if isinstance(item, ServiceError):
                    raise item
                if item is None:
                    continue
                ready[order[id(item.spec)]] = item
                while next_index in ready:
                    yield ready.pop(next_index)
                    next_index += 1
        except asyncio.CancelledError:
            self.scheduler.cancel(job)
            raise

    def _observe_texts(self, segments: list[Segment], started: float) -> None:
        per_text: dict[int, int] = {}
        for s in segments:
            per_text[s.spec.text_index] = per_text.get(s.spec.text_index, 0) + s.source_tokens
        elapsed = time.monotonic() - started
        for tokens in per_text.values():
            self.metrics.request_latency.labels(length_bucket(tokens)).observe(elapsed)

    async def _fail(self, method: str, error: BaseException, context: grpc.aio.ServicerContext) -> None:
        code, message = status_of(error)
        if not isinstance(error, ServiceError):
            log.exception("unexpected error in %s", method, exc_info=error)
        self.metrics.requests.labels(method, code.name).inc()
        await context.abort(code, message)

    # --- RPCs -------------------------------------------------------------------------

    async def Translate(self, request, context):  # noqa: N802 (gRPC's method names)
        started = time.monotonic()
        try:
            segments = [s async for s in self._run(request, context)]
        except asyncio.CancelledError:
            self.metrics.requests.labels("Translate", "CANCELLED").inc()
            raise
        except Exception as error:
            await self._fail("Translate", error, context)
        self._observe_texts(segments, started)
        texts: dict[int, list[Segment]] = {}
        for segment in segments:
            texts.setdefault(segment.spec.text_index, []).append(segment)
        outputs = self.engine.detokenize([s.output for s in segments])
        by_segment = dict(zip(map(id, segments), outputs, strict=True))
        translations = [
            translate_pb2.Translation(
                text=" ".join(by_segment[id(s)] for s in parts),
                input_tokens=sum(s.source_tokens for s in parts),
                output_tokens=sum(len(s.output) for s in parts),
                segments=len(parts),
                truncated=any(s.spec.truncated for s in parts),
            )
            for _, parts in sorted(texts.items())
        ]
        self.metrics.requests.labels("Translate", "OK").inc()
        return translate_pb2.TranslateResponse(
            translations=translations, model=f"{self.engine.name}@{self.engine.version}"
        )

    async def TranslateStream(self, request, context):  # noqa: N802
        started = time.monotonic()
        segments = []
        last_of_text: dict[int, int] = {}
        try:
            async for segment in self._run(request, context):
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
        self._observe_texts(segments, started)
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
