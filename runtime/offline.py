"""Offline decoding: a list of sources or texts translated to completion, in batches that fill once and drain
(``DecodeBatch.drain``), as translate-file, the export's checks and the benchmarks run it."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence

from runtime.backend import OrtBackend
from runtime.search import Hypothesis, default_max_output
from runtime.stops import StopRules

# Sources encoded together by ``hypotheses``, sorted by length: a batch of 32 test_2016_flickr sentences pads
# less in two groups (the encoder's work is its padded tokens): beam 4 +3-8%, greedy even.
ENCODER_GROUP = 16


def hypotheses(
    backend: OrtBackend,
    sources: Sequence[Sequence[int]],
    beam: int = 1,
    max_output_tokens: int = 256,
    stop_rules: StopRules = (),
) -> list[Hypothesis]:
    """Decode sources together to completion (``stop_rules``: runtime/stops.py). They are
    encoded in groups of ENCODER_GROUP by length (padding is encoder work) and all decode in one batch."""
    batch = backend.new_batch(backend.decoding(stop_rules))
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    for start in range(0, len(order), ENCODER_GROUP):
        group = order[start : start + ENCODER_GROUP]
        group_sources = [sources[i] for i in group]
        limits = [default_max_output(len(source), max_output_tokens) for source in group_sources]
        batch.add(group, backend.encode_sources(group_sources), [beam] * len(group), limits)
    results = batch.drain()
    return [results[i] for i in range(len(sources))]


def translate_ids(
    backend: OrtBackend,
    sources: Sequence[Sequence[int]],
    beam: int = 1,
    max_output_tokens: int = 256,
    stop_rules: StopRules = (),
) -> list[list[int]]:
    """Decode sources together to completion: token ids without start and eos."""
    return [hypothesis.tokens for hypothesis in hypotheses(backend, sources, beam, max_output_tokens, stop_rules)]


def translate(
    backend: OrtBackend,
    texts: Sequence[str],
    beam: int = 1,
    batch_size: int = 64,
    max_output_tokens: int = 256,
    stop_rules: StopRules = (),
) -> list[str]:
    """Texts translated in batches of ``batch_size`` by length."""
    translate_batch = lambda ids: translate_ids(backend, ids, beam, max_output_tokens, stop_rules)  # noqa: E731
    return translate_in_batches(backend.tokenizer, texts, translate_batch, batch_size)


def translate_in_batches(
    tokenizer,
    texts: Sequence[str],
    translate_ids: Callable[[list[list[int]]], list[list[int]]],
    batch_size: int,
    workers: int = 1,
    by_length: bool = True,
) -> list[str]:
    """Tokenize, translate length-sorted batches (little padding), detokenize in the input order.
    ``workers`` > 1: that many batches at once, on threads (``translate_ids`` must allow it; ONNX Runtime
    releases the GIL while it runs). ``by_length=False``: batches of the texts in their own order (as a
    server sees its arrivals; benchmarks/service_overhead.py)."""
    ids = tokenizer.encode_source(texts)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i])) if by_length else list(range(len(ids)))
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    translate = lambda batch: translate_ids([ids[i] for i in batch])  # noqa: E731
    if workers > 1:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(translate, batches))
    else:
        results = list(map(translate, batches))
    outputs: list[list[int]] = [[] for _ in ids]
    for batch, translated in zip(batches, results, strict=True):
        for i, out in zip(batch, translated, strict=True):
            outputs[i] = out
    return tokenizer.decode(outputs)
