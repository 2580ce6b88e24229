"""API keys and limits: the keys file, both front ends, limits shared by two replicas through a real Redis."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import urllib.error
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from proto import translate_pb2
from server.errors import InvalidRequest, Overloaded, PermissionDenied, Unauthenticated, Unavailable
from server.operations import keys as keys_module
from server.operations.keys import (
    KEY_METADATA,
    WINDOW_SECONDS,
    KeyGuard,
    KeysFileError,
    Limits,
    LocalWindows,
    SharedWindows,
    digest,
    main,
    read_keys,
)
from testkit.redis_server import RedisProcess
from testkit.servers import RunningServer, free_port, http, server_config

KEY, OTHER_KEY = "k-team-a-1234567890", "k-team-b-0987654321"


def write_keys(path: Path, anonymous: dict | None = None, **limits) -> Path:
    entries = [{"name": "team-a", "sha256": digest(KEY), **limits}, {"name": "team-b", "sha256": digest(OTHER_KEY)}]
    path.write_text(json.dumps({"keys": entries, "anonymous": anonymous}))
    return path


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.mark.parametrize(
    "document, message",
    [
        ("{not json", "see server/operations/keys.py for the format"),
        ('{"keys": [{"sha256": "00"}]}', r"keys\[0\]: each key needs a name"),
        ('{"keys": [{"name": "a", "sha256": "ABC"}]}', "64 lower-case hex digits"),
        ('{"keys": [], "anonymous": {"requests_per_minute": -1}}', "anonymous: requests_per_minute"),
    ],
)
def test_a_bad_keys_file_names_what_to_fix(tmp_path: Path, document: str, message: str):
    (tmp_path / "keys.json").write_text(document)
    with pytest.raises(KeysFileError, match=message):
        read_keys(tmp_path / "keys.json")


def test_who_the_caller_is(tmp_path: Path):
    guard = KeyGuard(write_keys(tmp_path / "keys.json"))
    assert guard.caller(KEY, "10.0.0.1").name == "team-a"
    with pytest.raises(Unauthenticated, match="an API key is required"):
        guard.caller(None, "10.0.0.1")
    with pytest.raises(PermissionDenied, match="not valid"):
        guard.caller("k-guessed", "10.0.0.1")
    open_guard = KeyGuard(write_keys(tmp_path / "open.json", anonymous={"requests_per_minute": 5}))
    assert open_guard.caller("", "10.0.0.1").quota == "anonymous@10.0.0.1"
    no_keys = KeyGuard(None)  # no keys file: every caller unlimited, whatever key it sends
    assert no_keys.caller(None, "x").limits == no_keys.caller("k-any", "x").limits == Limits()


def test_limits_per_request_and_per_minute(tmp_path: Path):
    guard = KeyGuard(write_keys(tmp_path / "keys.json", requests_per_minute=3, chars_per_request=10))
    with pytest.raises(InvalidRequest, match="11 characters, over team-a's limit of 10"):
        run(guard.admit(KEY, "", 11))
    if time.time() % WINDOW_SECONDS > WINDOW_SECONDS - 2:
        time.sleep(2)  # all within one window
    for _ in range(3):
        run(guard.admit(KEY, "", 5))
    with pytest.raises(Overloaded, match="over its 3 requests per minute") as error:
        run(guard.admit(KEY, "", 5))
    assert 1 <= error.value.retry_after_s <= WINDOW_SECONDS
    assert run(guard.admit(OTHER_KEY, "", 500)).name == "team-b"  # its own, unlimited


def test_a_changed_file_is_read_again_and_a_broken_one_keeps_the_keys(tmp_path: Path):
    path = write_keys(tmp_path / "keys.json")
    guard = KeyGuard(path)
    path.write_text(json.dumps({"keys": [{"name": "team-b", "sha256": digest(OTHER_KEY)}], "anonymous": None}))
    assert guard.reload()
    with pytest.raises(PermissionDenied):
        guard.caller(KEY, "")
    path.write_text("{broken")
    assert not guard.reload()
    assert guard.caller(OTHER_KEY, "").name == "team-b"


def test_the_command_makes_a_key_and_its_entry(capsys, monkeypatch):
    assert main(["new", "team-c", "--requests-per-minute", "60"]) == 0
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    entry = json.loads(lines["entry"])
    assert entry["sha256"] == digest(lines["key"]) and entry["requests_per_minute"] == 60


# --- both front ends ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(tiny_export: Path, tmp_path_factory) -> Iterator[RunningServer]:
    keys = write_keys(tmp_path_factory.mktemp("keys") / "keys.json", requests_per_minute=0, chars_per_request=200)
    server = RunningServer(server_config(tiny_export, http_port=free_port(), api_keys=keys, max_output_tokens=8))
    yield server
    server.close()


def test_http_answers_403_without_a_valid_key(keyed: RunningServer, caplog):
    caplog.set_level(logging.INFO, logger="server.operations.access")
    body = {"q": "A man.", "source": "en", "target": "de"}
    status, _, answer = http(keyed, "/translate", body)
    assert status == 403 and "API key is required" in answer["error"]
    status, _, answer = http(keyed, "/translate", {**body, "api_key": "k-guessed"})
    assert status == 403 and "not valid" in answer["error"]
    status, _, answer = http(keyed, "/translate", {**body, "api_key": KEY})
    assert status == 200 and answer["translatedText"]
    status, _, answer = http(keyed, "/translate", {**body, "q": "x" * 201, "api_key": KEY})
    assert status == 400 and "over team-a's limit of 200" in answer["error"]
    status, _, answer = http(keyed, "/detect", {"q": "A man.", "api_key": KEY})
    assert status == 200
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert '"caller": "team-a"' in logged and KEY not in logged and "k-guessed" not in logged
    status, _, settings = http(keyed, "/frontend/settings")
    assert settings["apiKeys"] is True and settings["keyRequired"] is True


def test_grpc_takes_the_key_as_metadata(keyed: RunningServer):
    request = translate_pb2.TranslateRequest(texts=["A man."])
    for metadata, code in (((), grpc.StatusCode.UNAUTHENTICATED), (((KEY_METADATA, "k-x"),), "PERMISSION_DENIED")):
        with pytest.raises(grpc.RpcError) as error:
            keyed.stub.Translate(request, metadata=metadata, timeout=10)
        assert error.value.code().name == getattr(code, "name", code), error.value.details()
    assert keyed.stub.Translate(request, metadata=((KEY_METADATA, KEY),), timeout=30).translations[0].text
    assert keyed.stub.Detect(translate_pb2.DetectRequest(text="A man."), metadata=((KEY_METADATA, KEY),))


def test_libretranslatepy_with_and_without_a_key(keyed: RunningServer):
    libretranslatepy = pytest.importorskip("libretranslatepy")
    url = f"http://127.0.0.1:{keyed.server.http_port}/"
    client = libretranslatepy.LibreTranslateAPI(url, api_key=KEY)
    assert client.translate("A man.", "en", "de") and client.detect("A man.")[0]["language"] == "en"
    assert client.languages()[0]["code"] == "en"  # /languages is open
    with pytest.raises(urllib.error.HTTPError) as error:
        libretranslatepy.LibreTranslateAPI(url).translate("A man.", "en", "de")
    assert error.value.code == 403


def test_deep_translator_with_a_key(keyed: RunningServer):
    deep_translator = pytest.importorskip("deep_translator")
    url = f"http://127.0.0.1:{keyed.server.http_port}/"
    assert deep_translator.LibreTranslator(source="en", target="de", api_key=KEY, custom_url=url).translate("A man.")
    with pytest.raises(deep_translator.exceptions.AuthorizationException):
        deep_translator.LibreTranslator(source="en", target="de", api_key="k-x", custom_url=url).translate("A man.")


# --- two replicas, one Redis --------------------------------------------------------------------------------


def recorded_checks(guard: KeyGuard, written: threading.Event) -> list[tuple[bool, bool]]:
    """The guard's checks of its keys file from now on: for each, whether it began once ``written`` was set and
    whether it read the file again."""
    checks, reload = [], guard.reload

    def check() -> bool:
        after = written.is_set()
        checks.append((after, reload()))
        return checks[-1][1]

    guard.reload = check
    return checks


def read_at_first_check(checks: list[tuple[bool, bool]]) -> bool:
    """Whether the first check that began after the write, or one under way as it came, read the file."""
    first = next((i for i, (after, _) in enumerate(checks) if after), len(checks) - 1)
    return any(read for _, read in checks[: first + 1])


def test_two_replicas_share_a_keys_limit_and_a_revocation(tiny_export: Path, redis_url: str, tmp_path: Path):
    limit = 40
    keys = write_keys(tmp_path / "keys.json", requests_per_minute=limit)
    config = server_config(tiny_export, http_port=0, api_keys=keys, redis_url=redis_url, max_output_tokens=4)
    replicas = [RunningServer(config), RunningServer(config)]
    request = translate_pb2.TranslateRequest(texts=["A man."])
    metadata = ((KEY_METADATA, KEY),)

    def call(i: int) -> str:
        try:
            replicas[i % 2].stub.Translate(request, metadata=metadata, timeout=30)
            return "OK"
        except grpc.RpcError as error:
            return error.code().name

    try:
        if time.time() % WINDOW_SECONDS > WINDOW_SECONDS - 10:
            time.sleep(WINDOW_SECONDS - time.time() % WINDOW_SECONDS + 0.1)  # one window for the whole load
        with ThreadPoolExecutor(8) as pool:  # closed loop, 8 callers over both replicas
            codes = list(pool.map(call, range(3 * limit)))
        assert codes.count("OK") == limit and codes.count("RESOURCE_EXHAUSTED") == 2 * limit, codes
        written = threading.Event()
        checks = [recorded_checks(replica.server.keys, written) for replica in replicas]
        keys.write_text(json.dumps({"keys": [], "anonymous": None}))  # revoked
        written.set()
        deadline = time.monotonic() + 30  # each replica checks the file every RELOAD_CHECK_SECONDS
        refused: set[int] = set()
        while len(refused) < 2 and time.monotonic() < deadline:
            refused |= {i for i in range(2) if i not in refused and call(i) == "PERMISSION_DENIED"}
            time.sleep(0.05)
        assert refused == {0, 1}, "both replicas must refuse a revoked key"
        assert all(map(read_at_first_check, checks)), checks  # each refuses from its next check on
    finally:
        for replica in replicas:
            replica.close()


# --- the shared store out of reach ---------------------------------------------------------------------------


class FlakyStore:
    """A shared store that fails while ``down``, counting like Redis otherwise."""

    where = "Redis at test:6379"

    def __init__(self) -> None:
        self.down, self.counts = False, LocalWindows()
        self.redis = self

    async def ping(self) -> bool:
        if self.down:
            raise ConnectionError("connection refused")
        return True

    async def hit(self, bucket: str, window: int) -> int:
        await self.ping()
        return await self.counts.hit(bucket, window)


@pytest.mark.parametrize("when_down", ["local", "refuse"])
def test_limits_degrade_while_the_store_is_out_of_reach_and_are_shared_again_once_back(
    monkeypatch, caplog, when_down: str
):
    monkeypatch.setattr(keys_module, "STORE_RETRY_S", 0.0)  # ask the store again at every request
    store, changes = FlakyStore(), []
    windows = SharedWindows(store, when_down, changes.append)

    async def hits(n: int) -> list[int | str]:
        results = []
        for _ in range(n):
            try:
                results.append(await windows.hit("anonymous@10.0.0.1", 7))
            except Unavailable as error:
                results.append(str(error))
        return results

    run(windows.check())
    assert run(hits(2)) == [1, 2] and changes == [True]
    store.down = True
    with caplog.at_level(logging.WARNING, logger="server.operations.keys"):
        down = run(hits(3))
    if when_down == "local":
        assert down == [1, 2, 3]  # this replica's own count, from nothing
        assert "each replica counts them itself until it is back" in caplog.text
    else:
        assert down == ["the rate limits' shared store is out of reach; retry in a few seconds"] * 3
        assert "refusing limited requests until it is back" in caplog.text
    assert changes == [True, False] and caplog.text.count("out of reach") == 1  # said once, not per request
    store.down = False
    assert run(hits(1)) == [3] and changes == [True, False, True]  # the shared count again


def test_an_unreachable_store_is_asked_again_only_after_a_while(monkeypatch):
    store = FlakyStore()
    windows = SharedWindows(store, "local", lambda up: None)
    store.down = True
    asked = []
    original = store.hit

    async def counted(bucket: str, window: int) -> int:
        asked.append(bucket)
        return await original(bucket, window)

    store.hit = counted
    assert run(windows.hit("b", 1)) == 1 and run(windows.hit("b", 1)) == 2
    assert len(asked) == 1  # the second request did not wait for the store's timeout
    store.down = False
    monkeypatch.setattr(keys_module, "STORE_RETRY_S", 0.0)
    windows.retry_at = 0.0
    assert run(windows.hit("b", 1)) == 1 and len(asked) == 2


def test_a_server_whose_redis_stops_under_traffic_keeps_its_limits(tiny_export: Path, tmp_path: Path):
    """Redis stopped and started again on its port mid-test: the anonymous and the per-key limits refuse the
    request over them throughout, the gauge shows the fallback, and once Redis is back the counts are in it."""
    redis = RedisProcess(tmp_path)
    limit = 4
    keys = write_keys(tmp_path / "keys.json", anonymous={"requests_per_minute": limit}, requests_per_minute=limit)
    config = server_config(tiny_export, api_keys=keys, redis_url=redis.url, max_output_tokens=4)
    request = translate_pb2.TranslateRequest(texts=["A man."])
    if time.time() % WINDOW_SECONDS > WINDOW_SECONDS - 25:
        time.sleep(WINDOW_SECONDS - time.time() % WINDOW_SECONDS + 0.1)  # the whole test in one window
    server = RunningServer(config)

    def codes(n: int, metadata=()) -> list[str]:
        answers = []
        for _ in range(n):
            try:
                server.stub.Translate(request, metadata=metadata, timeout=30)
                answers.append("OK")
            except grpc.RpcError as error:
                answers.append(error.code().name)
        return answers

    keyed = ((KEY_METADATA, KEY),)
    try:
        assert server.metric("translate_limits_store_up") == 1
        assert codes(limit + 1) == ["OK"] * limit + ["RESOURCE_EXHAUSTED"]
        redis.stop()
        assert codes(limit + 1) == ["OK"] * limit + ["RESOURCE_EXHAUSTED"]  # counted on this replica alone
        assert codes(limit + 1, keyed) == ["OK"] * limit + ["RESOURCE_EXHAUSTED"]
        assert server.metric("translate_limits_store_up") == 0
        redis.start()
        time.sleep(keys_module.STORE_RETRY_S + 0.1)
        assert codes(limit + 1, keyed) == ["OK"] * limit + ["RESOURCE_EXHAUSTED"]  # Redis came back empty
        assert server.metric("translate_limits_store_up") == 1
        assert redis.client().keys("translate:requests:key:team-a:*")
    finally:
        server.close()
        redis.stop()
