"""The Grafana dashboard and the Prometheus alerts: every expression parses as PromQL and names
only series that the server exports, as scraped from a live server."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request

import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from server.config import ServerConfig
from tests.deploy.conftest import DEPLOY, OVERLAY_NAMES, container, mib

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "translation.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
# Grafana's variables, replaced by values of their kind so that the expression parses.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h", "$instance": ".*"}
# Series Prometheus itself adds for every target.
PROMETHEUS_SERIES = {"up"}
# Labels Prometheus attaches to every scraped series.
TARGET_LABELS = {"instance", "job"}
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "summary": ("", "_sum", "_count", "_created"),
}


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["query"]["query"]).groups()
        expressions.append(f"{metric}{{{label}!=''}}")
    return expressions


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def selectors(expression: str) -> list[promql_parser.VectorSelector]:
    for variable, value in GRAFANA_VARIABLES.items():
        expression = expression.replace(variable, value)
    found: list[promql_parser.VectorSelector] = []
    promql_parser.walk(
        promql_parser.parse(expression),
        lambda node: found.append(node) if isinstance(node, promql_parser.VectorSelector) else None,
    )
    assert found and all(s.name for s in found), expression
    return found


EXPRESSIONS = [("dashboard", e) for e in dashboard_expressions()] + [("alerts", r["expr"]) for r in alert_rules()]


@pytest.fixture(scope="module")
def scraped(live_server) -> dict[str, set[str]]:
    """Exported series names (with their histogram/counter suffixes) and the labels each carries."""
    url = f"http://127.0.0.1:{live_server.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES[family.type]:
            series.setdefault(family.name + suffix, set())
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


@pytest.mark.parametrize(("source", "expression"), EXPRESSIONS)
def test_expression_names_exported_series(scraped, source, expression):
    for selector in selectors(expression):
        if selector.name in PROMETHEUS_SERIES:
            continue
        assert selector.name in scraped, f"{source}: {selector.name} is not exported by the server"
        labels = {m.name for m in selector.matchers.matchers} - TARGET_LABELS
        if scraped[selector.name]:  # a labelled family shows its labels once it has samples
            assert labels <= scraped[selector.name], f"{source}: {selector.name} has no label {labels}"


def test_dashboard_has_a_panel_for_every_server_metric(scraped):
    family = lambda name: re.sub(r"_(bucket|sum|count|total|created)$", "", name)
    shown = {family(s.name) for e in dashboard_expressions() for s in selectors(e)}
    missing = {family(name) for name in scraped if name.startswith("translate_")} - shown
    assert not missing, f"no panel shows {sorted(missing)}"


def test_dashboard_panels_tile_the_grid():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = [
        (p["gridPos"]["y"] + dy, p["gridPos"]["x"] + dx)
        for p in panels
        for dy in range(p["gridPos"]["h"])
        for dx in range(p["gridPos"]["w"])
    ]
    assert all(x < 24 for _, x in cells), "Grafana's grid is 24 columns wide"
    assert len(set(cells)) == len(cells), "panels overlap"


def test_alert_rules_are_complete():
    for rule in alert_rules():
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_memory_alert_states_the_container_limit(overlays, compose):
    """The alert's limit is a number (compose has no kube-state-metrics to read it from): the one in
    every overlay's container and in compose's mem_limit, as is the dashboard's."""
    (rule,) = [r for r in alert_rules() if r["alert"] == "TranslatorMemoryHigh"]
    threshold = re.fullmatch(
        r'process_resident_memory_bytes\{job="translator"\} > 0\.9 \* (\d+) \* 1024 \* 1024', rule["expr"]
    )
    assert threshold, rule["expr"]
    limit_mib = int(threshold.group(1))
    for overlay in OVERLAY_NAMES:
        assert mib(container(overlays[overlay])["resources"]["limits"]["memory"]) == limit_mib, overlay
    assert compose["services"]["translator"]["mem_limit"] == f"{limit_mib}m"
    assert f"container limit ({limit_mib} MiB" in DASHBOARD.read_text()


def test_prometheus_scrapes_the_translator_and_loads_the_alerts():
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert [(DEPLOY / "prometheus" / f).exists() for f in config["rule_files"]] == [True]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "translator", "the alerts select job=translator"
    assert job["static_configs"] == [{"targets": [f"translator:{ServerConfig.metrics_port}"]}]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_accepts_the_config_and_its_rules():
    config = DEPLOY / "prometheus" / "prometheus.yml"
    result = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
