"""Texts in, translations out, through the scheduler: what every front end (gRPC, HTTP) shares.

A front end turns its request into a model (``server.models``), texts and options, and its errors into
its own status codes (``server.errors``); everything between (segmentation, the job, waiting for its
segments in order, the translation cache, cancellation, latency metrics) is here once, and server/answers.py
makes each text's answer of its sentences.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from opentelemetry.trace import INVALID_SPAN

from runtime.manifest import ModelFolderError
from runtime.search import Hypothesis
from server import answers
from server.answers import DecodedSentence, SentenceAnswer, TextTranslation
from server.cache import TranslationCache
from server.config import ServerConfig
from server.documents import aligned, formatting, markup, placement
from server.documents.glossaries import GlossaryStore
from server.documents.glossary import Glossary
from server.documents.text import NO_LIMIT, TextLimits, check_texts, segment_texts
from server.doors.door import SHORT, Door, DoorLimits, kind_of
from server.errors import InvalidRequest, ServiceError
from server.interface import Engine
from server.operations.access import Exchange
from server.operations.metrics import Metrics
from server.operations.tracing import child_span
from server.options import TranslateOptions
from server.scheduling.jobs import Job, QueuedSentence
from server.scheduling.scheduler import Scheduler
from server.sentences import SplitSentence

T = TypeVar("T")


class Translations:
    def __init__(self, scheduler: Scheduler, config: ServerConfig, metrics: Metrics) -> None:
        self.scheduler, self.metrics = scheduler, metrics
        self.limits = TextLimits(
            config.batch_limit, config.char_limit, config.max_source_tokens, config.long_input_tokens, config.long_input
        )
        self.cache = TranslationCache(config.cache_bytes) if config.cache_bytes else None
        self.glossaries = GlossaryStore(config)  # stored glossaries, for every front end
        limits = DoorLimits(config.door_requests, config.door_long_chars, config.max_loop_lag_ms / 1000)
        self.door = Door(limits, metrics)
        # One thread for long requests' parsing, splitting and putting back: one document's Python at a time
        # shares the GIL with the event loop and the lanes, and the door bounds how many wait for it.
        self.documents = ThreadPoolExecutor(1, thread_name_prefix="documents")

    async def work(self, chars: int, work: Callable[[], T]) -> T:
        """``work()``, for a request of ``chars`` characters: on the event loop where the request is short (a hop
        to a thread would cost more), else on the documents' thread, so that the loop keeps answering health
        checks, refusals and short requests while a document is parsed, split or put back together."""
        if kind_of(chars) == SHORT:
            return work()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.documents, contextvars.copy_context().run, work)

    def _cached(self, engine: Engine, keys: list[bytes]) -> dict[int, Hypothesis]:
        """The outputs the cache holds, by segment index; counts hits and misses."""
        if self.cache is None:
            return {}
        outputs = {i: output for i, key in enumerate(keys) if (output := self.cache.get(key)) is not None}
        lookups = self.metrics.cache_lookups
        lookups.labels(engine.name, "hit").inc(len(outputs))
        lookups.labels(engine.name, "miss").inc(len(keys) - len(outputs))
        return outputs

    def _keep(self, key: bytes, result: Hypothesis) -> None:
        if self.cache is not None:
            self.cache.put(key, result)
            self.metrics.cache_bytes.set(self.cache.bytes)
            self.metrics.cache_entries.set(len(self.cache))

    async def segments(
        self,
        engine: Engine,
        texts: Sequence[str],
        options: TranslateOptions,
        limits: TextLimits | None = None,
        tokenized: Sequence[list[int]] | None = None,
        aligned: Collection[int] = (),
    ) -> AsyncIterator[DecodedSentence]:
        """The texts' segments for ``engine``'s model, yielded in order as they are translated: those the
        cache holds at once, the others submitted as one job; each with up to ``options.decode.alternatives``
        of its beam's other outputs. Raises the ServiceError that ended the job; cancelling the caller's task
        cancels the job. ``options.field`` names the texts in errors; ``options.keep_empty`` and ``tokenized``: see
        segment_texts. The sentences of the texts at ``aligned`` keep their encoder's output for the aligner."""
        long_inputs = self.metrics.long_inputs
        on_long = lambda policy: long_inputs.labels(policy).inc()
        limits, decode = limits or self.limits, options.decode
        language = engine.source_language

        def split() -> tuple[list[list[SplitSentence]], list[bytes]]:
            by_text = segment_texts(
                texts,
                engine.tokenize,
                limits,
                on_long,
                options.field,
                options.keep_empty,
                language,
                tokenized,
                lower_case=options.mirror_formatting and options.format == "text",  # lower-cased again after
                aligned=aligned,
            )
            return by_text, [TranslationCache.key(engine, spec.ids, decode) for text in by_text for spec in text]

        by_text, keys = await self.work(sum(map(len, texts)), split)
        specs = [spec for text in by_text for spec in text]
        if not specs:
            return
        last = {id(text[-1]) for text in by_text if text}
        ready = self._cached(engine, keys)
        order = {id(spec): i for i, spec in enumerate(specs)}
        job = None
        if len(ready) < len(specs):
            loop = asyncio.get_running_loop()
            finished: asyncio.Queue[QueuedSentence | ServiceError] = asyncio.Queue()

            def on_done(error: ServiceError | None) -> None:  # success: each segment came with its own wake-up
                if error is not None:
                    loop.call_soon_threadsafe(finished.put_nowait, error)

            job = Job(
                [spec for i, spec in enumerate(specs) if i not in ready],
                decode,
                on_segment=lambda segment: loop.call_soon_threadsafe(finished.put_nowait, segment),
                on_done=on_done,
                deadline=options.deadline,
                model=engine.name,
            )
            self.scheduler.submit(job)
        decoded: dict[int, tuple[Any, Any]] = {}  # by index, those the engine translated: timings, kept output
        next_index = 0
        try:
            while next_index < len(specs):
                while next_index in ready:
                    spec = specs[next_index]
                    yield DecodedSentence(spec, ready.pop(next_index), id(spec) in last, *decoded.pop(next_index, ()))
                    next_index += 1
                if next_index == len(specs):
                    break
                item = await finished.get()
                if isinstance(item, ServiceError):
                    raise item
                index = order[id(item.spec)]
                result = item.result._replace(alternatives=item.result.alternatives[: decode.alternatives])
                self._keep(keys[index], result)
                ready[index] = result
                decoded[index] = ((item.enqueued_at, item.joined_at, item.encoded_at, item.finished_at), item.kept)
        except asyncio.CancelledError:
            if job is not None:
                self.scheduler.cancel(job)
            raise

    async def translate(
        self,
        engine: Engine | None,
        texts: Sequence[str],
        options: TranslateOptions,
        exchange: Exchange | None = None,
    ) -> list[TextTranslation]:
        """One translation per text, in order, with the text's layout: its sentences joined by the whitespace that
        separated them (line breaks and blank lines kept) between its own leading and trailing whitespace; an empty
        text kept with ``options.keep_empty`` translates to itself. A text with a sentence under
        ``options.min_confidence`` is flagged ``low_confidence``. Format "html" keeps the texts' markup; in both
        formats placeholders, URLs, e-mail addresses and numbers with units come back as sent (markup.py). With
        ``options.decode.alternatives``, up to that many other translations of each text (``answers.variants``),
        laid out and with their markup placed as the translation is. In format "text", ``options.pass_through``
        and ``options.mirror_formatting`` finish the texts as LibreTranslate does (formatting.py), glossary or not.
        No ``engine``: texts already in the target language (``Models.choose``) come back as sent, checked."""
        check_texts(texts, self.limits, options.field, options.keep_empty)  # bounds what the rest costs
        if engine is None:
            return answers.unchanged(texts, options.format)
        if options.glossary is not None:
            options.glossary.check_pair(engine.source_language, engine.target_language)
        if options.format == "text" and options.pass_through:
            kept = {t for t, text in enumerate(texts) if formatting.nothing_to_translate(text)}
            if kept:
                return await self._passing_through(engine, texts, kept, options, exchange)
        glossary = options.glossary

        def parse() -> tuple[list[markup.ParsedText], list[list[str]] | None]:
            documents = [markup.parse(text, options.format) for text in texts]
            return glossary.apply(documents) if glossary is not None else (documents, None)

        documents, applied = await self.work(sum(map(len, texts)), parse)
        if applied is not None:
            self.metrics.glossary_applied.labels(engine.name).observe(sum(map(len, applied)))
            translated = await self._translate_documents(engine, texts, documents, options, exchange)
            return [replace(t, glossary_applied=tuple(a)) for t, a in zip(translated, applied, strict=True)]
        return await self._translate_documents(engine, texts, documents, options, exchange)

    async def _translate_documents(
        self,
        engine: Engine,
        texts: Sequence[str],
        documents: list[markup.ParsedText],
        options: TranslateOptions,
        exchange: Exchange | None,
    ) -> list[TextTranslation]:
        """The texts' translations from their parsed documents (see translate)."""
        alternatives, min_confidence = options.decode.alternatives, options.min_confidence
        span = exchange.span if exchange else INVALID_SPAN
        chars = sum(map(len, texts))
        if options.format == "text" and all(d.pieces[0].plain for d in documents if d.pieces):  # nothing to put back
            started = time.monotonic()
            segments = [s async for s in self.segments(engine, texts, options)]
            self.observe(engine, segments, started, exchange)

            def finish() -> list[TextTranslation]:
                with child_span(span, "detokenize"):
                    variants = answers.variants(segments, alternatives)
                    renders = [answers.plain(engine, texts, variant) for variant in variants]
                    renders = formatting.mirrored(texts, renders) if options.mirror_formatting else renders
                return [
                    answers.summary([render[t] for render in renders], parts, min_confidence)
                    for t, parts in enumerate(answers.by_text(segments, len(texts)))
                ]

            return await self.work(chars, finish)
        pieces = [(t, piece) for t, document in enumerate(documents) for piece in document.pieces]
        runs = [piece.text for _, piece in pieces]
        tokenized = await self.work(chars, lambda: engine.tokenize(runs) if runs else [])
        started = time.monotonic()
        # The texts were counted, not their pieces; a piece may be empty (whitespace between tags). A short request's
        # marked pieces keep their encoder's output for the aligner; a document's are encoded again.
        limits, pieces_options = replace(self.limits, batch_limit=NO_LIMIT), replace(options, keep_empty=True)
        marked = {i for i, (_, piece) in enumerate(pieces) if not piece.plain} if kind_of(chars) == SHORT else ()
        segments = [s async for s in self.segments(engine, runs, pieces_options, limits, tokenized, marked)]
        self.observe(engine, segments, started, exchange)
        parts: dict[int, list[DecodedSentence]] = {}
        for segment in segments:
            parts.setdefault(pieces[segment.spec.text_index][0], []).append(segment)
        with child_span(span, "markup"):
            renders = [
                await self._render(engine, documents, pieces, variant, chars)
                for variant in answers.variants(segments, alternatives)
            ]
        if options.format == "text" and options.mirror_formatting:  # a glossary's terms made pieces of its texts
            renders = formatting.mirrored(texts, renders)
        return [
            answers.summary([render[t] for render in renders], parts.get(t, []), min_confidence)
            for t in range(len(documents))
        ]

    async def streamed(
        self, engine: Engine, texts: Sequence[str], options: TranslateOptions, exchange: Exchange | None = None
    ) -> AsyncIterator[SentenceAnswer]:
        """The texts' sentences as ``segments`` yields them, each answered; the request observed once all are."""
        started, decoded = time.monotonic(), []
        if options.glossary is not None:
            options.glossary.check_pair(engine.source_language, engine.target_language)
        async for segment in self.segments(engine, texts, options):
            decoded.append(segment)
            yield await self._answer(engine, segment, options.glossary)
        self.observe(engine, decoded, started, exchange)

    async def _answer(self, engine: Engine, segment: DecodedSentence, glossary: Glossary | None) -> SentenceAnswer:
        """A sentence's answer, the glossary's terms placed as Translate places them (on the sentence as read)."""
        if glossary is None:
            return answers.sentence_answer(engine, segment)
        sentence = markup.Piece(html=False, text=segment.spec.source, paths=[()] * len(segment.spec.source))
        (glossed,), (applied,) = glossary.apply([markup.ParsedText([sentence])])
        if not applied:
            return answers.sentence_answer(engine, segment)
        self.metrics.glossary_applied.labels(engine.name).observe(len(applied))
        alignments = iter(await asyncio.to_thread(engine.align, [(segment.spec.ids, segment.output)]))
        first = replace(segment, spec=replace(segment.spec, chunk=0))  # the sentence is the piece, whatever its chunk
        piece = glossed.parts[0]
        translation = placement.place(piece, aligned.sentences_for(engine, piece, [first], alignments))
        return replace(answers.sentence_answer(engine, segment, translation), glossary_applied=tuple(applied))

    async def _passing_through(
        self, engine: Engine, texts: Sequence[str], kept: set[int], options: TranslateOptions, exchange: Exchange | None
    ) -> list[TextTranslation]:
        """The texts' translations, those at ``kept`` (nothing to translate) as themselves, without the engine."""
        others = [text for t, text in enumerate(texts) if t not in kept]
        translated = iter(
            await self.translate(engine, others, replace(options, pass_through=False), exchange) if others else []
        )
        return [answers.as_sent(text) if t in kept else next(translated) for t, text in enumerate(texts)]

    async def _render(
        self,
        engine: Engine,
        documents: Sequence[markup.ParsedText],
        pieces: Sequence[tuple[int, markup.Piece]],
        segments: list[DecodedSentence],
        chars: int,
    ) -> list[str]:
        """Each document with its pieces' translations (``segments``, by piece) in place of their text; the work
        where ``chars`` (the request's) say (``work``)."""
        by_piece = answers.by_text(segments, len(pieces))
        placed = await self._place(engine, [piece for _, piece in pieces], by_piece, chars)

        def render() -> list[str]:
            by_text: dict[int, list[str]] = {}
            for (t, _), translation in zip(pieces, placed, strict=True):
                by_text.setdefault(t, []).append(translation)
            return [document.render(by_text.get(t, [])) for t, document in enumerate(documents)]

        return await self.work(chars, render)

    async def _place(
        self, engine: Engine, pieces: list[markup.Piece], by_piece: list[list[DecodedSentence]], chars: int
    ) -> list[str]:
        """Each piece's translation: its sentences joined as in plain text, or, for a piece with markup or
        atoms, put back around the words the aligner says they belong to."""
        marked = [i for i, piece in enumerate(pieces) if not piece.plain and by_piece[i]]
        pairs = [(s.spec.ids, s.output) for i in marked for s in by_piece[i]]
        kept = [s.kept for i in marked for s in by_piece[i]]
        try:
            alignments = iter(await asyncio.to_thread(engine.align, pairs, kept) if pairs else [])
        except ModelFolderError as e:
            raise InvalidRequest(f"model {engine.name} cannot keep markup or placeholders: {e}") from e

        def place() -> list[str]:
            placed = set(marked)  # their sentences are detokenized unit by unit, for placement
            flat = [s for i, sentences in enumerate(by_piece) if i not in placed for s in sentences]
            detokenized = answers.detokenized(engine, flat)
            return [
                placement.place(piece, aligned.sentences_for(engine, piece, sentences, alignments))
                if i in placed
                else answers.joined(piece.text, sentences, detokenized)
                for i, (piece, sentences) in enumerate(zip(pieces, by_piece, strict=True))
            ]

        return await self.work(chars, place)

    def observe(
        self, engine: Engine, segments: list[DecodedSentence], started: float, exchange: Exchange | None = None
    ) -> None:
        """Request latency per text; the request's sentences into its ``exchange`` (access log, trace)."""
        if exchange is not None:
            exchange.record(segments)
        self.metrics.observe_request(engine.name, segments, started)
