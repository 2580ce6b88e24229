"""The gRPC, HTTP API and metrics ports, the server's defaults, everywhere: the image, compose,
Prometheus, the load generator and Kubernetes (container, probes, Services, policy, scraping)."""

from __future__ import annotations

import pytest
import yaml

from server.config import ServerConfig, parse_config
from tests.deploy.conftest import DEPLOY, OVERLAY_NAMES, container, find, server_environment

GRPC, HTTP, METRICS = ServerConfig.port, ServerConfig.http_port, ServerConfig.metrics_port


def test_server_defaults_are_the_documented_ports():
    assert (GRPC, HTTP, METRICS) == (50051, 5000, 9464)


@pytest.mark.parametrize("stage", ["runtime", "runtime-cuda"])
def test_image_exposes_the_server_ports(dockerfile_stages, stage):
    (expose,) = dockerfile_stages[stage].all("EXPOSE")
    assert expose.value == (str(GRPC), str(HTTP), str(METRICS))


def test_compose_publishes_the_server_ports(compose):
    translator = compose["services"]["translator"]
    config = parse_config([], environ=translator["environment"])
    assert (config.port, config.http_port, config.metrics_port) == (GRPC, HTTP, METRICS)
    assert translator["ports"] == [f"{GRPC}:{GRPC}", f"{HTTP}:{HTTP}", f"{METRICS}:{METRICS}"]
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == [f"translator:{METRICS}"]
    flags = dict(arg.partition("=")[::2] for arg in compose["services"]["loadgen"]["command"][1:])
    assert flags["--target"] == f"translator:{GRPC}"
    assert flags["--metrics"] == f"http://translator:{METRICS}/metrics"


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_kubernetes_uses_the_server_ports(overlays, overlay):
    manifests = overlays[overlay]
    config = server_environment(manifests)
    assert (config.port, config.http_port, config.metrics_port) == (GRPC, HTTP, METRICS)
    main = container(manifests)
    assert {p["name"]: p["containerPort"] for p in main["ports"]} == {"grpc": GRPC, "http": HTTP, "metrics": METRICS}
    probes = [main[probe] for probe in ("startupProbe", "readinessProbe", "livenessProbe")]
    assert {probe["grpc"]["port"] for probe in probes if "grpc" in probe} <= {GRPC}  # exec probes (TLS) read the port
    service = {
        p["name"]: (p["port"], p["targetPort"]) for p in find(manifests, "Service", "translator")["spec"]["ports"]
    }
    assert service == {"grpc": (GRPC, "grpc"), "http": (HTTP, "http"), "metrics": (METRICS, "metrics")}
    headless = find(manifests, "Service", "translator-headless")["spec"]["ports"]
    assert [(p["port"], p["targetPort"]) for p in headless] == [(GRPC, "grpc")]
    policy = find(manifests, "NetworkPolicy")["spec"]["ingress"]
    assert sorted(port["port"] for rule in policy for port in rule["ports"]) == sorted([GRPC, HTTP, METRICS])
    annotations = find(manifests, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(METRICS)
    assert [e["port"] for e in find(manifests, "ServiceMonitor")["spec"]["endpoints"]] == ["metrics"]


def test_compose_and_kubernetes_run_the_same_cpu_image(compose, overlays):
    assert container(overlays["cpu"])["image"] == compose["services"]["translator"]["image"]
