"""Stored glossaries, after DeepL's glossary resource: created with a name, a language pair and entries, then
listed, read (with entries) and deleted, never changed; a translation names one by ``glossary_id``.

They are kept in Redis where ``--redis-url`` is set (shared by the replicas, kept over restarts, as the API keys'
counts are), else in this process. Each belongs to its creator: the API key's name where keys are on (a glossary
of another key is answered as unknown, 404 / NOT_FOUND), one shared owner where they are off. A glossary's
matcher (server/documents/glossary.py) is built once per process and kept, as a stored glossary never changes.

Redis holds ``translate:glossary:ID`` (a hash: its description, its owner, and its entries as JSON) and
``translate:glossaries:OWNER`` (the set of the owner's IDs).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

from server.config import ServerConfig
from server.documents.glossary import MAX_NAME_CHARS, MAX_STORED_ENTRIES, Glossary, checked_entries
from server.errors import InvalidRequest, NotFound, Unavailable

MAX_GLOSSARIES_PER_KEY = 100  # a store per key, not a database: each is up to MAX_STORED_ENTRIES
KEPT_MATCHERS = 64  # stored glossaries whose matcher a process keeps built (a 10,000-entry one builds in ~10 ms)
PREFIX = "translate:glossary"


@dataclass(frozen=True)
class GlossaryInfo:
    """A stored glossary's description, as DeepL's (entries only where asked for)."""

    glossary_id: str
    name: str
    source_lang: str
    target_lang: str
    entry_count: int
    creation_time: float  # seconds since the epoch
    ready: bool = True


@dataclass
class StoredGlossary:
    info: GlossaryInfo
    owner: str
    entries: dict[str, str] = field(default_factory=dict)

    def glossary(self) -> Glossary:
        i = self.info
        return Glossary(self.entries, i.source_lang, i.target_lang, name=i.name, glossary_id=i.glossary_id)


def new_glossary(owner: str, name: Any, source: Any, target: Any, entries: Any) -> StoredGlossary:
    """A glossary to store, its fields checked (InvalidRequest naming what is wrong)."""
    for what, value in (("name", name), ("source_lang", source), ("target_lang", target)):
        if not isinstance(value, str) or not value.strip():
            raise InvalidRequest(f"Invalid request: missing {what} parameter (a string)")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidRequest(f"name has {len(name)} characters, over the limit of {MAX_NAME_CHARS}")
    checked = checked_entries(entries, MAX_STORED_ENTRIES, "entries")
    if not checked:
        raise InvalidRequest("entries is empty: a glossary needs at least one entry")
    info = GlossaryInfo(uuid.uuid4().hex, name, source.lower(), target.lower(), len(checked), round(time.time(), 3))
    return StoredGlossary(info, owner, checked)


class MemoryGlossaries:
    """In this process: gone when it stops."""

    def __init__(self) -> None:
        self.glossaries: dict[str, StoredGlossary] = {}

    async def add(self, stored: StoredGlossary) -> None:
        self.glossaries[stored.info.glossary_id] = stored

    async def ids(self, owner: str) -> list[str]:
        return [i for i, stored in self.glossaries.items() if stored.owner == owner]

    async def describe(self, glossary_id: str) -> tuple[GlossaryInfo, str] | None:
        stored = self.glossaries.get(glossary_id)
        return (stored.info, stored.owner) if stored else None

    async def entries(self, glossary_id: str) -> dict[str, str]:
        return self.glossaries[glossary_id].entries

    async def remove(self, owner: str, glossary_id: str) -> None:
        self.glossaries.pop(glossary_id, None)


class RedisGlossaries:
    """In Redis, shared by every replica."""

    def __init__(self, url: str) -> None:
        import redis.asyncio

        self.redis = redis.asyncio.from_url(url, socket_timeout=2.0, socket_connect_timeout=0.5)

    async def add(self, stored: StoredGlossary) -> None:
        fields = {"info": json.dumps(asdict(stored.info)), "owner": stored.owner, "entries": json.dumps(stored.entries)}
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(f"{PREFIX}:{stored.info.glossary_id}", mapping=fields)
            pipe.sadd(f"{PREFIX}s:{stored.owner}", stored.info.glossary_id)
            await pipe.execute()

    async def ids(self, owner: str) -> list[str]:
        return sorted(i.decode() for i in await self.redis.smembers(f"{PREFIX}s:{owner}"))

    async def describe(self, glossary_id: str) -> tuple[GlossaryInfo, str] | None:
        info, owner = await self.redis.hmget(f"{PREFIX}:{glossary_id}", ["info", "owner"])
        return (GlossaryInfo(**json.loads(info)), owner.decode()) if info is not None else None

    async def entries(self, glossary_id: str) -> dict[str, str]:
        return json.loads(await self.redis.hget(f"{PREFIX}:{glossary_id}", "entries") or "{}")

    async def remove(self, owner: str, glossary_id: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(f"{PREFIX}:{glossary_id}")
            pipe.srem(f"{PREFIX}s:{owner}", glossary_id)
            await pipe.execute()


class GlossaryStore:
    """The stored glossaries of each owner, with the limits on them."""

    def __init__(self, config: ServerConfig) -> None:
        self.backend = RedisGlossaries(config.redis_url) if config.redis_url else MemoryGlossaries()
        self.matchers: OrderedDict[str, Glossary] = OrderedDict()

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self.backend, method)(*args)
        except Exception as e:
            if isinstance(e, (InvalidRequest, NotFound)):
                raise
            raise Unavailable(f"the glossary store is out of reach ({type(e).__name__}); try again later") from e

    async def create(self, stored: StoredGlossary) -> GlossaryInfo:
        owned = await self._call("ids", stored.owner)
        if len(owned) >= MAX_GLOSSARIES_PER_KEY:
            raise InvalidRequest(
                f"{stored.owner or 'this server'} has {len(owned)} glossaries, the limit of {MAX_GLOSSARIES_PER_KEY} "
                "glossaries per key: delete one first"
            )
        await self._call("add", stored)
        return stored.info

    async def owned(self, owner: str) -> list[GlossaryInfo]:
        found = [await self._call("describe", i) for i in await self._call("ids", owner)]
        return sorted((info for info, _ in filter(None, found)), key=lambda info: info.creation_time)

    async def info(self, owner: str, glossary_id: Any) -> GlossaryInfo:
        """The owner's glossary's description; NotFound for an unknown one or another owner's."""
        described = await self._call("describe", glossary_id) if isinstance(glossary_id, str) and glossary_id else None
        if described is None or described[1] != owner:
            raise NotFound(f"glossary {glossary_id!r} is not one of this API key's (create it, or list them)")
        return described[0]

    async def entries(self, owner: str, glossary_id: Any) -> tuple[GlossaryInfo, dict[str, str]]:
        info = await self.info(owner, glossary_id)
        return info, await self._call("entries", info.glossary_id)

    async def delete(self, owner: str, glossary_id: Any) -> None:
        info = await self.info(owner, glossary_id)
        await self._call("remove", owner, info.glossary_id)
        self.matchers.pop(info.glossary_id, None)

    async def glossary(self, owner: str, glossary_id: Any) -> Glossary:
        """The owner's glossary as a translation applies it: its matcher built once and kept (it never changes;
        its description is read each time, so that a deletion on any replica is seen)."""
        info = await self.info(owner, glossary_id)
        kept = self.matchers.get(info.glossary_id)
        if kept is None:
            entries = await self._call("entries", info.glossary_id)
            kept = StoredGlossary(info, owner, entries).glossary()
            self.matchers[info.glossary_id] = kept
            if len(self.matchers) > KEPT_MATCHERS:
                self.matchers.popitem(last=False)
        self.matchers.move_to_end(info.glossary_id)
        return kept
