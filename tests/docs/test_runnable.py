"""The README's blocks marked ``<!-- runnable -->`` run as written against a live server of this checkout: each
command exits 0 and prints what the ``# `` lines under it show, where ``...`` stands for any text.

Only what is the test's own changes: ``127.0.0.1:5000``, ``:50051`` and ``:9464`` become the live server's
ports (in the commands and in what they print), ``translate-client`` without ``--target`` is pointed at its
gRPC port, and ``.venv/bin/`` is the environment running the tests."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.conftest import LiveServer

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = re.compile(r"^<!-- runnable -->$", re.M)
RUNNABLE = re.compile(r"^<!-- runnable -->\n```(?:bash|sh)\n(.*?)^```$", re.M | re.S)
BIN = Path(sys.executable).parent
README_PORTS = ("5000", "50051", "9464")


@dataclass(frozen=True)
class Command:
    line: int  # where it starts in the README
    text: str
    output: tuple[str, ...]  # the lines the README shows under it (none: only its exit status is checked)


def runnable_commands(text: str) -> list[Command]:
    commands: list[Command] = []
    for block in RUNNABLE.finditer(text):
        line = text.count("\n", 0, block.start(1)) + 1
        lines = block.group(1).splitlines()
        i = 0
        while i < len(lines):
            if lines[i].startswith("#"):
                last = commands[-1]
                commands[-1] = Command(last.line, last.text, (*last.output, lines[i].removeprefix("#").strip()))
                i += 1
                continue
            start = i
            while lines[i].endswith("\\"):
                i += 1
            commands.append(Command(line + start, "\n".join(lines[start : i + 1]), ()))
            i += 1
    return commands


def with_live_ports(text: str, server: LiveServer) -> str:
    ports = dict(zip(README_PORTS, (server.http_port, server.grpc_port, server.metrics_port), strict=True))
    return re.sub(r"127\.0\.0\.1:(5000|50051|9464)\b", lambda m: f"127.0.0.1:{ports[m.group(1)]}", text)


def as_run_here(command: str, server: LiveServer) -> str:
    command = re.sub(r"(?<![\w/.])\.venv/bin/", f"{BIN}/", with_live_ports(command, server))
    if "--target" not in command:
        command = re.sub(r"\btranslate-client\b", f"translate-client --target 127.0.0.1:{server.grpc_port}", command)
    return command


# A number the README shows with more than two decimals (a confidence, a log-probability) matches on its first two:
# the digits after them depend on the CPU's float kernels (AVX2 or AVX-512), not on what the command does.
PRECISE = re.compile(r"(-?\d+\.\d{2})\d+")


def _exact(part: str) -> str:
    pieces = PRECISE.split(part)  # text, a number's first two decimals, text, ...
    return "".join(re.escape(p) + (r"\d*" if i % 2 else "") for i, p in enumerate(pieces))


def shown(output: tuple[str, ...], server: LiveServer) -> re.Pattern[str]:
    """What the README shows as a pattern: its text exactly (numbers to two decimals), ``...`` any text."""
    parts = with_live_ports("\n".join(output), server).split("...")
    return re.compile(".*?".join(_exact(part) for part in parts), re.S)


def test_shown_numbers_match_to_two_decimals():
    pattern = shown(('{"confidence": -0.0465, "text": "Ein Mann."}',), LiveServer(50051, 5000, 9464))
    assert pattern.fullmatch('{"confidence": -0.0471, "text": "Ein Mann."}')
    assert not pattern.fullmatch('{"confidence": -0.0565, "text": "Ein Mann."}')
    assert not pattern.fullmatch('{"confidence": -0.0465, "text": "Eine Frau."}')


COMMANDS = runnable_commands(README.read_text())


def test_every_marker_marks_a_shell_block():
    text = README.read_text()
    markers, blocks = len(MARKER.findall(text)), len(RUNNABLE.findall(text))
    assert markers == blocks >= 3, f"{markers} markers, {blocks} blocks: a marker goes right above ```bash"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """One folder for every command, in the README's order: a block's later commands see its earlier files."""
    return tmp_path_factory.mktemp("readme")


@pytest.mark.parametrize("command", COMMANDS, ids=[f"README.md:{c.line}" for c in COMMANDS])
def test_the_command_runs_as_written(command: Command, live_server: LiveServer, workdir: Path):
    run = as_run_here(command.text, live_server)
    result = subprocess.run(["bash", "-c", run], cwd=workdir, capture_output=True, text=True, timeout=120)
    where = f"README.md:{command.line}: {command.text}"
    assert result.returncode == 0, f"{where}\nexit {result.returncode}\n{result.stdout}{result.stderr}"
    if command.output:
        matches = shown(command.output, live_server).fullmatch(result.stdout.strip("\n")) is not None
        assert matches, f"{where}\nshows {command.output}\nprints {result.stdout}"
