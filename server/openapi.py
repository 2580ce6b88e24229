"""The HTTP API's OpenAPI 3.1 document, served at ``/spec``: every route, field and error of server/http.py.

Built from the served models, so ``source`` and ``target`` list the languages this server has; a property-based
test (tests/server/test_openapi.py, schemathesis) checks the server against it.
"""

from __future__ import annotations

from typing import Any

from server.files import SUFFIXES
from server.glossary import MAX_INLINE_ENTRIES, MAX_STORED_ENTRIES, MAX_TERM_CHARS
from server.models import AUTO, Models

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


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": _ref("Error")}}}


def _body(schema: str, form_schema: str | None = None) -> dict[str, Any]:
    content = {JSON: {"schema": _ref(schema)}}
    if form_schema:
        content[FORM] = {"schema": _ref(form_schema)}
    return {"required": True, "content": content}


def _ok(description: str, schema: dict[str, Any], headers: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "description": description,
        "content": {JSON: {"schema": schema}},
        **({"headers": headers} if headers else {}),
    }


def _schemas(models: Models, max_alternatives: int) -> dict[str, Any]:
    sources = sorted({engine.source_language for engine in models}) + [AUTO]
    targets = sorted({engine.target_language for engine in models})
    strings = {"type": "array", "items": {"type": "string"}}
    one_or_many = {"oneOf": [{"type": "string"}, {**strings, "minItems": 1}]}
    detected = {
        "type": "object",
        "required": ["language", "confidence"],
        "properties": {
            "language": {"type": "string", "description": "ISO 639-1 code"},
            "confidence": {"type": "number", "minimum": 0, "maximum": 100},
        },
    }
    translate_fields = {
        "source": {
            "type": "string",
            "enum": sources,
            "description": "source language (in any case); auto detects it; the target's: the texts come back",
        },
        "target": {"type": "string", "enum": targets, "description": "target language (in any case)"},
        "format": {"type": "string", "enum": ["text", "html", ""], "default": "text", "description": "empty: text"},
        "min_confidence": {"type": "number", "description": "flag translations scoring under it (negative)"},
        "api_key": {"type": "string", "description": "the caller's API key, where the server has keys"},
        "alternatives": {
            "type": "integer",
            "minimum": 0,
            "maximum": max_alternatives,
            "default": 0,
            "description": "up to this many other translations per text, from the beam's n-best (the beam widened "
            "to alternatives + 1, within the server's max_beam_size)",
        },
        "mirror_formatting": {
            "type": "boolean",
            "default": True,
            "description": "format text: the source's case and final punctuation on the translation, as LibreTranslate",
        },
        "pass_through": {
            "type": "boolean",
            "default": True,
            "description": "format text: a text without letters (emoji, digits, symbols) comes back as sent",
        },
        "glossary": {
            "oneOf": [{"type": "object", "additionalProperties": {"type": "string"}}, {"type": "string"}],
            "description": f"source term → target term (at most {MAX_INLINE_ENTRIES} entries of at most "
            f"{MAX_TERM_CHARS} characters; a form sends its JSON text): whole words, any case, the longest first, "
            "only in text; each occurrence's target term is in the translation verbatim",
        },
        "glossary_id": {"type": "string", "description": "a stored glossary of the caller's (not with glossary)"},
    }
    glossary_info = {
        "glossary_id": {"type": "string"},
        "name": {"type": "string"},
        "source_lang": {"type": "string"},
        "target_lang": {"type": "string"},
        "entry_count": {"type": "integer"},
        "creation_time": {"type": "number", "description": "seconds since the epoch"},
        "ready": {"type": "boolean"},
    }
    return {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
        "TranslateRequest": {
            "type": "object",
            "required": ["q", "source", "target"],
            "properties": {"q": {**one_or_many, "description": "a text, or a list of texts"}, **translate_fields},
        },
        "TranslateForm": {
            "type": "object",
            "required": ["q", "source", "target"],
            "properties": {"q": {"type": "string"}, **translate_fields},
        },
        "TranslateResponse": {
            "type": "object",
            "required": ["translatedText", "confidence"],
            "properties": {
                "translatedText": {**one_or_many, "description": "one per text, in order, shaped as q"},
                "confidence": {
                    "oneOf": [{"type": "number"}, {"type": "array", "items": {"type": "number"}}],
                    "description": "mean token log-probability, at most 0",
                },
                "alternatives": {  # anyOf: an empty list is either
                    "anyOf": [strings, {"type": "array", "items": strings}],
                    "description": "with alternatives over 0: other translations, best first, none the same as the "
                    "translation (a list of them per text for a list q)",
                },
                "flags": {"type": "array", "description": "repetition, length, low_confidence (per text for a list)"},
                "detectedLanguage": {
                    "oneOf": [detected, {"type": "array", "items": detected}],
                    "description": "with source auto",
                },
                "glossaryApplied": {
                    "oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}],
                    "description": "with a glossary: each entry applied (by its source term) and how often (per "
                    "text for a list q)",
                },
            },
        },
        "GlossaryRequest": {
            "type": "object",
            "required": ["name", "source_lang", "target_lang", "entries"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "source_lang": {"type": "string", "minLength": 1},
                "target_lang": {"type": "string", "minLength": 1},
                "entries": {
                    "oneOf": [{"type": "string"}, {"type": "object", "additionalProperties": {"type": "string"}}],
                    "description": f"source → target, at most {MAX_STORED_ENTRIES}: text in entries_format, or an "
                    "object",
                },
                "entries_format": {"type": "string", "enum": ["tsv", "csv", "json"], "default": "tsv"},
                "api_key": translate_fields["api_key"],
            },
        },
        "Glossary": {"type": "object", "required": ["glossary_id"], "properties": glossary_info},
        "GlossaryWithEntries": {
            "type": "object",
            "required": ["glossary_id", "entries"],
            "properties": {**glossary_info, "entries": {"type": "object", "additionalProperties": {"type": "string"}}},
        },
        "DetectRequest": {
            "type": "object",
            "required": ["q"],
            "properties": {"q": {"type": "string", "minLength": 1}, "api_key": {"type": "string"}},
        },
        "Detected": detected,
        "SuggestRequest": {
            "type": "object",
            "required": ["q", "s", "source", "target"],
            "properties": {
                "q": {"type": "string", "minLength": 1, "description": "the original text"},
                "s": {"type": "string", "minLength": 1, "description": "the suggested translation"},
                "source": {"type": "string", "minLength": 1, "description": "the original's language"},
                "target": {"type": "string", "minLength": 1, "description": "the suggestion's language"},
                "api_key": translate_fields["api_key"],
            },
        },
        "Health": {
            "type": "object",
            "required": ["status"],
            "properties": {"status": {"type": "string", "enum": ["ok", "starting", "draining"]}},
        },
        "FileForm": {
            "type": "object",
            "required": ["file", "source", "target"],
            "properties": {
                "file": {"type": "string", "format": "binary"},
                "source": translate_fields["source"],
                "target": translate_fields["target"],
                "api_key": translate_fields["api_key"],
            },
        },
        "TranslatedFile": {
            "type": "object",
            "required": ["translatedFileUrl"],
            "properties": {"translatedFileUrl": {"type": "string"}},
        },
        "Language": {
            "type": "object",
            "required": ["code", "name", "targets"],
            "properties": {
                "code": {"type": "string"},
                "name": {"type": "string"},
                "targets": {"type": "array", "items": {"type": "string"}},
            },
        },
        "FrontendSettings": {"type": "object", "required": ["charLimit", "language"]},
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
                        "200": _ok("The translations", _ref("TranslateResponse"), model_header),
                        **errors,
                        "404": _error("glossary_id is not one of the caller's stored glossaries"),
                    },
                }
            },
            "/glossaries": {
                "post": {
                    "summary": "Store a glossary (as DeepL's), for the caller's API key",
                    "requestBody": _body("GlossaryRequest", "GlossaryRequest"),
                    "responses": {"201": _ok("Stored", _ref("Glossary")), **small_errors, "503": errors["503"]},
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
                    "responses": {"200": _ok("It", _ref("GlossaryWithEntries")), **small_errors, "404": not_found},
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
                        "200": _ok("Best first", {"type": "array", "items": _ref("Detected")}),
                        **small_errors,
                    },
                }
            },
            "/translate_file": {
                "post": {
                    "summary": f"Translate a file ({', '.join(SUFFIXES)}), keeping its structure",
                    "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": _ref("FileForm")}}},
                    "responses": {
                        "200": _ok("Where to download it, once", _ref("TranslatedFile"), model_header),
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
                        "200": _ok("Serving: ok", _ref("Health")),
                        "503": _ok("Starting (warming up) or draining (SIGTERM)", _ref("Health")),
                    },
                }
            },
            "/languages": {
                "get": {
                    "summary": "Each source language and its targets",
                    "responses": {"200": _ok("The languages", {"type": "array", "items": _ref("Language")})},
                }
            },
            "/frontend/settings": {
                "get": {
                    "summary": "What a LibreTranslate page needs to know",
                    "responses": {"200": _ok("The settings", _ref("FrontendSettings"))},
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
        "components": {"schemas": _schemas(models, max_alternatives)},
    }
