"""The HTTP API's OpenAPI 3.1 document, served at ``/spec``: every route, field and error of server/doors/http.py.

Built from the served models, so ``source`` and ``target`` list the languages this server has; a property-based
test (tests/server/doors/test_openapi.py, schemathesis) checks the server against it.
"""

from __future__ import annotations

from typing import Any

from server.documents.files import SUFFIXES
from server.doors.openapi_schemas import ref, schemas
from server.models import Models

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
ERRORS = {
    "400": "The request is invalid; the message names the field and the limit, or the pairs served",
    "403": "No api_key where the server refuses anonymous callers, or a key it does not hold",
    "413": "The body is over max_message_bytes",
    "429": "The server is busy (its front door or queue is full, or not keeping up), the key is over its requests "
    "per minute, or a text needs more memory than the budget; Retry-After says when to try again",
    "500": "Inference failed on the batch holding the request; the server keeps serving",
    "503": "The server is draining (SIGTERM)",
    "504": "http_timeout_s passed while the request was queued or decoding",
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": ref("Error")}}}


def _body(schema: str, form_schema: str | None = None) -> dict[str, Any]:
    content = {JSON: {"schema": ref(schema)}}
    if form_schema:
        content[FORM] = {"schema": ref(form_schema)}
    return {"required": True, "content": content}


def _ok(description: str, schema: dict[str, Any], headers: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "description": description,
        "content": {JSON: {"schema": schema}},
        **({"headers": headers} if headers else {}),
    }


def spec(models: Models, max_alternatives: int) -> dict[str, Any]:
    """The OpenAPI document of the HTTP API for these models; ``max_alternatives``: max_beam_size - 1."""
    model_header = {"X-Translation-Model": {"description": "name@version", "schema": {"type": "string"}}}
    errors = {code: _error(text) for code, text in ERRORS.items()}
    small_errors = {code: errors[code] for code in ("400", "403", "413", "429")}
    glossary_parameter = {"name": "glossary_id", "in": "path", "required": True, "schema": {"type": "string"}}
    key_parameter = {"name": "api_key", "in": "query", "required": False, "schema": {"type": "string"}}
    not_found = _error("Not one of the caller's stored glossaries")
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Translation service: the LibreTranslate HTTP API",
            "version": "1",
            "description": f"Serves {models.describe()}. Limits are in tokens (see gRPC's ModelInfo.limits).",
        },
        "paths": {
            "/translate": {
                "post": {
                    "summary": "Translate texts",
                    "requestBody": _body("TranslateRequest", "TranslateForm"),
                    "responses": {
                        "200": _ok("The translations", ref("TranslateResponse"), model_header),
                        **errors,
                        "404": _error("glossary_id is not one of the caller's stored glossaries"),
                    },
                }
            },
            "/glossaries": {
                "post": {
                    "summary": "Store a glossary (as DeepL's), for the caller's API key",
                    "requestBody": _body("GlossaryRequest", "GlossaryRequest"),
                    "responses": {"201": _ok("Stored", ref("Glossary")), **small_errors, "503": errors["503"]},
                },
                "get": {
                    "summary": "The caller's stored glossaries",
                    "parameters": [key_parameter],
                    "responses": {
                        "200": _ok("Without entries", {"type": "object", "properties": {"glossaries": {}}}),
                        **small_errors,
                    },
                },
            },
            "/glossaries/{glossary_id}": {
                "get": {
                    "summary": "One of the caller's stored glossaries, with its entries",
                    "parameters": [glossary_parameter, key_parameter],
                    "responses": {"200": _ok("It", ref("GlossaryWithEntries")), **small_errors, "404": not_found},
                },
                "delete": {
                    "summary": "Delete one of the caller's stored glossaries",
                    "parameters": [glossary_parameter, key_parameter],
                    "responses": {"200": _ok("Deleted", {"type": "object"}), **small_errors, "404": not_found},
                },
            },
            "/detect": {
                "post": {
                    "summary": "Detect a text's language, served or not (one no model reads comes first)",
                    "requestBody": _body("DetectRequest", "DetectRequest"),
                    "responses": {
                        "200": _ok("Best first", {"type": "array", "items": ref("Detected")}),
                        **small_errors,
                    },
                }
            },
            "/translate_file": {
                "post": {
                    "summary": f"Translate a file ({', '.join(SUFFIXES)}), keeping its structure",
                    "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": ref("FileForm")}}},
                    "responses": {
                        "200": _ok("Where to download it, once", ref("TranslatedFile"), model_header),
                        **errors,
                    },
                }
            },
            "/download_file/{name}": {
                "get": {
                    "summary": "A translated file, once",
                    "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {
                        "200": {
                            "description": "The file",
                            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                        },
                        "404": _error("No such file: each is downloaded once, within file_ttl_s"),
                    },
                }
            },
            "/suggest": {
                "post": {
                    "summary": "Suggest a better translation (kept for whoever improves the models)",
                    "requestBody": _body("SuggestRequest", "SuggestRequest"),
                    "responses": {
                        "200": _ok("Stored", {"type": "object", "properties": {"success": {"const": True}}}),
                        **small_errors,
                        "403": _error("Suggestions are off (the server runs without --suggestions), or a key refused"),
                        "503": _error("The suggestion could not be stored (Redis out of reach); try again later"),
                    },
                }
            },
            "/health": {
                "get": {
                    "summary": "Whether the server serves, for load balancers and uptime checks",
                    "responses": {
                        "200": _ok("Serving: ok", ref("Health")),
                        "503": _ok("Starting (warming up) or draining (SIGTERM)", ref("Health")),
                    },
                }
            },
            "/languages": {
                "get": {
                    "summary": "Each source language and its targets",
                    "responses": {"200": _ok("The languages", {"type": "array", "items": ref("Language")})},
                }
            },
            "/frontend/settings": {
                "get": {
                    "summary": "What a LibreTranslate page needs to know",
                    "responses": {"200": _ok("The settings", ref("FrontendSettings"))},
                }
            },
            "/": {
                "get": {
                    "summary": "A page to try the API (HTML)",
                    "responses": {"200": {"description": "The page", "content": {"text/html": {"schema": {}}}}},
                }
            },
            "/spec": {
                "get": {
                    "summary": "This document",
                    "responses": {"200": _ok("OpenAPI 3.1", {"type": "object"})},
                }
            },
        },
        "components": {"schemas": schemas(models, max_alternatives)},
    }
