"""Fixtures for the deployment files: the rendered Kubernetes overlays, the compose file, the
Dockerfile's stages, and a live in-process server to check them against; and what the deploy tests read
from a rendered overlay (its translator container, the server's configuration, memory quantities)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dockerfile
import pytest
import yaml

from server.config import ServerConfig, parse_config
from testkit.servers import RunningServer, server_config
from tests.deploy import kustomize

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ROOT / "deploy" / "k8s" / "overlays"
OVERLAY_NAMES = sorted(p.name for p in OVERLAYS.iterdir())
# Server.drain (server/app.py) gives the scheduler this long to stop after the gRPC drain.
SCHEDULER_STOP_SECONDS = 5
QUANTITY = {"Mi": 1, "Gi": 1024}


@pytest.fixture(scope="package")
def live_server(tiny_export: Path) -> Iterator[RunningServer]:
    """Serving the tiny model, after one translation so that the labelled histograms have samples."""
    server = RunningServer(server_config(tiny_export, max_output_tokens=16))
    server.translate(["A man is walking."])
    yield server
    server.close()


@pytest.fixture(scope="session")
def overlays() -> dict[str, list[kustomize.Manifest]]:
    return {name: kustomize.build(OVERLAYS / name) for name in OVERLAY_NAMES}


def find(manifests: list[kustomize.Manifest], kind: str, name: str | None = None) -> kustomize.Manifest:
    matches = [m for m in manifests if m["kind"] == kind and name in (None, m["metadata"]["name"])]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def mib(quantity: str) -> int:
    return int(quantity[:-2]) * QUANTITY[quantity[-2:]]


def pod_spec(manifests: list[kustomize.Manifest]) -> dict:
    return find(manifests, "Deployment", "translator")["spec"]["template"]["spec"]


def container(manifests: list[kustomize.Manifest]) -> dict:
    (only,) = pod_spec(manifests)["containers"]
    return only


def server_environment(manifests: list[kustomize.Manifest]) -> ServerConfig:
    return parse_config([], environ=find(manifests, "ConfigMap", "translator-config")["data"])


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@dataclass
class Stage:
    name: str
    base: str
    commands: list[dockerfile.Command] = field(default_factory=list)

    def all(self, instruction: str) -> list[dockerfile.Command]:
        return [c for c in self.commands if c.cmd == instruction]


def parse_dockerfile(path: Path) -> dict[str, Stage]:
    """Stages by name (FROM base AS name, else their index), read with BuildKit's own parser."""
    stages: dict[str, Stage] = {}
    for command in dockerfile.parse_file(str(path)):
        if command.cmd == "FROM":
            base, *alias = command.value
            name = alias[-1] if alias else str(len(stages))
            stages[name] = Stage(name, base)
        elif stages:
            stages[next(reversed(stages))].commands.append(command)
    return stages


@pytest.fixture(scope="session")
def dockerfile_stages() -> dict[str, Stage]:
    return parse_dockerfile(ROOT / "Dockerfile")
