"""/spec is a valid OpenAPI document the server keeps: a property-based test (schemathesis) drives every route
from it, bounded in examples, and /frontend/settings answers as LibreTranslate's page expects."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from testkit.servers import RunningServer, free_port, http, server_config

# The suite runs the same examples every time (a red CI names a real change); OPENAPI_RANDOM=1 explores anew.
DERANDOMIZE = not os.environ.get("OPENAPI_RANDOM")
EXAMPLES = int(os.environ.get("OPENAPI_EXAMPLES", "25"))  # per route and mode; CI: fixed examples, seconds


@pytest.fixture(scope="module")
def api(tiny_export: Path, tiny_reverse_export: Path) -> Iterator[RunningServer]:
    models = (tiny_export, tiny_reverse_export)
    server = RunningServer(server_config(models, http_port=free_port(), max_output_tokens=8, http_timeout_s=30.0))
    yield server
    server.close()


def test_every_route_keeps_its_documented_contract(api: RunningServer):
    """No 5xx, only documented status codes and content types, bodies and headers as the schema says: for every
    route of /spec, with requests that fit it and requests that do not."""
    schema = schemathesis.openapi.from_url(f"http://127.0.0.1:{api.server.http_port}/spec")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 7, operations  # schemathesis leaves /spec itself out

    # A route that takes nothing (GET) has no request that does not fit its schema.
    cases = [(op, mode) for op in operations for mode in GenerationMode if op.method == "post" or mode == "positive"]
    for operation, mode in cases:

        @given(case=operation.as_strategy(mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=DERANDOMIZE,
        )
        def keeps_its_contract(case):
            # A schema-valid request may still be refused (a pair not served, a text over its token limit): 400.
            case.call_and_validate(excluded_checks=[positive_data_acceptance])

        keeps_its_contract()


def test_the_spec_names_every_route_and_the_served_languages(api: RunningServer):
    status, _, spec = http(api, "/spec")
    assert status == 200 and spec["openapi"].startswith("3.1")
    assert set(spec["paths"]) == {
        "/",
        "/translate",
        "/translate_file",
        "/download_file/{name}",
        "/detect",
        "/languages",
        "/frontend/settings",
        "/spec",
        "/health",
        "/suggest",
        "/glossaries",
        "/glossaries/{glossary_id}",
    }
    schemas = spec["components"]["schemas"]
    assert schemas["TranslateRequest"]["properties"]["source"]["enum"] == ["de", "en", "auto"]
    alternatives = schemas["TranslateRequest"]["properties"]["alternatives"]
    assert (alternatives["minimum"], alternatives["maximum"]) == (0, 7)  # max_beam_size 8: a beam of 8 at most
    assert "alternatives" in schemas["TranslateResponse"]["properties"]


def test_frontend_settings_start_from_auto_and_the_default_target(api: RunningServer):
    status, _, body = http(api, "/frontend/settings")
    assert status == 200 and body["language"]["source"]["code"] == "auto"
    assert body["language"]["target"]["code"] == "de" and body["keyRequired"] is False and body["charLimit"] == 100_000
