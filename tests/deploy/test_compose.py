"""docker-compose.yml: valid against the Compose specification (the compose-spec package's parser),
and consistent with the Dockerfile, the server's configuration and the Grafana provisioning."""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml
from compose_spec import PyCompose

from client.loadtest import main as loadtest
from server.config import parse_config
from tests.deploy.conftest import DEPLOY, ROOT, SCHEDULER_STOP_SECONDS


def test_compose_file_follows_the_specification():
    project = PyCompose.from_yaml((ROOT / "docker-compose.yml").read_text())
    project.validate()
    assert project.service_names() == ["translator", "prometheus", "grafana", "loadgen"]


def test_only_the_load_generator_is_behind_a_profile(compose):
    profiles = {name: service.get("profiles") for name, service in compose["services"].items()}
    assert profiles == {"translator": None, "prometheus": None, "grafana": None, "loadgen": ["load"]}
    assert compose["services"]["loadgen"]["depends_on"]["translator"]["condition"] == "service_healthy"


def test_pulled_images_name_their_registry(compose):
    """podman and buildah resolve no short names (prom/prometheus) unless registries.conf lists registries to
    search, and Debian's lists none: "short-name ... did not resolve to an alias"."""
    text = (ROOT / "Dockerfile").read_text()
    bases = re.findall(r"^ARG \w+_IMAGE=(\S+)", text, re.M)
    pulled = [service["image"] for service in compose["services"].values() if "build" not in service]
    assert len(bases) == 2 and len(pulled) == 2
    assert all(image.startswith("docker.io/") for image in bases + pulled), bases + pulled


@pytest.mark.parametrize("service", ["translator", "loadgen"])
def test_built_services_name_a_dockerfile_stage(compose, dockerfile_stages, service):
    build = compose["services"][service]["build"]
    assert build["context"] == "."
    assert build["target"] in dockerfile_stages


def test_translator_health_check_is_the_images(compose, dockerfile_stages):
    (image_check,) = dockerfile_stages["runtime"].all("HEALTHCHECK")
    assert list(image_check.value) == compose["services"]["translator"]["healthcheck"]["test"]


def test_translator_environment_is_a_valid_server_config(compose):
    translator = compose["services"]["translator"]
    config = parse_config([], environ=translator["environment"])
    stop_seconds = int(re.fullmatch(r"(\d+)s", translator["stop_grace_period"]).group(1))
    assert config.grace_seconds + SCHEDULER_STOP_SECONDS <= stop_seconds, "the drain ends before SIGKILL"


def test_mounted_files_exist(compose):
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source, target, *_ = volume.split(":")
            assert (ROOT / source).exists(), f"{source} (mounted at {target}) is missing"


def test_grafana_provisioning_matches_the_mounts(compose):
    grafana = compose["services"]["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in grafana["volumes"])
    container_dashboards = mounts["./deploy/grafana/dashboards"]
    (provider,) = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/translation.yml").read_text())["providers"]
    assert provider["options"]["path"] == container_dashboards
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(container_dashboards + "/")
    assert (DEPLOY / "grafana/dashboards" / home.rpartition("/")[2]).exists()
    (source,) = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())["datasources"]
    assert source["url"] == "http://prometheus:9090" and "9090:9090" in compose["services"]["prometheus"]["ports"]
    dashboard = (DEPLOY / "grafana/dashboards/translation.json").read_text()
    assert set(re.findall(r'"uid": "([^"]+)"', dashboard)) - {"translation-service"} == {source["uid"]}


def test_load_generator_command_runs(compose, live_server, tiny_export, tmp_path):
    """The compose command, pointed at the live server and cut down to a few requests."""
    command = compose["services"]["loadgen"]["command"]
    assert command[0] == "translate-loadtest"
    local = {
        "--target": f"127.0.0.1:{live_server.server.port}",
        "--metrics": f"http://127.0.0.1:{live_server.server.metrics_port}/metrics",
        "--tokenizer": str(tiny_export / "sentencepiece.model"),
        "--concurrency": "2",
        "--requests": "4",
        "--out": str(tmp_path),
    }
    args = [f"{flag}={local.get(flag, value)}" for flag, _, value in (arg.partition("=") for arg in command[1:])]
    assert loadtest(args) == 0, shlex.join(args)
    report = json.loads((tmp_path / "report.json").read_text())
    codes = [result["code"] for run in report["results"] for result in run]
    assert codes == ["OK"] * 4
