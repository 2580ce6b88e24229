"""``--provider cuda`` on ONNX Runtime's CPU build: the error names the onnxruntime-gpu to install for the CUDA
this machine's driver supports (nvidia-smi's header), or says how to choose one where nvidia-smi is missing.
The CPU build stands in for itself on any machine, and a script stands in for nvidia-smi."""

from __future__ import annotations

import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from runtime.providers import ProviderUnavailable, driver_cuda_version, reinstall_cuda_build, resolve_provider

HEADER = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.65.06              Driver Version: 580.65.06      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
"""
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."


@pytest.fixture
def cpu_build(monkeypatch, tmp_path: Path):
    """The CPU build, and a PATH with nothing on it but what the test puts in ``tmp_path``; returns a function
    that puts an nvidia-smi printing ``report`` there."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    monkeypatch.setenv("PATH", str(tmp_path))

    def nvidia_smi(report: str) -> None:
        script = tmp_path / "nvidia-smi"
        script.write_text(f"#!{sys.executable}\nprint({report!r}, end='')\n")  # no shell tools on this PATH
        script.chmod(0o755)

    return nvidia_smi


@pytest.mark.parametrize(
    "cuda, advice",
    [
        ("12.4", "supports CUDA 12.4 (nvidia-smi): pip uninstall -y onnxruntime && pip install 'onnxruntime-gpu<1.27'"),
        (
            "13.0",
            "supports CUDA 13.0 (nvidia-smi): pip uninstall -y onnxruntime && pip install 'onnxruntime-gpu>=1.27'",
        ),
        ("11.8", "supports CUDA 11.8 (nvidia-smi); PyPI's onnxruntime-gpu needs CUDA 12 or later: update the driver"),
    ],
)
def test_the_error_names_the_package_for_the_drivers_cuda(cpu_build, cuda: str, advice: str):
    cpu_build(HEADER.format(cuda=cuda))
    with pytest.raises(ProviderUnavailable, match="provider 'cuda' is not available in this onnxruntime build") as e:
        resolve_provider("cuda")
    assert advice in str(e.value)
    assert resolve_provider("auto") == "cpu"  # auto serves on the CPU without a word


@pytest.mark.parametrize("installed", [False, True], ids=["no nvidia-smi", "nvidia-smi without a driver"])
def test_without_a_version_the_error_says_how_to_choose(cpu_build, installed: bool):
    if installed:
        cpu_build(NO_DRIVER + "\n")
    assert driver_cuda_version() is None
    with pytest.raises(ProviderUnavailable) as e:
        resolve_provider("cuda")
    assert str(e.value).endswith(
        "install onnxruntime-gpu in place of onnxruntime: choose by the CUDA version nvidia-smi shows on the GPU "
        "machine (none found here): 'onnxruntime-gpu<1.27' for CUDA 12, 'onnxruntime-gpu>=1.27' for CUDA 13 or later"
    )


def test_a_cuda_build_that_cannot_load_is_told_which_to_install(cpu_build):
    """onnxruntime-gpu for another CUDA than the driver's: the fallback's error names the right release."""
    cpu_build(HEADER.format(cuda="12.8"))
    assert reinstall_cuda_build() == (
        "this machine's NVIDIA driver supports CUDA 12.8 (nvidia-smi): pip install 'onnxruntime-gpu<1.27'"
    )
