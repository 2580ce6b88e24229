"""docs/architecture.md's import table holds: each package imports only the packages of ours its row names,
and neither the engine nor the server imports torch (nor the server ONNX Runtime itself)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"proto", "common", "runtime", "model", "export", "server", "client", "testkit"}
ALLOWED = {  # docs/architecture.md, "may import (ours)"
    "proto": {"proto"},
    "common": {"common"},
    "runtime": {"runtime", "common"},
    "model": {"model", "runtime", "common"},
    "export": {"export", "model", "runtime", "common"},
    "server": {"server", "runtime", "proto", "common"},
    "client": {
        "client",
        "proto",
        "common",
        "runtime.cpu",
        "server.operations.access",
        "server.config",
        "server.errors",
        "server.operations.keys",
        "server.operations.metrics",
    },
    "testkit": {"testkit", "server", "client", "runtime", "proto", "common"},
}
FORBIDDEN = {
    "common": {"torch", "onnxruntime"},
    "runtime": {"torch"},
    "server": {"torch", "onnxruntime"},
    "client": {"torch", "onnxruntime"},
}


def imports(path: Path) -> set[str]:
    """Every name a file imports, dotted in full: ``from common import flags`` gives common.flags, ``from
    runtime.search import Hypothesis`` runtime.search.Hypothesis."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def allowed(name: str, rules: set[str]) -> bool:
    return any(name == rule or name.startswith(rule + ".") for rule in rules)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_what_the_architecture_allows(package: str):
    assert (ROOT / "docs" / "architecture.md").read_text().count(f"| `{package}/` |") == 1
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in imports(path):
            top = name.split(".")[0]
            if top in OURS and not allowed(name, ALLOWED[package]):
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
            if top in FORBIDDEN.get(package, set()):
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "\n".join(wrong)


SERVER_FOLDERS = {  # docs/architecture.md, "Inside server/": each folder of the server, and what it never imports
    "doors": set(),
    "documents": {"server.doors", "server.scheduling", "server.operations"},
    "scheduling": {"server.doors", "server.documents"},
    "operations": {"server.doors", "server.documents", "server.scheduling"},
}


@pytest.mark.parametrize("folder", sorted(SERVER_FOLDERS))
def test_each_folder_of_the_server_says_its_idea_and_imports_in_its_direction(folder: str):
    package = ROOT / "server" / folder
    assert ast.get_docstring(ast.parse((package / "__init__.py").read_text())), f"server/{folder}/__init__.py"
    assert (ROOT / "docs" / "architecture.md").read_text().count(f"| `server/{folder}/` |") == 1
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(package.rglob("*.py"))
        for name in imports(path)
        if allowed(name, SERVER_FOLDERS[folder])
    ]
    assert not wrong, "\n".join(wrong)


def test_every_module_of_the_server_is_in_a_folder_or_shared_at_its_top():
    """The top of server/ holds only what every part shares and the assembly: a new module goes in a folder."""
    top = {path.stem for path in (ROOT / "server").glob("*.py")}
    shared = "__init__ __main__ answers app cache config errors interface models options sentences translations"
    assert top == set(shared.split())
    folders = {path.name for path in (ROOT / "server").iterdir() if (path / "__init__.py").is_file()}
    assert folders == set(SERVER_FOLDERS)


MOST_LINES = 350  # the house's bound on a module of the engine and the server: one idea a module


@pytest.mark.parametrize("package", ["runtime", "server"])
def test_no_module_of_the_engine_or_the_server_is_over_the_houses_size(package: str):
    sizes = {path: len(path.read_text().splitlines()) for path in sorted((ROOT / package).rglob("*.py"))}
    over = [f"{path.relative_to(ROOT)}: {lines} lines" for path, lines in sizes.items() if lines > MOST_LINES]
    assert not over, "split by idea: " + ", ".join(over)


def test_neither_front_door_imports_the_other():
    """Both front doors take what they share from modules of its own (options, models, request reading): the HTTP
    API never imports the gRPC service, nor the service the HTTP API."""
    crossing = {
        "server/doors/http.py": "server.doors.service",
        "server/doors/http_request.py": "server.doors.service",
        "server/doors/http_glossaries.py": "server.doors.service",
        "server/doors/service.py": "server.doors.http",
    }
    wrong = [
        f"{path} imports {name}"
        for path, door in crossing.items()
        for name in imports(ROOT / path)
        if name == door or name.startswith(door + ".") or name.startswith(door + "_")
    ]
    assert not wrong, "\n".join(wrong)
