"""Server configuration: one frozen dataclass, with the engine's settings (``runtime.options.EngineSettings``)
and the scheduler's (``SchedulerSettings``) nested in it; every field is a flag and an environment variable
(``TRANSLATE_<FIELD>``, a deploy-time override of the default), by common/flags.py, whose names stay flat
(``--max-batch-size``, ``TRANSLATE_VARIANT``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from common import flags
from common.flags import setting
from runtime.options import EngineSettings
from runtime.stops import MAX_REPEATS

ROOT = Path(__file__).resolve().parent.parent
# The default models, each exported folder with the checkpoint it is exported from: English→German, German→English.
DEFAULT_MODELS = {
    ROOT / "exported" / "default": ROOT / "model" / "default",
    ROOT / "exported" / "default-de-en": ROOT / "model" / "default-de-en",
}
DEFAULT_MODEL_DIR = next(iter(DEFAULT_MODELS))
ENV_PREFIX = "TRANSLATE_"
MIB = 1 << 20
# continuous: what longer lanes keep of a saturated shorter lane's core (--long-lane-share). On a 2-core AMD EPYC,
# run-on inputs with beam 4 at 90% of static's capacity (benchmarks/scheduler_variants_runon.md): 0.5 raised
# continuous' throughput from 0.90x static's to 0.96x and cut long p99 from 10.2 to 8.9 s, doubling the single
# sentences' p99 (still 0.08x static's); 0.3 changed nothing measurable and 0.7 pushed that p99 past static's.
LONG_LANE_SHARE = 0.5
# --batch-gap-ms: an idle lane's wait for a batch ends this long after the last arrival (see _wait_for_batch).
# Off by default: on a 2-core AMD EPYC, 1 ms gave 1.19-1.24x requests/s at 4 clients greedy (p99 0.96-0.99x)
# but p99 1.11-1.12x at 4 clients beam 4, and 0.95-1.02x elsewhere (benchmarks/every_core_batch_gap.md).
BATCH_GAP_MS = 0.0
# --char-limit: LibreTranslate's default is none; this bounds what one request costs before any translation (its
# parsing, splitting and tokenizing are linear in it) while a long document (about 1,500 sentences) goes whole.
CHAR_LIMIT = 100_000
# --max-queue-wait-s: short requests (the first lane) wait at most about a second before they start, so that under
# any overload the single sentences answered come back within 2 s, and the rest are refused at once instead of
# waiting; longer lanes hold documents, whose own sentences wait their turn for seconds (a 1,500-sentence document
# took 5 s alone on a 2-core AMD EPYC), and 16-sentence requests under 32 closed-loop clients at beam 4 (p99 2.6 s,
# benchmarks/every_core.md), which no bound should refuse.
MAX_QUEUE_WAIT_S = (1.0, 30.0)
# The front door (server/doors/door.py). --door-requests: a short request holds at least one sentence in the scheduler's
# queue or batch, so twice --max-queue-size's default bounds what short requests can wait for. --door-long-chars:
# one document at --char-limit with shorter long ones beside it. Memory does not bind it: a 99,465-character HTML
# document parsed and split holds 2.6 MiB (tracemalloc, 28 bytes a character), its decoding is the memory budget's;
# time does: documents held together finish one after another, and each must within --http-timeout-s.
# --max-loop-lag-ms: /health must answer within 100 ms while the loop sheds load (32 closed-loop HTTP clients ran
# the loop up to 58 ms late on a 2-core AMD EPYC: server/doors/door.py's SHED_FLOOR keeps such a loop from shedding).
MAX_LOOP_LAG_MS = 40.0
DOOR_REQUESTS = 2048
DOOR_LONG_CHARS = 150_000


# The server's defaults for decoding, chosen on 2 cores (AMD EPYC with VNNI; benchmarks/defaults_quality.md and
# defaults_throughput.md): int8 with beam 4 scores 41.18 / 40.31 BLEU on test_2016_flickr (en→de / de→en) against
# fp32 greedy's 40.14 / 38.63, and serves 1.32x its requests/s under 4 clients with a lower p99 (0.83x under 32).
DEFAULT_BEAM = 4


def serving_engine() -> EngineSettings:
    """The engine as the server runs it unless told otherwise: the variant its provider runs best (int8 on the
    CPU, fp16 on CUDA, where the folder has it; else fp32)."""
    return EngineSettings(variant="auto")


Scheduling = Literal["continuous", "static"]
LongInput = Literal["split", "truncate", "reject"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
EventLoop = Literal["auto", "uvloop", "asyncio"]
LanguageDetection = Literal["accurate", "light", "off"]  # server/documents/detect.py measures each


@dataclass(frozen=True)
class SchedulerSettings:
    """How the scheduler queues and batches sentences, and splits its work into lanes
    (server/scheduling/scheduler.py)."""

    scheduler: Scheduling = setting("continuous", "continuous (sources join and leave a running batch) or static")
    lanes: tuple[int, ...] = setting(
        (64,), "continuous: source-token bounds splitting the running batch into lanes, e.g. 32,128 ('': one lane)"
    )
    lane_niceness: int = setting(10, "continuous: OS niceness added per lane above the first, to its threads (0..19)")
    long_lane_share: float = setting(
        LONG_LANE_SHARE,
        "continuous: the share of a busy shorter lane's core that longer lanes keep while they decode (it pauses; "
        "their lower OS priority alone would starve them); 0: none",
    )
    max_batch_size: int = setting(64, "sentences decoding at once (continuous: per lane)")
    max_batch_tokens: int = setting(4096, "padded source tokens per encoder batch")
    max_batch_delay_ms: float = setting(5.0, "how long an idle server waits for more arrivals")
    batch_gap_ms: float = setting(
        BATCH_GAP_MS,
        "within max_batch_delay_ms, an idle lane stops waiting once no sentence arrived for this long (arrivals "
        "that have stopped gather nothing more); 0: it waits the whole delay",
    )
    max_queue_size: int = setting(1024, "sentences waiting per lane size; more are RESOURCE_EXHAUSTED")
    max_queue_wait_s: tuple[float, ...] = setting(
        MAX_QUEUE_WAIT_S,
        "per lane size, shortest first (the last for the rest): a request is RESOURCE_EXHAUSTED at once while the "
        "oldest sentence waiting in its lane size has waited longer than this (the queue is not keeping up); 0: no "
        "bound",
    )
    lane_replicas: int = setting(
        0,
        "continuous: running batches per lane size, each on an inference thread of its own, sharing the model's "
        "sessions; a request's sentences spread over them, and one that runs out of work takes the others' queued "
        "sentences (0: one per core on the CPU, one on CUDA)",
    )

    def __post_init__(self) -> None:
        problems = flags.choice_problems(self)
        for name in ("max_batch_size", "max_batch_tokens", "max_queue_size"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be at least 1")
        if not self.max_queue_wait_s or any(seconds < 0 for seconds in self.max_queue_wait_s):
            problems.append("max_queue_wait_s: give one bound of 0 s or more per lane size")
        if self.batch_gap_ms < 0 or self.max_batch_delay_ms < 0:
            problems.append("max_batch_delay_ms and batch_gap_ms must be 0 or more")
        if self.lane_replicas < 0:
            problems.append(f"lane_replicas={self.lane_replicas} must be 0 (one per core) or more")
        if not 0.0 <= self.long_lane_share < 1.0:
            problems.append(f"long_lane_share={self.long_lane_share} must be within 0..1 (1 excluded)")
        if not 0 <= self.lane_niceness <= 19:
            problems.append(f"lane_niceness={self.lane_niceness} must be within 0..19")
        if list(self.lanes) != sorted(set(self.lanes)) or any(bound < 1 for bound in self.lanes):
            problems.append(f"lanes={','.join(map(str, self.lanes))}: bounds must be positive and increasing")
        if problems:
            raise ValueError("invalid scheduler settings: " + "; ".join(problems))


@dataclass(frozen=True)
class ServerConfig:
    model: tuple[Path, ...] = setting(
        tuple(DEFAULT_MODELS),
        "exported model folders (python -m export), the flag repeated or TRANSLATE_MODEL=DIR,DIR; the first answers "
        "requests that name no model",
    )
    engine: EngineSettings = setting(help="the engine's settings (its fields are flags)", factory=serving_engine)
    host: str = setting(
        "[::]",
        "where the gRPC, HTTP and metrics ports listen: [::] every address of both families (IPv4 and IPv6), an "
        "address of either family (0.0.0.0: every IPv4 address), or a host name (each address it resolves to)",
    )
    port: int = setting(50051, "the gRPC port")
    metrics_port: int = setting(9464, "the Prometheus metrics port (plain HTTP)")
    http_port: int = setting(
        5000, "the LibreTranslate-compatible HTTP API's port (server/doors/http.py); 0 turns it off"
    )
    http_timeout_s: float = setting(60.0, "an HTTP request's deadline, as gRPC's (504 after it): HTTP sends none")
    intra_op_spinning: bool = setting(
        False, "let ONNX Runtime's threads spin between a run's tasks (they steal cores from the other lanes' runs)"
    )
    event_loop: EventLoop = setting(
        "auto",
        "the event loop serving gRPC and HTTP: uvloop (a dependency on Linux and macOS; under 32 clients it spent "
        "0.96-0.97x the CPU per sentence of asyncio's own at 1.04-1.09x the requests/s), asyncio, or auto: "
        "uvloop where it is installed",
    )
    scheduling: SchedulerSettings = setting(
        help="the scheduler's settings (its fields are flags)", factory=SchedulerSettings
    )
    max_concurrent_rpcs: int = setting(512, "RPCs in flight")
    door_requests: int = setting(
        DOOR_REQUESTS,
        "requests both front ends hold at once, from their headers to their answer (server/doors/door.py); more are "
        "refused at once (429 with Retry-After, RESOURCE_EXHAUSTED) before their body is read",
    )
    max_loop_lag_ms: float = setting(
        MAX_LOOP_LAG_MS,
        "the event loop's smoothed lag over which a share of new requests is refused at once (none at it, all at "
        "twice it), so that a loop that cannot keep up drains instead of stalling; 0: never",
    )
    door_long_chars: int = setting(
        DOOR_LONG_CHARS,
        "characters of long requests (documents: over 2,000 characters) held at once, parsed, queued or decoding; "
        "more are refused at once, before their body is read (a long request alone always enters)",
    )
    memory_budget_mib: int = setting(512, "the admission budget: caches and attention scores of admitted sentences")
    batch_limit: int = setting(-1, "texts per request, as LibreTranslate's --batch-limit; -1: no limit")
    char_limit: int = setting(
        CHAR_LIMIT, "characters per request, all its texts together, as LibreTranslate's --char-limit; -1: no limit"
    )
    max_source_tokens: int = setting(
        1024, "source tokens per sentence: a longer one is cut at a clause or word boundary, never refused"
    )
    long_input_tokens: int = setting(128, "texts over this many tokens follow --long-input")
    long_input: LongInput = setting("split", "what happens to long texts")
    max_beam_size: int = setting(8, "the largest beam a request may ask for")
    default_beam_size: int = setting(
        DEFAULT_BEAM, "the beam of requests that ask for none, HTTP's and gRPC's (1: greedy; see DEFAULT_BEAM)"
    )
    max_output_tokens: int = setting(256, "the longest output per sentence a request may ask for (eos included)")
    max_repeats: int = setting(
        MAX_REPEATS,
        "the runaway-output guard (runtime/stops.py, RepetitionGuard): repetitions of an n-gram allowed in a row; "
        "0: off",
    )
    max_message_bytes: int = setting(4 * MIB, "the largest request message")
    access_log: bool = setting(
        True, "one JSON line per request on the server.operations.access logger (server/operations/access.py)"
    )
    access_log_texts: bool = setting(False, "the request's texts in its access-log line (off: no content in logs)")
    access_log_sample: float = setting(1.0, "the share of successful requests logged, 0..1 (errors always are)")
    log_level: LogLevel = setting("INFO", "the log level")
    cache_mib: int = setting(64, "the translation cache's bound in MiB (server/cache.py); 0 turns it off")
    grace_seconds: float = setting(
        20.0,
        "on SIGTERM, how long both listeners stay open refusing new work (UNAVAILABLE, 503 with Retry-After) while "
        "in-flight requests finish; then they close",
    )
    max_connection_age_s: float = setting(
        300.0, "connections close after this, so clients balancing per connection find new replicas"
    )
    keepalive_time_s: float = setting(
        30.0, "the server pings each client this often, to find clients gone silent (their calls are cancelled)"
    )
    keepalive_timeout_s: float = setting(10.0, "a ping unanswered this long closes the client's connection")
    min_client_ping_interval_s: float = setting(
        1.0,
        "the shortest interval between a client's pings the server allows (faster: GOAWAY too_many_pings); "
        "client/channel.py pings every 2 s",
    )
    api_keys: Path | None = setting(
        None,
        "the API keys file (server/operations/keys.py: sha256 digests and per-key limits, reread when it changes); "
        "none: every caller is anonymous and unlimited",
    )
    redis_url: str = setting(
        "", "Redis for the per-key request counts that replicas share, e.g. redis://redis:6379/0 (none: per process)"
    )
    limits_when_store_down: Literal["local", "refuse"] = setting(
        "local",
        "while --redis-url is out of reach: each replica counts the limits itself (local), or requests with a "
        "requests-per-minute limit are refused with 503 / UNAVAILABLE (refuse)",
    )
    files_dir: Path | None = setting(
        None, "where /translate_file keeps translated files until downloaded (none: a private temporary folder)"
    )
    file_ttl_s: float = setting(600.0, "a translated file not downloaded by then is deleted")
    max_file_texts: int = setting(1024, "/translate_file: the most texts (lines, paragraphs, subtitles) in a file")
    cors_origins: tuple[str, ...] = setting(
        ("*",),
        "the web origins whose pages may call the HTTP API from a browser (CORS), e.g. https://a.example,"
        "https://b.example; * any page (as LibreTranslate; with API keys, the key then travels from the browser); "
        "'': none",
    )
    suggestions: bool = setting(False, "accept POST /suggest (LibreTranslate's suggested translations; off: 403)")
    suggestions_file: Path | None = setting(
        None,
        "the JSON-lines file /suggest appends to where there is no Redis URL (none: suggestions.jsonl in the "
        "files folder where one is set, else in the working directory)",
    )
    language_detection: LanguageDetection = setting(
        "accurate",
        "source auto and /detect (server/documents/detect.py): accurate (+184 MiB resident for en and de; 86-99% right "
        "on 1-3 words), light (+77 MiB; 64-98% on 1-3 words), or off (auto refused; lingua not loaded)",
    )
    warmup: bool = setting(True, "decode a few inputs before reporting SERVING, so first requests are not slow")
    tls_cert: Path | None = setting(None, "TLS certificate (PEM) for gRPC and HTTPS; reloaded when the file changes")
    tls_key: Path | None = setting(None, "its private key (PEM)")
    tls_client_ca: Path | None = setting(None, "a CA (PEM) client certificates must chain to: mutual TLS")

    def __post_init__(self) -> None:
        if isinstance(self.model, (str, Path)):
            object.__setattr__(self, "model", (Path(self.model),))
        problems = flags.choice_problems(self)  # the engine settings check their own
        if not self.model:
            problems.append("model: give at least one exported model folder")
        elif len(set(self.model)) < len(self.model):
            problems.append(f"model: a folder is given twice ({', '.join(map(str, self.model))})")
        for name in (
            "max_concurrent_rpcs",
            "door_requests",
            "door_long_chars",
            "memory_budget_mib",
            "max_source_tokens",
            "long_input_tokens",
            "max_beam_size",
            "max_output_tokens",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be at least 1")
        for name in ("batch_limit", "char_limit"):
            if getattr(self, name) == 0 or getattr(self, name) < -1:
                problems.append(f"{name}={getattr(self, name)} must be -1 (no limit) or at least 1")
        if not 0 <= self.http_port <= 65535:
            problems.append(f"http_port={self.http_port} must be a port number, or 0 to disable the HTTP API")
        for name in ("keepalive_time_s", "keepalive_timeout_s", "min_client_ping_interval_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}={getattr(self, name)} must be positive")
        if self.max_loop_lag_ms < 0:
            problems.append(f"max_loop_lag_ms={self.max_loop_lag_ms} must be 0 (never shed) or more")
        if self.http_timeout_s <= 0:
            problems.append(f"http_timeout_s={self.http_timeout_s} must be positive")
        if not 0.0 <= self.access_log_sample <= 1.0:
            problems.append(f"access_log_sample={self.access_log_sample} must be within 0..1")
        if self.max_repeats < 0:
            problems.append(f"max_repeats={self.max_repeats} must be 0 (no guard) or more")
        if self.cache_mib < 0:
            problems.append(f"cache_mib={self.cache_mib} must be 0 (no cache) or more")
        if not 1 <= self.default_beam_size <= self.max_beam_size:
            problems.append(f"default_beam_size={self.default_beam_size} must be within 1..max_beam_size")
        if (self.tls_cert is None) != (self.tls_key is None):
            problems.append("tls_cert and tls_key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            problems.append("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
        if problems:
            raise ValueError("invalid server configuration: " + "; ".join(problems))

    @property
    def cache_bytes(self) -> int:
        return self.cache_mib * MIB

    @property
    def memory_budget_bytes(self) -> int:
        return self.memory_budget_mib * MIB


def parse_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Flags first, then TRANSLATE_* environment variables (os.environ unless given), then the defaults."""
    return flags.parse(
        ServerConfig,
        argv,
        env_prefix=ENV_PREFIX,
        environ=environ,
        prog="python -m server",
        description="The translation server: gRPC, and the LibreTranslate HTTP API.",
    )
