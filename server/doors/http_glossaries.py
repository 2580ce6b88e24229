"""The HTTP API's stored glossaries, DeepL's routes over server/documents/glossaries.py: POST /glossaries, GET
/glossaries, GET and DELETE /glossaries/ID, each a caller's own (server/doors/http.py admits the caller and records the
outcome)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from server.documents.glossaries import GlossaryStore, new_glossary
from server.documents.glossary import parse_entries
from server.models import Models
from server.operations.keys import Caller


class GlossaryRoutes:
    def __init__(self, models: Models, glossaries: GlossaryStore) -> None:
        self.models, self.glossaries = models, glossaries

    async def create(self, request: web.Request, fields: dict[str, Any], caller: Caller) -> web.Response:
        """DeepL's glossary creation: name, source_lang, target_lang, entries (TSV, CSV or JSON text as
        entries_format says, TSV by default; or a JSON object) for a pair this server translates."""
        source, target = fields.get("source_lang"), fields.get("target_lang")
        entries = fields.get("entries")
        if isinstance(entries, str):
            entries = parse_entries(entries, str(fields.get("entries_format") or "tsv"))
        stored = new_glossary(caller.name, fields.get("name"), source, target, entries)
        self.models.resolve(source=stored.info.source_lang, target=stored.info.target_lang)  # a pair served here
        info = await self.glossaries.create(stored)
        return web.json_response(vars(info), status=201)

    async def list(self, request: web.Request, fields: dict[str, Any], caller: Caller) -> web.Response:
        owned = await self.glossaries.owned(caller.name)
        return web.json_response({"glossaries": [vars(info) for info in owned]})

    async def get(self, request: web.Request, fields: dict[str, Any], caller: Caller) -> web.Response:
        info, entries = await self.glossaries.entries(caller.name, request.match_info["glossary_id"])
        return web.json_response(vars(info) | {"entries": entries})

    async def delete(self, request: web.Request, fields: dict[str, Any], caller: Caller) -> web.Response:
        glossary_id = request.match_info["glossary_id"]
        await self.glossaries.delete(caller.name, glossary_id)
        return web.json_response({"glossary_id": glossary_id, "deleted": True})
