"""What README.md and docs/*.md name exists. Each flag is in its command's ``--help`` (a flag outside a command:
in the help of the server, translate-file, translate-client or a command the page names); docs/reference.md
lists every setting of ``python -m server`` and, among the request counter's labels, every HTTP route; README.md
names every RPC of proto/translate.proto and every HTTP route; each metric named is on a live server's /metrics.
And each figure in the README has the command, the date and the CPU that produced it in its paragraph."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from proto import translate_pb2
from testkit.servers import start_server
from tests.docs.conftest import LiveServer
from tests.docs.pages import DOCS, README, ROOT, line_of

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
FLAG = re.compile(r"(?<![\w-])--[a-z][\w-]*")
SEGMENT_BREAK = re.compile(r"&&|\|\||[;|()]|<<<|\s#\s")
METRIC = re.compile(r"(?<![\w/.])(?:translate|process)_[a-z0-9_]+(?!\w|\.[a-z])")
UNITS = r"tokens/s|tok/s|req/s|MiB|GiB|KiB|MB|GB|kB|ms|%|×"
FIGURE = re.compile(rf"(?<![\w.])\d(?:[\d,.]*\d)?\s?(?:{UNITS})(?![\w/])")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
CPU = re.compile(r"\b(?:AMD|Intel|EPYC|Xeon|Ryzen|Graviton|Ampere|Neoverse|Apple M\d)\b")
TOOLS = {"du", "curl", "make", "buildah", "ls"}  # what measures a figure besides our own commands
# The console scripts (translate-file ...) and the module each runs.
CONSOLE_SCRIPTS = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1]
SCRIPTS = dict(re.findall(r'^([\w-]+) = "([\w.]+):\w+"$', CONSOLE_SCRIPTS, re.M))
SERVER = ("-m", "server")
ALWAYS = [SERVER, ("-m", "runtime.translate_file"), ("-m", "client.client")]  # a flag in prose is one of these


def numbered(path: Path) -> tuple[str, list[tuple[int, str]]]:
    """A page's prose (its fences blanked, lines kept) and its fenced lines with their line numbers, a line
    ending in a backslash joined with the line it continues onto."""
    text = path.read_text()
    fenced: list[tuple[int, str]] = []
    for fence in FENCE.finditer(text):
        first = line_of(text, fence.start(2))
        lines = fence.group(2).split("\n")
        for i, line in enumerate(lines):
            if i == 0 or not lines[i - 1].endswith("\\"):
                fenced.append((first + i, line))
            else:
                fenced[-1] = (fenced[-1][0], fenced[-1][1].removesuffix("\\") + " " + line)
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return prose, fenced


def spans(prose: str) -> list[tuple[int, str]]:
    """Inline code, one line each, with the line it starts on."""
    return [(line_of(prose, m.start()), m.group(2).replace("\n", " ")) for m in CODE_SPAN.finditer(prose)]


def command(segment: str) -> tuple[tuple[str, ...], list[str]] | None:
    """The interpreter arguments of ours that a shell segment runs (``-m server``, ``benchmarks/x.py``) and the
    words after them, or None."""
    words = [w for w in segment.split() if not re.fullmatch(r"[A-Z_]+=\S*|sudo", w)]
    first = re.sub(r"^\S*/bin/", "", words[0]) if words else ""
    if first in SCRIPTS:
        return ("-m", SCRIPTS[first]), words[1:]
    python = first in ("python", "python3")
    if python and len(words) > 2 and words[1] == "-m":
        ours = (ROOT / words[2].split(".")[0] / "__init__.py").exists()
        return (("-m", words[2]), words[3:]) if ours else None
    script, rest = (words[1], words[2:]) if python and len(words) > 1 else (first, words[1:])
    return ((script,), rest) if re.fullmatch(r"benchmarks/\w+\.py", script) else None


@functools.cache
def help_text(argv: tuple[str, ...]) -> str:
    result = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(argv)} --help: {result.stderr[-2000:]}"
    return result.stdout


def whose_flags(segment: str) -> tuple[str, ...] | None:
    """The command whose --help the segment's flags must be in, its subcommand included (``-m server.operations.keys
    new``); None for a segment that runs nothing of ours."""
    found = command(segment)
    if found is None:
        return None
    argv, rest = found
    choices = re.search(r"\{([\w,-]+)\}", help_text(argv).split("\n\n")[0])
    if choices and rest and rest[0] in choices.group(1).split(","):
        return (*argv, rest[0])
    return argv


def known(argv: tuple[str, ...]) -> set[str]:
    return set(FLAG.findall(help_text(argv)))


def exists(flag: str, flags: set[str]) -> bool:
    """A boolean setting also takes --no-NAME (common/flags.py), which --help leaves out."""
    return flag in flags or (flag.startswith("--no-") and f"--{flag[5:]}" in flags)


def flagged_segments(path: Path) -> list[tuple[int, str, list[str]]]:
    """Every shell segment of the page's inline code and fenced lines that names flags, with its line."""
    prose, fenced = numbered(path)
    found = []
    for line, text in spans(prose) + fenced:
        synopsis = re.sub(r"\[[^\]]*\]", lambda m: m.group().replace("|", "/"), text)  # [--variant fp32|int8]
        for segment in SEGMENT_BREAK.split(synopsis):
            if FLAG.search(segment):
                found.append((line, segment.strip(), FLAG.findall(segment)))
    bare = CODE_SPAN.sub(lambda m: " " * len(m.group()), prose)
    return found + [(line_of(bare, m.start()), m.group(), [m.group()]) for m in FLAG.finditer(bare)]


def flag_problems(path: Path) -> list[str]:
    """Each flag the page names that its command lacks; a flag outside a command, that every command the page
    names (and the server, translate-file and translate-client) lacks."""
    named = [(line, segment, flags, whose_flags(segment)) for line, segment, flags in flagged_segments(path)]
    anywhere = set().union(*(known(argv) for argv in ALWAYS), *(known(argv) for *_, argv in named if argv))
    problems = []
    for line, segment, flags, argv in sorted(named, key=lambda item: item[0]):
        if argv is not None:
            problems += [
                f"{path.name}:{line}: {flag} is not in `{' '.join(argv)} --help`"
                for flag in flags
                if not exists(flag, known(argv))
            ]
        elif segment.startswith("--"):
            problems += [
                f"{path.name}:{line}: {flag} is no command's flag" for flag in flags if not exists(flag, anywhere)
            ]
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_named_exists(path: Path):
    problems = flag_problems(path)
    assert not problems, "\n".join(problems)


def reference_settings() -> list[tuple[int, str]]:
    """The flags of docs/reference.md's configuration table, with their lines."""
    text = (ROOT / "docs" / "reference.md").read_text()
    rows = [(i + 1, row) for i, row in enumerate(text.splitlines()) if row.startswith("| `--")]
    return [(line, flag) for line, row in rows for flag in FLAG.findall(row.split("|")[1])]


def test_the_reference_names_every_server_setting_and_only_them():
    flags = known(SERVER) - {"--help"}
    documented = reference_settings()
    not_flags = [f"reference.md:{line}: {flag}" for line, flag in documented if not exists(flag, flags)]
    missing = sorted(flags - {flag for _, flag in documented})
    assert not not_flags and not missing, f"no flags of python -m server: {not_flags}; not documented: {missing}"


@pytest.fixture(scope="module")
def served_routes(tiny_export: Path) -> set[str]:
    """The paths of every HTTP route the server registers, a trailing ``/{name}`` dropped (``/glossaries/ID``
    is ``/glossaries``)."""
    running = start_server(tiny_export)
    try:
        routes = running.server.http_runner.app.router.routes()
        return {re.sub(r"/\{\w+\}$", "", route.resource.canonical) for route in routes}
    finally:
        running.close()


def test_the_request_counter_names_every_http_route(served_routes: set[str]):
    row = next(r for r in (ROOT / "docs" / "reference.md").read_text().splitlines() if "translate_requests_total{" in r)
    documented = set(re.findall(r"`HTTP (/[^`]*)`", row))
    assert documented == served_routes, (
        f"documented, not served: {documented - served_routes}; served: {served_routes - documented}"
    )


def named_as_route(path: str, text: str) -> bool:
    """Whether the text names the path as a route: after a backtick, a method or a port (``/`` alone is in
    many a sentence), and not as the start of a longer name (``/translate`` in ``/translate_file``)."""
    return re.search(rf"(?:`|\b(?:GET|POST|DELETE)\s|:\d+){re.escape(path)}(?!\w)", text) is not None


def test_the_readme_names_every_rpc_and_http_route(served_routes: set[str]):
    text = README.read_text()
    rpcs = [method.name for service in translate_pb2.DESCRIPTOR.services_by_name.values() for method in service.methods]
    missing = [f"rpc {name}" for name in rpcs if not re.search(rf"`{name}\b", text)]
    missing += [f"HTTP {path}" for path in sorted(served_routes) if not named_as_route(path, text)]
    assert len(rpcs) > 5 and len(served_routes) > 5 and not missing, f"README.md does not name: {missing}"


def exposed(server: LiveServer) -> set[str]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    names = set(re.findall(r"^# (?:HELP|TYPE) (\w+)", text, re.M)) | set(re.findall(r"^(\w+)[{ ]", text, re.M))
    return names | {re.sub(r"_(total|bucket|count|sum|created|info)$", "", name) for name in names}


def metrics_named() -> list[tuple[str, str]]:
    """Each metric name the pages use, with where."""
    named = []
    for path in DOCS:
        text = path.read_text()
        named += [(f"{path.name}:{line_of(text, m.start())}", m.group()) for m in METRIC.finditer(text)]
    return named


def test_every_metric_named_is_on_a_live_server(live_server: LiveServer):
    names = exposed(live_server)
    named = metrics_named()
    missing = [f"{where}: {name}" for where, name in named if name not in names]
    assert len(named) > 30 and not missing, "\n".join(missing)


def paragraphs(prose: str) -> list[tuple[int, str, str]]:
    """The README's blocks of prose: each with its first line and what it may name its sources in (a table:
    the paragraph above it too, which describes it)."""
    found, line, caption = [], 1, ""
    for piece in re.split(r"(\n(?:[ \t]*\n)+)", prose):
        if piece.strip() and not piece.startswith("#"):
            table = piece.startswith("|")
            found.append((line, piece, caption + piece if table else piece))
            caption = "" if table else piece
        elif piece.startswith("#"):
            caption = ""
        line += piece.count("\n")
    return found


def has_command(paragraph: str) -> bool:
    return any(command(span) is not None or span.split()[0] in TOOLS for _, span in spans(paragraph) if span.split())


def test_every_figure_in_the_readme_names_its_command_date_and_cpu():
    prose, _ = numbered(README)
    unsourced = []
    for line, piece, context in paragraphs(prose):
        sources = {"command": has_command(context), "date": DATE.search(context), "CPU": CPU.search(context)}
        lacks = ", ".join(what for what, there in sources.items() if not there)
        for figure in FIGURE.finditer(piece) if lacks else ():
            where = line + piece.count("\n", 0, figure.start())
            unsourced.append(f"README.md:{where}: {figure.group()} without its {lacks}")
    assert not unsourced, "\n".join(unsourced)
