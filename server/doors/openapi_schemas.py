"""The OpenAPI document's schemas (its ``components``), built from the served models: what each request and
answer of server/doors/http.py holds (server/doors/openapi.py has the routes).
"""

from __future__ import annotations

from typing import Any

from server.documents.glossary import MAX_INLINE_ENTRIES, MAX_STORED_ENTRIES, MAX_TERM_CHARS
from server.models import AUTO, Models


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def schemas(models: Models, max_alternatives: int) -> dict[str, Any]:
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
