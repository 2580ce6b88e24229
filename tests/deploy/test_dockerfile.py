"""The Dockerfile: runtime images carry the serving dependencies only (no torch), run as the
non-root user Kubernetes expects, and check health through the gRPC health service."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest
import tomllib

from runtime.providers import FIRST_CUDA_13_ONNXRUNTIME
from server.app import SERVICE_NAME
from server.config import parse_config
from tests.deploy.conftest import ROOT, Stage

RUNTIME_STAGES = ["runtime", "runtime-cuda", "loadgen"]
HEALTHCHECK = ROOT / "deploy" / "docker" / "healthcheck.py"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The `train` extra's distributions, by the module each installs.
TRAINING_MODULES = sorted(
    re.match(r"[\w.-]+", r).group().replace("-", "_") for r in PROJECT["optional-dependencies"]["train"]
)


def lineage(stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and the stages of this file it is built FROM, nearest first."""
    chain = [stages[name]]
    while chain[-1].base in stages:
        chain.append(stages[chain[-1].base])
    return chain


@pytest.mark.parametrize("stage", RUNTIME_STAGES)
def test_runtime_stages_install_no_torch(dockerfile_stages, stage):
    chain = lineage(dockerfile_stages, stage)
    assert chain[-1].base.startswith("${"), "runtime images start from a clean base, not the build stage"
    for command in (c for step in chain for c in step.commands):
        if command.cmd == "RUN":
            assert "torch" not in command.value[0] and "[train" not in command.value[0], command.original
        sources = {stage for flag in command.flags for stage in re.findall(r"(?:^--|,)from=([\w-]+)", flag)}
        assert sources <= {"export", "export-cuda", "wheel"}, f"only the model and the wheel: {command.original}"
    assert "torch" not in " ".join(PROJECT["dependencies"])


def test_plain_build_gives_the_cpu_server(dockerfile_stages):
    last = list(dockerfile_stages.values())[-1]
    assert (last.base, last.commands) == ("runtime", [])


def test_the_wheel_leaves_the_training_checkpoint_out(dockerfile_stages):
    (command,) = dockerfile_stages["wheel"].all("RUN")
    assert command.value[0].startswith("rm -rf model/default ")


@pytest.mark.parametrize(("stage", "export"), [("runtime", "export"), ("runtime-cuda", "export-cuda")])
def test_runtime_serves_the_exported_model_as_uid_10001(dockerfile_stages, stage, export):
    image = dockerfile_stages[stage]
    assert [c.value for c in image.all("USER")] == [("10001:10001",)]
    serve = ("python", "-m", "server", "--model", "/model/en-de", "--model", "/model/de-en")
    assert [c.value for c in image.all("CMD")] == [serve]
    assert [(c.flags, c.value) for c in image.all("COPY") if c.flags] == [((f"--from={export}",), ("/model", "/model"))]
    (install,) = [c.value[0] for c in image.all("RUN") if "/tmp/wheels/*.whl)[files]" in c.value[0]]
    assert install.endswith("python -m proto"), "stubs are generated at build time"  # and files translate


def test_cuda_image_serves_fp16_on_cuda(dockerfile_stages):
    (export,) = dockerfile_stages["export-cuda"].all("RUN")
    assert "--fp16" in export.value[0]
    environment = {}
    for env in dockerfile_stages["runtime-cuda"].all("ENV"):
        environment.update(zip(env.value[::2], env.value[1::2], strict=True))
    config = parse_config([], environ={k: v for k, v in environment.items() if k.startswith("TRANSLATE_")})
    assert (config.engine.provider, config.engine.variant) == ("cuda", "fp16")


def test_the_cuda_image_installs_an_onnxruntime_built_for_its_cuda():
    """A CUDA 13 onnxruntime-gpu on a CUDA 12 base cannot load its CUDA provider, and ONNX Runtime then serves
    on the CPU: the image's pin must match its base's CUDA major version. The first onnxruntime-gpu on PyPI built
    for CUDA 13 (1.26.0 requires nvidia-cuda-runtime-cu12, 1.27.0 nvidia-cuda-runtime-cu13) is the one
    runtime/providers.py's advice names."""
    from packaging.specifiers import SpecifierSet

    text = (ROOT / "Dockerfile").read_text()
    cuda = int(re.search(r"^ARG CUDA_IMAGE=docker\.io/nvidia/cuda:(\d+)\.", text, re.M).group(1))
    (pin,) = re.findall(r"'onnxruntime-gpu([^']*)'", text)
    allowed = SpecifierSet(pin)
    last_cuda_12 = "1.26.0"
    assert cuda in (12, 13), f"no onnxruntime-gpu on PyPI for CUDA {cuda}"
    if cuda == 12:
        assert last_cuda_12 in allowed and FIRST_CUDA_13_ONNXRUNTIME not in allowed, pin
    else:
        assert FIRST_CUDA_13_ONNXRUNTIME in allowed and last_cuda_12 not in allowed, pin


def test_context_leaves_out_environments_and_outputs():
    ignored = set((ROOT / ".dockerignore").read_text().splitlines())
    assert {".git", ".venv", "runs", "exported"} <= ignored


def import_without_training_deps(module: str) -> subprocess.CompletedProcess:
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in TRAINING_MODULES)
    code = f"import sys; {blocked}; import {module}"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_server_imports_without_the_training_dependencies():
    result = import_without_training_deps("server.__main__, server.app")
    assert result.returncode == 0, result.stderr


def test_load_generator_imports_without_the_training_dependencies():
    result = import_without_training_deps("client.loadtest")
    assert result.returncode == 0, result.stderr


def run_healthcheck(port: int, *args: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "TRANSLATE_PORT": str(port), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), *args], env=environment, capture_output=True, text=True, timeout=60
    )


def test_healthcheck_script_is_the_images(dockerfile_stages):
    for stage in ("runtime", "runtime-cuda"):
        copies = [c.value for c in dockerfile_stages[stage].all("COPY")]
        assert (str(HEALTHCHECK.relative_to(ROOT)), "/app/healthcheck.py") in copies
        (check,) = dockerfile_stages[stage].all("HEALTHCHECK")
        assert check.value == ("CMD", "python", "/app/healthcheck.py")


@pytest.mark.parametrize(("args", "reported"), [([], SERVICE_NAME), ([""], "(server)")])
def test_healthcheck_passes_on_a_serving_server(live_server, args, reported):
    result = run_healthcheck(live_server.server.port, *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{reported}: SERVING"


def test_healthcheck_fails_without_a_server():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    result = run_healthcheck(port)
    assert result.returncode == 1
    assert "UNAVAILABLE" in result.stderr
