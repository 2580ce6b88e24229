"""The CPU description every figure carries, and the warning for int8 exports that this CPU would degrade."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import runtime.backend
from runtime.backend import OrtBackend
from runtime.cpu import describe_cpu, has_vnni, int8_products_saturate, kernel_features
from runtime.options import EngineSettings, RuntimeOptions

EPYC_ROME = frozenset(["fpu", "sse2", "avx", "avx2", "fma", "bmi2", "sha_ni"])  # AMD Zen 2
ICE_LAKE = frozenset(["avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"])
SAPPHIRE_RAPIDS = frozenset(
    ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_tile"]
)


def test_kernel_features_name_what_int8_depends_on():
    assert kernel_features(EPYC_ROME) == ["avx2", "fma"]
    assert kernel_features(ICE_LAKE) == ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"]
    assert not has_vnni(EPYC_ROME) and has_vnni(ICE_LAKE) and has_vnni(SAPPHIRE_RAPIDS)
    assert "amx_int8" in kernel_features(SAPPHIRE_RAPIDS)


def test_the_description_names_this_cpu_and_whether_it_has_vnni():
    text = describe_cpu()
    assert ("(VNNI)" in text) == has_vnni(), text
    assert all(feature in text for feature in kernel_features()), text


def test_int8_products_saturate_only_without_vnni():
    """ONNX Runtime's u8×s8 kernel saturates exactly where VNNI is missing on an AVX2 or AVX-512 x86-64 CPU; with
    VNNI, or without AVX2's kernel, the products are exact. The assert names the CPU and features it ran on."""
    expected = not has_vnni() and "avx2" in kernel_features()
    assert int8_products_saturate() == expected, describe_cpu()


def _int8_folder_from_before_7_bit_weights(tiny_export: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_export, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["variants"]["int8"]["quantization"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_an_8_bit_int8_export_on_a_saturating_cpu_warns(tiny_export: Path, tmp_path: Path, monkeypatch, caplog):
    folder = _int8_folder_from_before_7_bit_weights(tiny_export, tmp_path)
    options = RuntimeOptions(settings=EngineSettings(variant="int8", provider="cpu"), verify_files=False)
    monkeypatch.setattr(runtime.backend, "int8_products_saturate", lambda: True)
    with caplog.at_level(logging.WARNING, logger="runtime.backend"):
        OrtBackend(folder, options)
    assert any("export it again" in r.getMessage() and "saturate" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="runtime.backend"):
        OrtBackend(
            tiny_export, RuntimeOptions(settings=EngineSettings(variant="int8", provider="cpu"))
        )  # 7-bit weights: nothing to say
    assert not caplog.records
