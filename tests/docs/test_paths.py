"""Every path of this repository that README.md and docs/*.md name exists: a file, a folder, a glob that matches
one, or a module (``runtime.search``, and the name after it: ``runtime.engine.Engine``). And where a table lists
a package's modules by their bare names (README's Repository table, docs/architecture.md's), each is in that
package."""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
import subprocess
from pathlib import Path

import pytest

from tests.docs.pages import DOCS, ROOT, line_of

# A path is the repository's when it starts with one of these (../shared/... does not: a slash comes first).
FOLDERS = (
    "benchmarks",
    "client",
    "common",
    "deploy",
    "docs",
    "export",
    "model",
    "proto",
    "runtime",
    "server",
    "testkit",
    "tests",
    ".ci",
)
FILES = ("Dockerfile", "Makefile", "README.md", "docker-compose.yml", "pyproject.toml")
# What the docs' commands write (gitignored folders, or wherever the user says): no checkout has these, so they
# are deliberately outside FOLDERS and never checked.
WRITTEN_AT_RUN_TIME = ("exported/default", "runs/en-fr", "checkpoints/opus-mt-en-fr", "models/opus-mt-en-fr", "build/")
TOP = "|".join(re.escape(name) for name in FOLDERS)
PATH = re.compile(rf"(?<![\w.~/$-])(?:{TOP})/[\w.*?/-]*")
FILE = re.compile(rf"(?<![\w./-])(?:{'|'.join(re.escape(name) for name in FILES)})(?![\w-]|\.\w)")
PACKAGES = "|".join(name for name in FOLDERS if (ROOT / name / "__init__.py").exists())
# A module's name is lower case, what it defines need not be: client.Translate(...) in a Go example is a call.
MODULE = re.compile(rf"(?<![\w./-])(?:{PACKAGES})\.[a-z_]\w*(?:\.[A-Za-z_]\w*)*")
FILE_NAME = re.compile(r"\.(?:py|md|json|onnx|safetensors|model|proto|ya?ml|toml)$")  # model.safetensors
BARE_NAME = re.compile(r"(?:[\w-]+/)*[\w-]+\.[a-z]+|[\w-]+/")  # search.py, cache_ops/, doors/http.py: in a package
PACKAGE = re.compile(r"`([\w-]+)/`")
CODE = re.compile(r"`([^`]+)`")
BLOCK = re.compile(r"(?:^[^\n]*\S[^\n]*(?:\n|$))+", re.M)  # lines between blank lines
RULE = re.compile(r"\|?[\s:|-]+")  # a table's |---|---|


@functools.cache
def repository_paths() -> frozenset[str]:
    """The checkout's files as git sees them (tracked, or new and not ignored) and their folders: a generated
    file that is ignored (proto's stubs, caches) exists here but not in a fresh clone."""
    listed = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]
    names = subprocess.run(listed, cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
    files = [name for name in names if (ROOT / name).exists()]
    return frozenset(files) | {str(folder) for name in files for folder in Path(name).parents if str(folder) != "."}


def path_exists(path: str) -> bool:
    path = path.rstrip(".").rstrip("/")  # a sentence's full stop; a folder's slash
    if any(c in path for c in "*?"):
        return bool(fnmatch.filter(repository_paths(), path))
    return path in repository_paths()


@functools.cache
def defined(source: Path) -> frozenset[str]:
    """The names a module defines or imports at its top level."""
    names = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return frozenset(names)


def module_exists(dotted: str) -> bool:
    """The longest module the dotted name starts with is in the repository, and the part after it, if any, is a
    module-level name there (``runtime.engine.Engine``; what follows that is not checked)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        folder = "/".join(parts[:end])
        source = f"{folder}/__init__.py" if f"{folder}/__init__.py" in repository_paths() else f"{folder}.py"
        if source in repository_paths():
            return end == len(parts) or parts[end] in defined(ROOT / source)
    return False


def missing_paths(page: Path) -> list[str]:
    """Each repository path, top-level file and module the page names that does not exist, with its line."""
    text = page.read_text()
    named = [*PATH.finditer(text), *FILE.finditer(text)]
    missing = [m for m in named if not path_exists(m.group())]
    modules = (m for m in MODULE.finditer(text) if not FILE_NAME.search(m.group()))
    missing += [m for m in modules if not module_exists(m.group())]
    return [f"{page.name}:{line_of(text, m.start())}: {m.group()}" for m in sorted(missing, key=lambda m: m.start())]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(page: Path):
    missing = missing_paths(page)
    assert not missing, "no such path or module:\n" + "\n".join(missing)


def test_a_path_is_the_repositorys_by_its_first_folder():
    outside = ["../shared/data/multi30k/", "https://github.com/grpc/grpc/tree/master/examples/python", "~/models/x"]
    named = [m.group() for m in PATH.finditer(" ".join(["`runtime/search.py`", "benchmarks/*.md", *outside]))]
    assert named == ["runtime/search.py", "benchmarks/*.md"]
    assert not any(PATH.search(path) for path in WRITTEN_AT_RUN_TIME)
    assert path_exists("benchmarks/*.md") and not path_exists("benchmarks/*.nothing")


def test_the_folders_checked_are_the_repositorys():
    """A new top-level folder is checked from its first commit (a removed one is caught by its named paths)."""
    folders = {name.split("/")[0] for name in repository_paths() if "/" in name}
    assert folders == set(FOLDERS), f"not checked: {folders - set(FOLDERS)}; gone: {set(FOLDERS) - folders}"


def tables(text: str) -> list[tuple[str, list[tuple[int, list[str]]]]]:
    """Each Markdown table of a page: the paragraph above it, and its rows (header first, the rule left out) as
    cells, with their lines."""
    found, above = [], ""
    for block in BLOCK.finditer(text):
        lines = block.group().splitlines()
        if not lines[0].startswith("|"):
            above = block.group()
            continue
        first = line_of(text, block.start())
        rows = [
            (first + i, row.strip().strip("|").split("|")) for i, row in enumerate(lines) if not RULE.fullmatch(row)
        ]
        found.append((above, rows))
    return found


def listed_modules(page: Path) -> list[tuple[int, str, str]]:
    """The bare module names (``search.py``, ``cache_ops/``) a table lists for a package, with their lines: in a
    row whose first cell is the package (``| `runtime/` | ...``), or in a table of modules (``| module |``)
    under a paragraph that names it (``Inside `runtime/`, ...``). Only the first two cells: the names and what
    they are (docs/architecture.md's third names the modules a package may import)."""
    listed = []
    for above, ((_, header), *body) in tables(page.read_text()):
        named = PACKAGE.findall(above)
        table_package = named[-1] if header[0].strip() == "module" and named else None
        for number, cells in body:
            row_package = PACKAGE.fullmatch(cells[0].strip())
            package = row_package.group(1) if row_package else table_package
            names = CODE.findall("|".join(cells[1:2] if row_package else cells[:2]))
            inside = [
                name for name in names if BARE_NAME.fullmatch(name) and not PATH.fullmatch(name)
            ]  # not runtime/x.py
            listed += [(number, package, name) for name in inside if package]
    return listed


def test_each_module_a_table_lists_is_in_its_package():
    listed = {page.name: listed_modules(page) for page in DOCS}
    packages = {name: {package for _, package, _ in modules} for name, modules in listed.items()}
    assert {"model", "export", "proto", "runtime", "server", "client", "common", "testkit"} <= packages["README.md"]
    assert "runtime" in packages["architecture.md"]  # the tables are read, so the check below can find something
    missing = [
        f"{page}:{number}: {name} is not in {package}/"
        for page, modules in listed.items()
        for number, package, name in modules
        if not path_exists(f"{package}/{name}")
    ]
    assert not missing, "\n".join(missing)
