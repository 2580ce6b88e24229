"""The default variants the pages state are the code's: the server's (``ServerConfig.engine``'s default, and what
``auto`` loads on each provider, ``runtime.backend.AUTO_VARIANTS``) and translate-file's
(``FileTranslation.engine``'s default), read from the dataclasses rather than a running server."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from runtime.backend import AUTO_VARIANTS
from runtime.options import EngineSettings
from runtime.translate_file import FileTranslation
from server.config import ServerConfig
from tests.docs.pages import README, ROOT

SERVING = ROOT / "docs" / "serving.md"
# Where each page states them: the server's default and what auto picks on the CPU and on CUDA; translate-file's.
STATEMENTS = {
    README: (
        r"`--variant`\s+\(default\s+`(\w+)`:\s+(\w+)\s+on\s+the\s+CPU\s+and\s+(\w+)\s+on\s+CUDA",
        r"translate-file --model [^`]*`\s+decodes\s+the\s+`(\w+)`\s+variant\s+by\s+default",
    ),
    SERVING: (
        r"\(`--variant\s+(\w+)`:\s+(\w+)\s+on\s+the\s+CPU,\s+(\w+)\s+on\s+CUDA",
        r"`translate-file`\s+keeps\s+(\w+)",
    ),
}


def default_engine(config: type) -> EngineSettings:
    """The engine settings a config dataclass gets where none are given."""
    engine = next(field for field in dataclasses.fields(config) if field.name == "engine")
    return engine.default_factory()


def stated(path: Path, pattern: str) -> tuple[str, ...]:
    found = re.search(pattern, path.read_text())
    assert found, f"{path.name} no longer states a default variant as /{pattern}/: update STATEMENTS with it"
    return found.groups()


@pytest.mark.parametrize("path", STATEMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_servers_default_variant_is_the_one_stated(path: Path):
    server = (default_engine(ServerConfig).variant, AUTO_VARIANTS["cpu"][0], AUTO_VARIANTS["cuda"][0])
    assert stated(path, STATEMENTS[path][0]) == server


@pytest.mark.parametrize("path", STATEMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_translate_files_default_variant_is_the_one_stated(path: Path):
    assert stated(path, STATEMENTS[path][1]) == (default_engine(FileTranslation).variant,)
