"""Assembling and running the server: gRPC (translation, health, reflection),
the LibreTranslate HTTP API, the metrics HTTP port, warm-up, and graceful shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from dataclasses import dataclass

import grpc
from aiohttp import web
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from proto import translate_pb2
from runtime.engine import Engine
from runtime.options import RuntimeOptions
from runtime.stops import stop_rules
from server.config import ServerConfig
from server.doors.http import HttpApi
from server.doors.listen import BACKLOG, MetricsEndpoint, bound, grpc_address, hostport, listen, local_address
from server.doors.service import MALFORMED, TranslatorService
from server.models import Models
from server.operations.access import AccessLog
from server.operations.keys import RELOAD_CHECK_SECONDS as KEYS_RELOAD_SECONDS
from server.operations.keys import KeyGuard
from server.operations.metrics import Metrics
from server.operations.tls import RELOAD_CHECK_SECONDS, Certificates
from server.scheduling.scheduler import Scheduler
from server.scheduling.threads import plan_threads
from server.translations import Translations

log = logging.getLogger(__name__)
SERVICE_NAME = translate_pb2.DESCRIPTOR.services_by_name["Translator"].full_name


@dataclass
class Server:
    grpc_server: grpc.aio.Server
    port: int
    metrics_port: int
    health: health.aio.HealthServicer
    scheduler: Scheduler
    metrics: Metrics
    models: Models
    config: ServerConfig
    translations: Translations  # the core both front ends share
    metrics_http: MetricsEndpoint | None = None
    http_runner: web.AppRunner | None = None
    http_port: int = 0  # the bound HTTP API port once started; 0 when disabled
    http_addresses: tuple[str, ...] = ()  # what the HTTP API listens on once started (host:port each)
    certificates: Certificates | None = None  # TLS for both front ends, reloaded when the files change
    keys: KeyGuard | None = None  # API keys and limits (server/operations/keys.py), reloaded when their file changes
    http_api: HttpApi | None = None  # its /health turns ok with gRPC's health service
    _reloading_keys: asyncio.Task | None = None
    _reloading: asyncio.Task | None = None
    _watching: asyncio.Task | None = None  # the event loop's lag, for the front door

    async def start(self) -> None:
        self._watching = asyncio.create_task(self.translations.door.watch_loop())
        await self.grpc_server.start()
        if self.http_runner is not None:
            await self.http_runner.setup()
            ssl_context = self.certificates.http_context if self.certificates else None
            sockets = listen(self.config.host, self.config.http_port)
            for sock in sockets:
                await web.SockSite(self.http_runner, sock, ssl_context=ssl_context, backlog=BACKLOG).start()
            self.http_port = sockets[0].getsockname()[1]
            self.http_addresses = tuple(bound(sockets))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.scheduler.start)  # continuous: longer lanes load their sessions
        if self.config.warmup:
            for engine in self.models:
                await loop.run_in_executor(None, engine.warmup)
        if self.certificates is not None:
            self._reloading = asyncio.create_task(self._reload_certificates())
        if self.keys is not None and self.keys.enabled:
            self._reloading_keys = asyncio.create_task(self._reload_keys())
        if self.keys is not None:
            await self.keys.check_store()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.http_api is not None:
            self.http_api.serving = True
        log.info(
            "serving %s: gRPC on %s, HTTP API on %s, metrics on %s%s; event loop: %s",
            self.models.describe(),
            grpc_address(self.config.host, self.port),
            " ".join(self.http_addresses) or "off",
            " ".join(self.metrics_http.addresses),
            f"; the page at {self.page_url}" if self.page_url else "",
            type(asyncio.get_running_loop()).__module__.split(".")[0],
        )

    @property
    def page_url(self) -> str:
        """Where a browser on this host opens the page at / (server/page/); "" when the HTTP API is off."""
        if self.http_runner is None:
            return ""
        scheme = "https" if self.certificates is not None else "http"
        return f"{scheme}://{hostport(local_address(self.config.host), self.http_port)}/"

    async def _reload_certificates(self) -> None:
        """The HTTP API's certificate follows its files (gRPC checks them itself at each handshake)."""
        while True:
            await asyncio.sleep(RELOAD_CHECK_SECONDS)
            await asyncio.get_running_loop().run_in_executor(None, self.certificates.reload_http)

    async def _reload_keys(self) -> None:
        while True:
            await asyncio.sleep(KEYS_RELOAD_SECONDS)
            self.keys.reload()

    async def drain(self) -> None:
        """Graceful shutdown: NOT_SERVING (gRPC health, and /health 503 "draining") and new work refused
        (UNAVAILABLE, HTTP 503 with Retry-After) at once; both listeners stay open for grace_seconds, so that a
        load balancer sees the refusals and its callers get an answer rather than a refused connection, while
        in-flight requests finish; then both stop (what is still in flight is cancelled)."""
        await self.health.enter_graceful_shutdown()
        for task in (self._reloading, self._reloading_keys, self._watching):
            if task is not None:
                task.cancel()
        self.scheduler.stop_accepting()
        await asyncio.sleep(self.config.grace_seconds)
        await self.grpc_server.stop(0)
        if self.http_runner is not None:
            await self.http_runner.shutdown()
            await self.http_runner.cleanup()
        await asyncio.get_running_loop().run_in_executor(None, self.scheduler.stop, 5.0)
        if self.metrics_http is not None:
            self.metrics_http.shutdown()


def _tolerant(parse):
    """A request deserializer that turns unparsable bytes (e.g. invalid UTF-8 in a string
    field) into MALFORMED, so the handler answers INVALID_ARGUMENT instead of gRPC's INTERNAL."""

    def deserialize(data: bytes):
        try:
            return parse(data)
        except DecodeError:
            return MALFORMED

    return deserialize


def _translator_handlers(servicer: TranslatorService) -> grpc.GenericRpcHandler:
    """The service's handlers as the generated registration makes them (read from the proto's descriptor,
    so a new RPC needs no edit here), with tolerant request deserializers."""
    handlers = {}
    for method in translate_pb2.DESCRIPTOR.services_by_name["Translator"].methods:
        request, response = (getattr(translate_pb2, t.name) for t in (method.input_type, method.output_type))
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=_tolerant(request.FromString),
            response_serializer=response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def serving_engines(config: ServerConfig) -> list[Engine]:
    """Each of ``config``'s models on the sessions all its lanes run on (their threads: ``plan_threads``), with the
    stop rules as configured (the runaway-output guard)."""
    plan = plan_threads(config)
    settings = dataclasses.replace(config.engine, intra_op_threads=plan.session_threads)
    options = RuntimeOptions(settings=settings, spinning=config.intra_op_spinning)
    return [Engine(folder, options, stop_rules(config.max_repeats)) for folder in config.model]


def create_server(config: ServerConfig, metrics: Metrics | None = None) -> Server:
    """Build (not start) the server; port 0 in config picks free ports, read back from the result."""
    models = Models(serving_engines(config), config.language_detection)
    metrics = metrics or Metrics()
    for engine in models:
        metrics.model_info.labels(engine.name).info(
            {
                "version": engine.version,
                "provider": engine.provider,
                "variant": engine.variant,
                "source_language": engine.source_language,
                "target_language": engine.target_language,
            }
        )
    scheduler = Scheduler(models.engines, config, metrics)
    options = [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        # Close connections after a while so clients that balance per connection find new replicas.
        ("grpc.max_connection_age_ms", int(config.max_connection_age_s * 1000)),
        ("grpc.max_connection_age_grace_ms", int(config.grace_seconds * 1000)),
        # A client gone silent has its calls cancelled (their decoding stops) after keepalive time + timeout.
        ("grpc.keepalive_time_ms", int(config.keepalive_time_s * 1000)),
        # Calls gRPC has received and the server not yet picked up: past the soft bound gRPC cancels a growing
        # share of new ones (the caller sees CANCELLED, not a refusal), all past the hard one. Its defaults (1,000
        # and 3,000) cancelled 11% of a flood of 1,500 single sentences a second that the front door refuses
        # itself; the door's own bound on requests holds them instead.
        ("grpc.server.max_pending_requests", config.door_requests),
        ("grpc.server.max_pending_requests_hard_limit", 2 * config.door_requests),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
        ("grpc.http2.ping_timeout_ms", int(config.keepalive_timeout_s * 1000)),
        # Clients' keepalive pings are allowed, with calls or without (client/channel.py pings every 2 s);
        # gRPC's default, one each 5 minutes, answers faster pings with GOAWAY too_many_pings.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.min_client_ping_interval_s * 1000)),
    ]
    # RPCs over the limit are refused by gRPC itself (RESOURCE_EXHAUSTED) before they queue up unseen.
    server = grpc.aio.server(options=options, maximum_concurrent_rpcs=config.max_concurrent_rpcs)
    translations = Translations(scheduler, config, metrics)
    access = AccessLog(metrics, config.access_log, config.access_log_texts, config.access_log_sample)
    store_up = metrics.limits_store_up.labels("redis").set if config.redis_url else (lambda up: None)
    keys = KeyGuard(config.api_keys, config.redis_url, config.limits_when_store_down, store_up)
    service = TranslatorService(models, translations, config, access, keys)
    server.add_generic_rpc_handlers((_translator_handlers(service),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    address = grpc_address(config.host, config.port)
    certificates = Certificates(config) if config.tls_cert is not None else None
    if certificates is not None:
        port = server.add_secure_port(address, certificates.grpc_credentials())
    else:
        port = server.add_insecure_port(address)
    metrics_http = MetricsEndpoint(config.host, config.metrics_port, metrics.registry)
    # A client that goes away cancels its handler, and so its job (as a cancelled RPC does).
    http_api = HttpApi(models, translations, config, access, keys)
    http_runner = (
        web.AppRunner(http_api.application(), handler_cancellation=True, access_log=None) if config.http_port else None
    )
    return Server(
        server,
        port,
        metrics_http.port,
        health_servicer,
        scheduler,
        metrics,
        models,
        config,
        translations,
        metrics_http,
        http_runner,
        certificates=certificates,
        keys=keys,
        http_api=http_api,
    )


async def serve(config: ServerConfig) -> None:
    """Run until SIGTERM or SIGINT, then drain."""
    server = create_server(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining (grace %.0f s)", config.grace_seconds)
    await server.drain()
