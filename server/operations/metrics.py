"""Prometheus metrics, declared once. Labels are bounded: status codes, methods, the served models' names
(fixed at start; "" where a request named no model the server has), lanes, and the fixed input-length
buckets below."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.process_collector import ProcessCollector

from server.operations.thread_cpu import ThreadCpuCollector

if TYPE_CHECKING:
    from runtime.search import Hypothesis
    from server.answers import DecodedSentence

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Mean token log-probabilities: most good translations score above -0.5, loops and garbage below -1.5.
CONFIDENCE_BUCKETS = (-3.0, -2.0, -1.5, -1.0, -0.75, -0.5, -0.4, -0.3, -0.2, -0.1, -0.05, 0.0)
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
GLOSSARY_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)
# Source tokens: the upper bounds of the length classes the scheduler's policies group sentences by
# (server/scheduling/policies.py) and the latency histograms are labeled by.
LENGTH_CLASSES = (16, 32, 64, 128, 256, 512, 1024)


def length_label(tokens: int) -> str:
    """The value of the input-length label (named length_bucket; source tokens): the scheduler's length classes
    (a fixed, small set), '1-16', '17-32', ..., '513-1024', '1025+'."""
    low = 1
    for high in LENGTH_CLASSES:
        if tokens <= high:
            return f"{low}-{high}"
        low = high + 1
    return f"{low}+"


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        r.register(ThreadCpuCollector())  # translate_thread_cpu_seconds_total{kind}: cores busy by thread kind
        self.requests = Counter(
            "translate_requests_total",
            "Finished requests by method (gRPC method, or 'HTTP /path'), gRPC status code (HTTP mirrors them) and "
            "model ('' when the request named none the server has).",
            ["method", "code", "model"],
            registry=r,
        )
        self.request_latency = Histogram(
            "translate_request_duration_seconds",
            "Time from arrival to answer of each text, by model and input length (source tokens).",
            ["model", "length_bucket"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "translate_queue_wait_seconds",
            "Time a sentence waits before it starts decoding.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.encoder_latency = Histogram(
            "translate_encoder_duration_seconds",
            "Encoder time per batch, by its longest input.",
            ["length_bucket"],
            buckets=STEP_BUCKETS + (1.0, 2.5),
            registry=r,
        )
        self.decoder_step = Histogram(
            "translate_decoder_step_duration_seconds",
            "Time of one decoder step over a running batch, by model.",
            ["model"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.batch_sentences = Histogram(
            "translate_batch_size_sentences",
            "Sentences encoded together in one batch.",
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "translate_batch_size_tokens",
            "Padded source tokens in one encoder batch.",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.decode_rows = Histogram(
            "translate_decode_batch_rows",
            "Rows (hypotheses) in the running batch at each decoder step.",
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.padding_ratio = Histogram(
            "translate_batch_padding_ratio", "Share of padding in an encoder batch.", buckets=RATIO_BUCKETS, registry=r
        )
        self.input_tokens = Counter(
            "translate_input_tokens_total", "Source tokens translated, by model.", ["model"], registry=r
        )
        self.output_tokens = Counter(
            "translate_output_tokens_total", "Target tokens generated, by model.", ["model"], registry=r
        )
        self.long_inputs = Counter(
            "translate_long_inputs_total",
            "Texts over long_input_tokens, by the policy applied.",
            ["policy"],
            registry=r,
        )
        self.rejected = Counter(
            "translate_rejected_total", "Requests refused at admission, by reason.", ["reason"], registry=r
        )
        self.queue_depth = Gauge("translate_queue_depth", "Sentences waiting to start decoding.", registry=r)
        self.limits_store_up = Gauge(
            "translate_limits_store_up",
            "1 while the rate limits count in the shared store (--redis-url), 0 while it is out of reach (each "
            "replica counts its own, or refuses); no sample without a store.",
            ["store"],
            registry=r,
        )
        self.door_requests = Gauge(
            "translate_door_requests",
            "Requests the front door holds (accepted, not yet answered), by kind: short or long "
            "(server/doors/door.py).",
            ["kind"],
            registry=r,
        )
        self.event_loop_lag = Gauge(
            "translate_event_loop_lag_seconds",
            "How late the front ends' event loop runs a timer, smoothed: over --max-loop-lag-ms, requests are shed.",
            registry=r,
        )
        self.door_chars = Gauge(
            "translate_door_chars", "Characters of the requests the front door holds, by kind.", ["kind"], registry=r
        )
        self.inflight = Gauge("translate_inflight_sequences", "Sentences being decoded.", registry=r)
        self.lane_rows = Gauge(
            "translate_lane_rows",
            "Decoder rows (hypotheses) in each model's lanes; lanes split a model's running work by source length.",
            ["model", "lane"],
            registry=r,
        )
        self.lane_paused = Counter(
            "translate_lane_paused_seconds_total",
            "Time a shorter lane paused so that longer lanes keep their share of its core while they decode, by "
            "model, lane.",
            ["model", "lane"],
            registry=r,
        )
        self.kv_cache_bytes = Gauge(
            "translate_kv_cache_bytes", "Bytes of the live self-attention KV cache.", registry=r
        )
        self.cross_cache_bytes = Gauge(
            "translate_cross_attention_cache_bytes", "Bytes of the live cross-attention keys/values.", registry=r
        )
        self.reserved_bytes = Gauge(
            "translate_memory_reserved_bytes", "Bytes reserved by admitted sentences (estimate).", registry=r
        )
        self.budget_bytes = Gauge(
            "translate_memory_budget_bytes", "The memory budget for caches and attention scores.", registry=r
        )
        self.largest_scores_bytes = 0
        self.attention_scores_bytes = Gauge(
            "translate_attention_scores_bytes",
            "Attention-score bytes of the largest encoder batch so far (B·H·S² floats).",
            registry=r,
        )
        self.confidence = Histogram(
            "translate_confidence",
            "Each sentence's confidence: the mean log-probability of its chosen tokens (0 is certain), by model.",
            ["model"],
            buckets=CONFIDENCE_BUCKETS,
            registry=r,
        )
        self.output_guard = Counter(
            "translate_output_guard_total",
            "Sentences whose decoding was stopped by a guard, by model and reason (repetition: an n-gram repeated "
            "too often; length: the longest output allowed).",
            ["model", "reason"],
            registry=r,
        )
        self.cache_lookups = Counter(
            "translate_cache_lookups_total",
            "Sentences looked up in the translation cache, by model and result (hit: answered without the engine).",
            ["model", "result"],
            registry=r,
        )
        self.cache_bytes = Gauge(
            "translate_cache_bytes", "Bytes held by the translation cache (keys, outputs, overhead).", registry=r
        )
        self.cache_entries = Gauge("translate_cache_entries", "Sentences held by the translation cache.", registry=r)
        self.model_info = Info("translate_model", "Each served model.", ["model"], registry=r)
        self.glossary_applied = Histogram(
            "translate_glossary_entries_applied",
            "Glossary terms written into a request's translations (one per occurrence), per request with a glossary.",
            ["model"],
            buckets=GLOSSARY_BUCKETS,
            registry=r,
        )

    def observe_encoder_batch(
        self, sentences: int, longest: int, seconds: float, padded: int, real: int, scores_bytes: int
    ) -> None:
        """An encoder call (a group of arrivals joining a running batch), and its attention scores' bytes
        (the gauge keeps the largest)."""
        self.encoder_latency.labels(length_label(longest)).observe(seconds)
        self.batch_sentences.observe(sentences)
        self.batch_tokens.observe(padded)
        self.padding_ratio.observe(1 - real / padded)
        if scores_bytes > self.largest_scores_bytes:
            self.largest_scores_bytes = scores_bytes
            self.attention_scores_bytes.set(scores_bytes)

    def set_gauges(self, lane, lanes, waiting: int, running: int, reserved: int, caches: bool) -> None:
        """The queue and batch gauges after a step of ``lane`` (server.scheduling.lanes.Lane); with ``caches``, also the
        cache sizes of every lane's batch (a walk over every buffer)."""
        self.queue_depth.set(waiting)
        self.inflight.set(running)
        self.lane_rows.labels(lane.model, lane.name).set(lane.batch.rows if lane.batch is not None else 0)
        self.reserved_bytes.set(reserved)
        if caches:
            batches = [other.batch for other in lanes if other.batch is not None]
            self.kv_cache_bytes.set(sum(batch.cache_bytes for batch in batches))
            self.cross_cache_bytes.set(sum(batch.cross_bytes for batch in batches))

    def observe_request(self, model: str, sentences: Sequence[DecodedSentence], started: float) -> None:
        """A request's latency since ``started`` (time.monotonic()), once per text, by the text's length class."""
        per_text: dict[int, int] = {}
        for s in sentences:
            per_text[s.spec.text_index] = per_text.get(s.spec.text_index, 0) + s.source_tokens
        elapsed = time.monotonic() - started
        for tokens in per_text.values():
            self.request_latency.labels(model, length_label(tokens)).observe(elapsed)

    def observe_sentence(self, model: str, source_tokens: int, hypothesis: Hypothesis) -> None:
        """A sentence finished decoding."""
        self.confidence.labels(model).observe(hypothesis.score)
        if hypothesis.stopped != "eos":
            self.output_guard.labels(model, hypothesis.stopped).inc()
        self.input_tokens.labels(model).inc(source_tokens)
        self.output_tokens.labels(model).inc(len(hypothesis.tokens))
