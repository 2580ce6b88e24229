"""An exported folder's manifest (runtime/manifest.py): written with every file's sha256, read back as written,
and verified on load: a folder that is not an export, a manifest of another revision, and a file that was
modified or removed are refused with a message that names the file."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from runtime.backend import OrtBackend
from runtime.manifest import MANIFEST_FILE, MANIFEST_REVISION, ModelFolderError, read_manifest, write_manifest


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Two files and their manifest: one small, one of several of sha256's read blocks."""
    (tmp_path / "small.txt").write_text("a small file\n")
    (tmp_path / "large.bin").write_bytes(bytes(range(256)) * (3 << 12) + b"tail")  # 3 MiB and 4 bytes
    write_manifest(tmp_path, {"name": "test", "variants": {"fp32": {}}})
    return tmp_path


def test_a_manifest_records_every_files_sha256_and_reads_back_as_written(folder: Path):
    manifest = read_manifest(folder)
    files = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in ("large.bin", "small.txt")}
    written = {"name": "test", "variants": {"fp32": {}}}
    assert manifest == {"manifest_revision": MANIFEST_REVISION, **written, "files": files}
    assert json.loads((folder / MANIFEST_FILE).read_text()) == manifest
    assert list(manifest["files"]) == sorted(files)  # the manifest itself is not listed


def test_a_folder_that_is_not_an_export_is_refused_with_what_to_run(tmp_path: Path):
    with pytest.raises(ModelFolderError, match=r"manifest.json is missing: not an exported model folder \(run `python"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ModelFolderError, match="manifest.json is not valid JSON"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"manifest_revision": MANIFEST_REVISION + 1, "files": {}}))
    with pytest.raises(ModelFolderError, match=f"has manifest_revision {MANIFEST_REVISION + 1}, expected 1"):
        read_manifest(tmp_path)


def test_a_modified_file_is_found_unless_verification_is_off(folder: Path):
    (folder / "small.txt").write_text("a changed file\n")
    with pytest.raises(ModelFolderError, match=r"small.txt does not match its sha256 in the manifest"):
        read_manifest(folder)
    assert read_manifest(folder, verify=False)["name"] == "test"


def test_modified_file_refuses_to_load(tiny_export: Path, tmp_path: Path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_export, folder)
    with open(folder / "decoder.onnx", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ModelFolderError, match=r"decoder.onnx does not match its sha256"):
        OrtBackend(folder)
    shutil.copy(tiny_export / "decoder.onnx", folder / "decoder.onnx")
    (folder / "sentencepiece.model").unlink()
    with pytest.raises(ModelFolderError, match=r"sentencepiece.model is listed in the manifest but missing"):
        read_manifest(folder)
