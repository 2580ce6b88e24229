"""The engine's package stands on its own: importing every module of runtime/ brings in neither torch nor the
server, and the graph builders (export/) and the PyTorch model (model/) stay out of it."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import runtime
from tests.conftest import ROOT

# What runtime/ may take from the other packages: the flags helper. The model's config lives in runtime/ so
# that model/ imports runtime/ and never the other way round.
ALLOWED_OUTSIDE = {"common.flags"}


def test_runtime_imports_no_torch_and_no_server():
    modules = sorted(f"runtime.{m.name}" for m in pkgutil.iter_modules(runtime.__path__))
    assert {"runtime.search", "runtime.backend", "runtime.engine", "runtime.translate_file"} <= set(modules)
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert "torch" not in loaded
    ours = {m for m in loaded if m.split(".")[0] in {"model", "export", "server", "proto"}}
    assert ours <= ALLOWED_OUTSIDE, f"runtime/ imports {sorted(ours - ALLOWED_OUTSIDE)}"
