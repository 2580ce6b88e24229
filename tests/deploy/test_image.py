"""The container image, built from this repository and started for real.

Builds the CPU runtime and load-generator stages with buildah (daemonless, as root) from a local
Python 3.11 base made of Debian packages (deploy/image/python-base.sh) and a local index for torch's
CPU wheel (deploy/image/torch-index.sh), so nothing needs a registry. Then, inside the runtime
image, as uid 10001 on a read-only root file system (a read-only bind mount of the image's root
with a tmpfs on /tmp, as the Kubernetes manifests run it): the server starts from /model, the
image's health check reports SERVING, a translation over gRPC on loopback equals the checkout's,
and the image holds no torch and no training checkpoint. Skipped where buildah, debootstrap or
root are missing (CI machines have none): the reason says which.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from proto import translate_pb2, translate_pb2_grpc
from testkit.sentences import own_sentences
from testkit.servers import RunningServer, server_config

ROOT = Path(__file__).resolve().parents[2]
BASE = "localhost/python:3.11-bookworm"
IMAGE, LOADGEN = "localhost/translation-service:test", "localhost/translation-service-loadgen:test"
BUILD_TIMEOUT_S = 3600

missing = [tool for tool in ("buildah", "debootstrap", "unshare", "chroot") if shutil.which(tool) is None]
pytestmark = pytest.mark.skipif(
    bool(missing) or os.geteuid() != 0,
    reason=f"the image test builds with buildah as root from a debootstrap base; missing here: "
    f"{', '.join(missing) or 'root'} (apt-get install buildah debootstrap)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*command: str, timeout: float = 600) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def image_exists(name: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", name], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Iterator[dict[str, float]]:
    """Builds both images; yields how long each build took."""
    if not image_exists(BASE):
        run(str(ROOT / "deploy/image/python-base.sh"), BASE, timeout=BUILD_TIMEOUT_S)
    port = free_port()
    index = subprocess.Popen(
        [str(ROOT / "deploy/image/torch-index.sh"), str(ROOT / "build/torch-index"), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHON": sys.executable},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600  # the first run downloads the wheels
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert index.poll() is None and time.monotonic() < deadline, "the local torch index did not start"
            time.sleep(0.5)
        args = ["--build-arg", f"PYTHON_IMAGE={BASE}", "--build-arg", f"TORCH_INDEX_URL=http://127.0.0.1:{port}/simple"]
        # The load generator's stage is the runtime's and one more: built first, afresh, its layers kept, it
        # leaves every layer of the runtime image cached, so the runtime's build takes them (the stages run
        # once: 4 minutes of 6 less on 2 cores). In that order no step mounts a cached stage (build.sh says why
        # that fails with buildah 1.28). A cached RUN that mounts the wheel is keyed by its text, not by the
        # wheel, so the layers of earlier builds go first: the runtime image must take this build's.
        subprocess.run(["buildah", "rmi", "--force", IMAGE, LOADGEN], capture_output=True)
        subprocess.run(["buildah", "rmi", "--prune"], capture_output=True)
        seconds = {}
        for name, target, cache in ((LOADGEN, "loadgen", ["--no-cache"]), (IMAGE, "runtime", [])):
            started = time.monotonic()
            run(str(ROOT / "deploy/image/build.sh"), name, target, "--layers", *cache, *args, timeout=BUILD_TIMEOUT_S)
            seconds[name] = time.monotonic() - started
        yield seconds
    finally:
        os.killpg(index.pid, signal.SIGTERM)


class Container:
    """A working container of an image, its root mounted where the host can read it."""

    def __init__(self, image: str) -> None:
        self.id = run("buildah", "from", image).strip()
        self.root = Path(run("buildah", "mount", self.id).strip())
        config = json.loads(run("buildah", "inspect", "--type", "image", image))["OCIv1"]["config"]
        self.env = dict(item.split("=", 1) for item in config.get("Env", []))
        self.cmd = config.get("Cmd", [])
        self.workdir = config.get("WorkingDir") or "/"
        self.user = config.get("User", "")

    def command(self, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """argv inside the container as its image's user, on a read-only root with /proc, /sys, /dev and a /tmp
        tmpfs, in a private mount namespace (what `podman run --read-only` would do, without a runtime)."""
        root = shlex.quote(str(self.root))
        environment = " ".join(shlex.quote(f"{k}={v}") for k, v in {**self.env, "HOME": "/tmp", **(env or {})}.items())
        # The root is made read-only first: a non-recursive bind of it onto itself would hide the mounts below.
        script = (
            f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && "
            f"mount -t proc proc {root}/proc && mount --rbind /sys {root}/sys && mount --rbind /dev {root}/dev && "
            f"mount -t tmpfs tmpfs {root}/tmp && "
            f"exec chroot --userspec={self.user or '0:0'} {root} /usr/bin/env -i {environment} "
            f'/bin/sh -c \'cd {shlex.quote(self.workdir)} && exec "$@"\' sh "$@"'
        )
        return ["unshare", "--mount", "--fork", "sh", "-c", script, "container", *argv]

    def close(self) -> None:
        subprocess.run(["buildah", "rm", self.id], capture_output=True)


def test_the_runtime_image_serves_a_translation_from_a_read_only_root(images, tmp_path: Path):
    from export.__main__ import main as export

    container = Container(IMAGE)
    try:
        assert container.user == "10001:10001"
        site = list(container.root.glob("opt/python/lib/python3*/site-packages")) or list(
            container.root.glob("usr/local/lib/python3*/site-packages")
        )
        assert site and not (site[0] / "torch").exists(), "the runtime image holds torch"
        assert not list(container.root.rglob("model.safetensors")), "the runtime image holds a training checkpoint"
        assert (container.root / "model/en-de/manifest.json").is_file()
        assert (container.root / "model/de-en/aligner.onnx").is_file()

        ports = {
            "TRANSLATE_PORT": free_port(),
            "TRANSLATE_HTTP_PORT": free_port(),
            "TRANSLATE_METRICS_PORT": free_port(),
        }
        env = {name: str(port) for name, port in ports.items()}
        started = time.monotonic()
        server = subprocess.Popen(
            container.command(container.cmd, env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            serving = None
            while time.monotonic() - started < 180 and server.poll() is None:
                check = subprocess.run(
                    container.command(["python", "/app/healthcheck.py"], env), capture_output=True, text=True
                )
                if check.returncode == 0:
                    serving = time.monotonic() - started
                    break
                time.sleep(1)
            assert serving is not None, f"not SERVING in 180 s: {check.stdout}{check.stderr}"
            assert "SERVING" in check.stdout
            sentences = own_sentences(4)
            with grpc.insecure_channel(f"127.0.0.1:{ports['TRANSLATE_PORT']}") as channel:
                stub = translate_pb2_grpc.TranslatorStub(channel)
                reply = stub.Translate(translate_pb2.TranslateRequest(texts=sentences), timeout=60)
            # The checkout's translation of the same sentences with the same default model.
            folder = tmp_path / "en-de"
            assert export(["--out", str(folder), "--int8"]) == 0
            local = RunningServer(server_config(folder))
            try:
                expected = [t.text for t in local.translate(sentences).translations]
            finally:
                local.close()
            assert [t.text for t in reply.translations] == expected
            size = run("buildah", "images", "--noheading", "--format", "{{.Size}}", IMAGE).strip()
            print(f"\nimage {IMAGE}: {size}, built in {images[IMAGE]:.0f} s; start to SERVING {serving:.1f} s")
        finally:
            # unshare forwards no signal: SIGTERM goes to its child, the server (the rest of the chain exec'd).
            for child in Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split():
                os.kill(int(child), signal.SIGTERM)
            output = server.communicate(timeout=60)[0].decode(errors="replace")
        assert server.returncode == 0, output[-2000:]
        assert "Read-only file system" not in output
    finally:
        container.close()


def test_the_load_generator_image_runs(images):
    container = Container(LOADGEN)
    try:
        result = subprocess.run(container.command(["translate-loadtest", "--help"]), capture_output=True, text=True)
        assert result.returncode == 0 and "usage: translate-loadtest" in result.stdout, result.stderr
    finally:
        container.close()
