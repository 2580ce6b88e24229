"""The manifest of an exported model folder, and its verification on load.

Only numpy-free standard library here: the server reads manifests too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

MANIFEST_FILE = "manifest.json"
MANIFEST_REVISION = 1
Variant = Literal["fp32", "int8", "fp16"]  # an exported folder's variants (export/pipeline.py's VARIANTS)
# The variant an engine loads: one of them, or auto: the one the provider runs best that the folder has
# (runtime/backend.py, chosen_variant).
VariantChoice = Literal["auto", "fp32", "int8", "fp16"]
Provider = Literal["auto", "cpu", "cuda"]  # where a variant runs (auto: CUDA where ONNX Runtime has it)


class ModelFolderError(RuntimeError):
    """An exported model folder that cannot be served; the message names the file."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path, manifest: dict[str, Any]) -> Path:
    """Record every file's sha256 (all files but the manifest itself) and write manifest.json."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST_FILE)
    manifest = {"manifest_revision": MANIFEST_REVISION, **manifest, "files": {p.name: sha256(p) for p in files}}
    path = folder / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def read_manifest(folder: str | Path, verify: bool = True) -> dict[str, Any]:
    """The manifest of folder; with verify, every listed file must exist with its recorded sha256."""
    folder = Path(folder)
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise ModelFolderError(
            f"{path} is missing: not an exported model folder (run `python -m export --out {folder}`)"
        )
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelFolderError(f"{path} is not valid JSON: {e}") from e
    if manifest.get("manifest_revision") != MANIFEST_REVISION:
        raise ModelFolderError(
            f"{path} has manifest_revision {manifest.get('manifest_revision')}, expected {MANIFEST_REVISION}"
        )
    if verify:
        for name, expected in manifest["files"].items():
            file = folder / name
            if not file.is_file():
                raise ModelFolderError(f"{file} is listed in the manifest but missing")
            if sha256(file) != expected:
                raise ModelFolderError(f"{file} does not match its sha256 in the manifest (truncated or modified?)")
    return manifest
