"""API keys and per-key limits, with LibreTranslate's semantics, for both front ends.

``--api-keys FILE`` (a mounted Kubernetes Secret works: it is read again within a second of changing) holds the
keys' sha256 digests, never the keys, with each key's limits, and the limits of callers without a key::

    {"keys": [{"name": "team-a", "sha256": "9f86d0…", "requests_per_minute": 600, "chars_per_request": 5000}],
     "anonymous": {"requests_per_minute": 30, "chars_per_request": 500}}

``"anonymous": null`` refuses callers without a key; a limit of 0 (or left out) is no limit. A key comes as
``api_key`` (HTTP, as LibreTranslate) or the ``x-api-key`` metadata (gRPC). Without a key file every caller is
anonymous and unlimited. Requests per minute are counted in fixed windows of a minute, per key (anonymous callers
per client address): in this process, or in Redis (``--redis-url``) so that every replica counts against the same
limit. While Redis is out of reach the limits degrade, they never vanish: each replica counts them itself (so a
caller may get up to the limit from each replica), or, with ``--limits-when-store-down refuse``, requests with a
requests-per-minute limit are refused (503 / UNAVAILABLE); the log says so when it changes, and
``translate_limits_store_up`` shows it.
``python -m server.operations.keys new NAME`` makes a key and its entry; ``python -m server.operations.keys hash``
digests one from stdin. The key itself is never logged, traced or used as a metric label: its name is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.errors import InvalidRequest, Overloaded, PermissionDenied, Unauthenticated, Unavailable

log = logging.getLogger(__name__)

KEY_METADATA = "x-api-key"
RELOAD_CHECK_SECONDS = 1.0  # a key revoked in the file is refused within about this long
WINDOW_SECONDS = 60
# An unreachable store is asked again at most this often: each try may wait out its connect timeout (0.5 s),
# which the requests in between should not.
STORE_RETRY_S = 2.0


class KeysFileError(ValueError):
    """The keys file cannot be used; the message names the file and what to fix."""


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int = 0  # 0: no limit
    chars_per_request: int = 0

    @classmethod
    def parse(cls, entry: dict[str, Any], where: str) -> Limits:
        values = {name: entry.get(name, 0) for name in ("requests_per_minute", "chars_per_request")}
        if not all(isinstance(v, int) and v >= 0 for v in values.values()):
            raise KeysFileError(f"{where}: requests_per_minute and chars_per_request must be integers >= 0")
        return cls(**values)


@dataclass(frozen=True)
class Caller:
    name: str  # the key's name, or "anonymous"
    limits: Limits
    quota: str  # what its requests per minute are counted under (its key's name, or anonymous@address)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def read_keys(path: Path) -> tuple[dict[str, tuple[str, Limits]], Limits | None]:
    """(sha256 → (name, limits), the anonymous limits or None) from the file at path."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise KeysFileError(f"{path}: {e}; see server/operations/keys.py for the format") from e
    if not isinstance(document, dict) or not isinstance(document.get("keys", []), list):
        raise KeysFileError(f'{path}: expected {{"keys": [...], "anonymous": {{...}} or null}}')
    keys: dict[str, tuple[str, Limits]] = {}
    for i, entry in enumerate(document.get("keys", [])):
        where = f"{path}: keys[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise KeysFileError(f"{where}: each key needs a name")
        sha = entry.get("sha256")
        if not isinstance(sha, str) or len(sha) != 64 or set(sha) - set("0123456789abcdef"):
            raise KeysFileError(
                f"{where}: sha256 must be 64 lower-case hex digits (python -m server.operations.keys hash)"
            )
        keys[sha] = (entry["name"], Limits.parse(entry, where))
    anonymous = document.get("anonymous", {})
    return keys, (None if anonymous is None else Limits.parse(anonymous, f"{path}: anonymous"))


class LocalWindows:
    """Requests per fixed window, in this process."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], int] = {}

    async def hit(self, quota: str, window: int) -> int:
        if len(self.counts) > 10_000:  # drop past windows
            self.counts = {k: v for k, v in self.counts.items() if k[1] >= window}
        self.counts[quota, window] = count = self.counts.get((quota, window), 0) + 1
        return count


class SharedWindows:
    """Requests per fixed window in a shared store (``RedisWindows``) while it answers; while it does not, this
    replica's own counts (``when_down`` "local") or a refusal ("refuse"). Out of reach, the store is asked again
    at most every STORE_RETRY_S, so requests in between do not wait for its timeout. ``on_change(up)`` hears
    each change (and the first answer)."""

    def __init__(self, store: RedisWindows, when_down: str, on_change: Callable[[bool], object]) -> None:
        self.store, self.local, self.when_down, self.on_change = store, LocalWindows(), when_down, on_change
        self.up: bool | None = None  # not asked yet
        self.retry_at = 0.0  # time.monotonic() from which an unreachable store is asked again

    async def hit(self, quota: str, window: int) -> int:
        if self.up is not False or time.monotonic() >= self.retry_at:
            try:
                count = await self.store.hit(quota, window)
            except Exception as error:  # noqa: BLE001 -- any failure of the store: connection, timeout, its errors
                self._unreachable(error)
            else:
                self._changed(True)
                return count
        if self.when_down == "refuse":
            raise Unavailable("the rate limits' shared store is out of reach; retry in a few seconds")
        return await self.local.hit(quota, window)

    async def check(self) -> None:
        """Ask the store once (at start-up), so the log and the gauge say where the limits count from the start."""
        try:
            await self.store.redis.ping()
        except Exception as error:  # noqa: BLE001 -- as in hit
            self._unreachable(error)
        else:
            self._changed(True)

    def _unreachable(self, error: Exception) -> None:
        """The store failed: count here (or refuse) until STORE_RETRY_S from now."""
        self.retry_at = time.monotonic() + STORE_RETRY_S
        self._changed(False, f"{type(error).__name__}: {error}")

    def _changed(self, up: bool, why: str = "") -> None:
        if up == self.up:
            return
        first, self.up = self.up is None, up
        self.on_change(up)
        if up:
            log.log(logging.INFO if first else logging.WARNING, "rate limits: shared in %s", self.store.where)
        elif self.when_down == "refuse":
            log.warning(
                "rate limits: %s out of reach (%s): refusing limited requests until it is back", self.store.where, why
            )
        else:
            log.warning(
                "rate limits: %s out of reach (%s): each replica counts them itself until it is back",
                self.store.where,
                why,
            )


class RedisWindows:
    """Requests per fixed window, in Redis: one counter per quota and window, shared by every replica."""

    def __init__(self, url: str) -> None:
        import redis.asyncio

        self.redis = redis.asyncio.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        where = self.redis.connection_pool.connection_kwargs  # host and port: the URL may hold a password
        self.where = f"Redis at {where.get('host', 'localhost')}:{where.get('port', 6379)}"

    async def hit(self, quota: str, window: int) -> int:
        name = f"translate:requests:{quota}:{window}"
        async with self.redis.pipeline(transaction=True) as pipe:
            count, _ = await pipe.incr(name).expire(name, 2 * WINDOW_SECONDS).execute()
        return int(count)


class KeyGuard:
    """Who a request's caller is, and whether its limits let the request in."""

    def __init__(
        self,
        path: Path | None,
        redis_url: str = "",
        when_store_down: str = "local",
        on_store_change: Callable[[bool], object] = lambda up: None,
    ) -> None:
        self.path = path
        self.keys: dict[str, tuple[str, Limits]] = {}
        self.anonymous: Limits | None = Limits()
        self._seen: tuple[int, int, int] | None = None
        if path is not None:
            self.reload()
        self.windows: LocalWindows | SharedWindows = (
            SharedWindows(RedisWindows(redis_url), when_store_down, on_store_change) if redis_url else LocalWindows()
        )

    async def check_store(self) -> None:
        """Say where the limits count from the start (SharedWindows.check); without a store, nothing to ask."""
        if isinstance(self.windows, SharedWindows):
            await self.windows.check()

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def reload(self) -> bool:
        """Read the file again if it changed (a Secret's update swaps its symlink: the stat follows it). A file
        that became unreadable or invalid keeps the keys read before, and says why in the log."""
        assert self.path is not None
        try:
            stat = os.stat(self.path)
            seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if seen == self._seen:
                return False
            self.keys, self.anonymous = read_keys(self.path)
        except (OSError, KeysFileError) as e:
            if self._seen is None:
                raise KeysFileError(str(e)) from e
            log.error("keeping the API keys read before: %s", e)
            return False
        self._seen = seen
        log.info("API keys: %d from %s, anonymous %s", len(self.keys), self.path, self.anonymous or "refused")
        return True

    def caller(self, key: str | None, address: str) -> Caller:
        if not self.enabled:  # no keys: any key a client sends is ignored, as LibreTranslate does
            return Caller("", Limits(), "")
        if not key:
            if self.anonymous is None:
                raise Unauthenticated(
                    "an API key is required: send api_key (HTTP) or the x-api-key metadata (gRPC); ask the "
                    "server's operator for one"
                )
            return Caller("anonymous", self.anonymous, f"anonymous@{address}")
        found = self.keys.get(digest(key))
        if found is None:
            raise PermissionDenied("the API key is not valid (mistyped or revoked); ask the server's operator")
        name, limits = found
        return Caller(name, limits, f"key:{name}")

    async def admit(self, key: str | None, address: str, chars: int) -> Caller:
        """The caller, once its limits let this request in: InvalidRequest over its characters per request,
        Overloaded (with the seconds to the next window) over its requests per minute."""
        caller = self.caller(key, address)
        limits = caller.limits
        if limits.chars_per_request and chars > limits.chars_per_request:
            raise InvalidRequest(
                f"the request has {chars} characters, over {caller.name}'s limit of {limits.chars_per_request}"
            )
        if limits.requests_per_minute:
            now = time.time()
            window = int(now // WINDOW_SECONDS)
            count = await self.windows.hit(caller.quota, window)
            if count > limits.requests_per_minute:
                retry = max(1, math.ceil((window + 1) * WINDOW_SECONDS - now))
                raise Overloaded(
                    f"{caller.name}: over its {limits.requests_per_minute} requests per minute; retry in about "
                    f"{retry} s",
                    retry_after_s=retry,
                )
        return caller


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.operations.keys", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    new = commands.add_parser("new", help="make a key: prints it (give it to the caller) and its file entry")
    new.add_argument("name")
    new.add_argument("--requests-per-minute", type=int, default=0)
    new.add_argument("--chars-per-request", type=int, default=0)
    commands.add_parser("hash", help="the sha256 of a key read from stdin")
    args = parser.parse_args(argv)
    if args.command == "hash":
        print(digest(sys.stdin.read().strip()))
        return 0
    key = secrets.token_urlsafe(24)
    entry = {"name": args.name, "sha256": digest(key)}
    entry |= {"requests_per_minute": args.requests_per_minute, "chars_per_request": args.chars_per_request}
    print(f"key: {key}\nentry: {json.dumps(entry)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
