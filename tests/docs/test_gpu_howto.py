"""The README's GPU how-to ("On a GPU"), as far as the CPU goes: the packages it names are the ones
runtime/providers.py advises, and its export and server commands, run on the tiny model with ``--provider cpu``,
export and serve the fp16 variant."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from common import flags
from export.__main__ import main as export_main
from export.__main__ import parse_args as export_args
from proto import translate_pb2
from runtime.providers import FIRST_CUDA_13_ONNXRUNTIME
from server.config import parse_config
from testkit.servers import RunningServer
from tests.conftest import ROOT


def how_to() -> tuple[str, list[list[str]]]:
    """The section's text and its command block, each line split as the shell would."""
    section = (ROOT / "README.md").read_text().split("\n### On a GPU\n", 1)[1].split("\n#", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    return section, [shlex.split(line, comments=True) for line in block.splitlines()]


def test_the_packages_are_the_ones_the_providers_error_names():
    section, (pip, *_) = how_to()
    assert pip[-3:] == [".venv/bin/pip", "install", f"onnxruntime-gpu>={FIRST_CUDA_13_ONNXRUNTIME}"]
    assert f"'onnxruntime-gpu<{FIRST_CUDA_13_ONNXRUNTIME}'" in section  # the CUDA 12 one
    assert f"CUDA 13 build from {FIRST_CUDA_13_ONNXRUNTIME}" in " ".join(section.split())


def test_the_commands_export_and_serve_fp16_on_the_cpu_provider(tiny_checkpoint: Path, tmp_path: Path):
    _, commands = how_to()
    exports = [command[3:] for command in commands if command[:3] == [".venv/bin/python", "-m", "export"]]
    (serve,) = [command[3:] for command in commands if command[:3] == [".venv/bin/python", "-m", "server"]]
    assert len(exports) == 2 and all(export_args(argv).fp16 for argv in exports)
    readme = parse_config(serve, environ={})
    assert (readme.engine.provider, readme.engine.variant) == ("cuda", "fp16")
    assert [str(model) for model in readme.model] == [str(export_args(argv).out) for argv in exports]
    # The first export's flags on the tiny checkpoint, then the server's flags with the CPU provider.
    out = tmp_path / "model"
    assert export_main([*exports[0], "--checkpoint", str(tiny_checkpoint), "--out", str(out)]) == 0
    on_cpu = parse_config([*serve, "--provider", "cpu"], environ={})
    server = RunningServer(flags.replace(on_cpu, model=(out,), port=0, metrics_port=0, http_port=0, warmup=False))
    try:
        info = server.stub.GetModelInfo(translate_pb2.GetModelInfoRequest())
        assert (info.provider, info.variant) == ("cpu", "fp16")
        assert server.translate(["A man rides a bike."], timeout=30).translations[0].text
    finally:
        server.close()
