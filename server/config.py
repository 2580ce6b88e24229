"""Server configuration: one frozen dataclass; every field is a flag and an
environment variable (``TRANSLATE_<FIELD>``, a deploy-time override of the default)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from model.search import MAX_REPEATS

ROOT = Path(__file__).resolve().parent.parent
# The default models, each exported folder with the checkpoint it is exported from: English→German, German→English.
DEFAULT_MODELS = {
    ROOT / "exported" / "default": ROOT / "model" / "default",
    ROOT / "exported" / "default-de-en": ROOT / "model" / "default-de-en",
}
DEFAULT_MODEL_DIR = next(iter(DEFAULT_MODELS))
ENV_PREFIX = "TRANSLATE_"
MIB = 1 << 20


@dataclass(frozen=True)
class ServerConfig:
    # Exported model folders (--model DIR, repeated; TRANSLATE_MODEL=DIR,DIR); the first is the default model of
    # requests that name none. One Path is taken as a one-model tuple.
    model: tuple[Path, ...] = tuple(DEFAULT_MODELS)
    variant: str = "fp32"
    provider: str = "auto"
    host: str = "[::]"
    port: int = 50051
    metrics_port: int = 9464
    http_port: int = 5000  # the LibreTranslate-compatible HTTP API (server/http.py); 0 disables it
    http_timeout_s: float = 60.0  # HTTP has no deadline header: a request's deadline, as gRPC's (504 after it)
    intra_op_threads: int = 0
    short_lane_threads: int = 1  # continuous, CPU: the first lane's threads for small batches (0 = intra_op_threads)
    intra_op_spinning: bool = False  # spinning ORT threads steal the cores the event loop needs (README)
    scheduler: str = "continuous"  # wins the scheduler benchmark (README); static: request-level batches
    lanes: str = "64"  # continuous: source-token bounds splitting the running batch into lanes ("" = one lane)
    lane_niceness: int = 10  # continuous: OS niceness added per lane above the first, to its threads (Linux)
    max_batch_size: int = 64
    max_batch_tokens: int = 4096
    max_batch_delay_ms: float = 5.0
    max_queue_size: int = 1024
    max_concurrent_rpcs: int = 512
    memory_budget_mib: int = 512
    max_texts: int = 64
    max_source_tokens: int = 1024
    long_input_tokens: int = 128
    long_input: str = "split"
    max_beam_size: int = 8
    default_beam_size: int = 1
    max_output_tokens: int = 256
    max_repeats: int = MAX_REPEATS  # the runaway-output guard (model/search.py): an n-gram's repetitions; 0 = off
    max_message_bytes: int = 4 * MIB
    access_log: bool = True  # one JSON line per request on the server.access logger (server/access.py)
    access_log_texts: bool = False  # the request's texts in its access-log line (off: no content in logs)
    access_log_sample: float = 1.0  # the share of successful requests logged (errors always are)
    log_level: str = "INFO"  # DEBUG, INFO, WARNING or ERROR
    cache_mib: int = 64  # the translation cache (server/cache.py): its bound in MiB; 0 turns it off
    grace_seconds: float = 20.0
    max_connection_age_s: float = 300.0
    warmup: bool = True
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None

    @property
    def first_lane_small_batch_threads(self) -> int | None:
        """Threads for the first lane's small batches: short_lane_threads when the continuous scheduler splits
        work into lanes (a lone long lane's few rows are long sequences, which want every thread)."""
        return self.short_lane_threads if self.scheduler == "continuous" and self.lane_bounds else None

    def __post_init__(self) -> None:
        if isinstance(self.model, (str, Path)):
            object.__setattr__(self, "model", (Path(self.model),))
        problems = []
        if not self.model:
            problems.append("model: give at least one exported model folder")
        elif len(set(self.model)) < len(self.model):
            problems.append(f"model: a folder is given twice ({', '.join(map(str, self.model))})")
        if self.scheduler not in ("continuous", "static"):
            problems.append(f"scheduler={self.scheduler!r}: use continuous or static")
        if self.long_input not in ("split", "truncate", "reject"):
            problems.append(f"long_input={self.long_input!r}: use split, truncate or reject")
        if self.variant not in ("fp32", "int8", "fp16"):
            problems.append(f"variant={self.variant!r}: use fp32, int8 or fp16")
        for name in ("max_batch_size", "max_batch_tokens", "max_queue_size", "max_concurrent_rpcs", "memory_budget_mib", "max_texts",
                     "max_source_tokens", "long_input_tokens", "max_beam_size", "max_output_tokens"):  # fmt: skip
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be at least 1")
        if not 0 <= self.http_port <= 65535:
            problems.append(f"http_port={self.http_port} must be a port number, or 0 to disable the HTTP API")
        if self.http_timeout_s <= 0:
            problems.append(f"http_timeout_s={self.http_timeout_s} must be positive")
        if not 0.0 <= self.access_log_sample <= 1.0:
            problems.append(f"access_log_sample={self.access_log_sample} must be within 0..1")
        if self.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            problems.append(f"log_level={self.log_level!r}: use DEBUG, INFO, WARNING or ERROR")
        if self.max_repeats < 0:
            problems.append(f"max_repeats={self.max_repeats} must be 0 (no guard) or more")
        if self.cache_mib < 0:
            problems.append(f"cache_mib={self.cache_mib} must be 0 (no cache) or more")
        if self.short_lane_threads < 0:
            problems.append(f"short_lane_threads={self.short_lane_threads} must be 0 (as intra_op_threads) or more")
        if not 0 <= self.lane_niceness <= 19:
            problems.append(f"lane_niceness={self.lane_niceness} must be within 0..19")
        if not 1 <= self.default_beam_size <= self.max_beam_size:
            problems.append(f"default_beam_size={self.default_beam_size} must be within 1..max_beam_size")
        try:
            bounds = self.lane_bounds
            if list(bounds) != sorted(set(bounds)) or any(b < 1 for b in bounds):
                problems.append(f"lanes={self.lanes!r}: bounds must be positive and increasing")
        except ValueError:
            problems.append(f"lanes={self.lanes!r}: use comma-separated source-token bounds, e.g. 32,128")
        if (self.tls_cert is None) != (self.tls_key is None):
            problems.append("tls_cert and tls_key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            problems.append("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
        if problems:
            raise ValueError("invalid server configuration: " + "; ".join(problems))

    @property
    def lane_bounds(self) -> tuple[int, ...]:
        return tuple(int(bound) for bound in self.lanes.split(",") if bound.strip())

    @property
    def cache_bytes(self) -> int:
        return self.cache_mib * MIB

    @property
    def memory_budget_bytes(self) -> int:
        return self.memory_budget_mib * MIB


def _field_type(field: dataclasses.Field) -> type:
    text = str(field.type)
    if text.startswith("tuple[Path"):
        return tuple
    if "Path" in text:
        return Path
    return {"int": int, "float": float, "str": str, "bool": bool}[text]


def _parse_bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not a boolean (true/false)")


def parse_config(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> ServerConfig:
    """Flags first, then TRANSLATE_* environment variables, then the defaults."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="python -m server", description="The translation server: gRPC, and the LibreTranslate HTTP API."
    )
    lists: dict[str, tuple] = {}
    for field in dataclasses.fields(ServerConfig):
        kind = _field_type(field)
        flag = "--" + field.name.replace("_", "-")
        env = ENV_PREFIX + field.name.upper()
        default = field.default
        if kind is tuple:  # a list: the flag repeated, or the variable's comma-separated items
            if env in environ:
                default = tuple(Path(item.strip()) for item in environ[env].split(",") if item.strip())
            shown = ",".join(map(str, default))
            parser.add_argument(flag, type=Path, action="append", help=f"repeatable (env {env}, default {shown})")
            lists[field.name] = default
            continue
        if env in environ:
            default = _parse_bool(environ[env]) if kind is bool else kind(environ[env])
        parser.add_argument(
            flag, type=_parse_bool if kind is bool else kind, default=default, help=f"(env {env}, default {default})"
        )
    args = vars(parser.parse_args(argv))
    for name, default in lists.items():  # append extends its default, so a given flag replaces it here
        args[name] = tuple(args[name]) if args[name] else default
    try:
        return ServerConfig(**args)
    except ValueError as e:
        parser.error(str(e))
        raise
