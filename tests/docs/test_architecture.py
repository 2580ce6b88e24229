"""docs/architecture.md's import table holds: each package imports only the packages of ours its row names,
and neither the engine nor the server imports torch (nor the server ONNX Runtime itself)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"proto", "runtime", "model", "export", "server"}
ALLOWED = {  # docs/architecture.md, "may import (ours)"
    "proto": {"proto"},
    "runtime": {"runtime", "model.config", "model.flags"},
    "model": {"model", "runtime"},
    "export": {"export", "model", "runtime"},
    "server": {"server", "runtime", "proto", "model.flags", "model.corpus"},
}
FORBIDDEN = {"runtime": {"torch"}, "server": {"torch", "onnxruntime"}}


def imports(path: Path) -> set[str]:
    """Every name a file imports, dotted in full: ``from model import flags`` gives model.flags, ``from
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
                # ``from model import flags`` names model too: allowed when the module it takes is
                if name in {"model"} and any(
                    allowed(n, ALLOWED[package]) for n in imports(path) if n.startswith("model.")
                ):
                    continue
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
            if top in FORBIDDEN.get(package, set()):
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "\n".join(wrong)
