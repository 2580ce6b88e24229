"""What a GPU check carries to a machine that cannot reach a package index, in two parts that each fit a 64 MiB
transfer beside the tracked tree (``python benchmarks/gpu_prepare.py``; then benchmarks/gpu_device.sh there):

- ``.gpu/a``: onnxruntime-gpu's CUDA provider and Python extension, xz-compressed. The provider is 284 MB,
  nearly all of it kernels built for six GPU generations; only the ``--arch`` one's stay (the others' bytes
  are zeroed, which a GPU of that generation never reads, and then compress to nothing): 52 MB for sm_90.
- ``.gpu/b``: the rest of the onnxruntime package; the default model's fp16 export alone (its manifest
  listing only that variant); CPU fp32's outputs on test_2016_flickr, made here (``gpu_check --write-reference``),
  which the device compares its own with; ONNX Runtime's BeamSearch node over the same weights in fp16
  (export/generation_op.py); the test sentences; the generated gRPC modules.

The checkpoints are not needed there; benchmarks/gpu_device.sh says how the tree travels without them.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FATBIN_MAGIC = 0xBA55ED50
PYTHON_TAGS = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:", "--no-deps"]
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (28, 27, 17)]


def keep_one_arch(library: bytes, arch: int) -> tuple[bytes, dict[int, int]]:
    """The shared library with every fatbin entry's payload zeroed except those built for ``arch`` (e.g. 90),
    and the bytes each arch had. Entries keep their headers, so the CUDA runtime still finds, and skips, them."""
    data = bytearray(library)
    sizes: dict[int, int] = {}
    section, section_end = fatbin_section(data)
    position = data.find(struct.pack("<I", FATBIN_MAGIC), section, section_end)
    while position >= 0:
        _, _, header, size = struct.unpack_from("<IHHQ", data, position)
        entry, end = position + header, position + header + size
        while entry < end:
            _, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            entry_arch = struct.unpack_from("<I", data, entry + 28)[0]
            sizes[entry_arch] = sizes.get(entry_arch, 0) + payload
            if entry_arch != arch:
                data[entry + entry_header : entry + entry_header + payload] = bytes(payload)
            entry += entry_header + payload
        position = data.find(struct.pack("<I", FATBIN_MAGIC), end, section_end)
    return bytes(data), sizes


def fatbin_section(elf: bytes) -> tuple[int, int]:
    """The file offsets of a 64-bit ELF's .nv_fatbin section (start, end)."""
    (table,) = struct.unpack_from("<Q", elf, 0x28)
    entry_size, count, names = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, table + i * entry_size) for i in range(count)]
    strings = headers[names][4]
    for name, _, _, _, offset, size in headers:
        if elf[strings + name : strings + name + 11] == b".nv_fatbin\0":
            return offset, offset + size
    raise ValueError("no .nv_fatbin section")


def xz(data: bytes, path: Path) -> None:
    path.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))


def onnxruntime_parts(version: str, arch: int, out: Path, cache: Path) -> None:
    wheels = list(cache.glob(f"onnxruntime_gpu-{version}-*.whl"))
    if not wheels:
        platforms = [flag for p in PLATFORMS for flag in ("--platform", p)]
        command = [sys.executable, "-m", "pip", "download", *PYTHON_TAGS, *platforms, "-d", str(cache)]
        subprocess.run([*command, f"onnxruntime-gpu=={version}"], check=True)
        wheels = list(cache.glob(f"onnxruntime_gpu-{version}-*.whl"))
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        provider = next(n for n in names if n.endswith("libonnxruntime_providers_cuda.so"))
        extension = next(n for n in names if "onnxruntime_pybind11_state" in n)
        library, sizes = keep_one_arch(wheel.read(provider), arch)
        print(f"fatbin bytes by arch: {sizes}; kept {arch}", file=sys.stderr)
        xz(library, out / "a" / "libonnxruntime_providers_cuda.so.xz")
        xz(wheel.read(extension), out / "a" / "onnxruntime_pybind11_state.so.xz")
        left_out = {provider, extension}
        with tarfile.open(out / "b" / "onnxruntime.tar.xz", "w:xz") as tar:
            for name in names:
                if name in left_out or name.startswith("onnxruntime/capi/libonnxruntime.so") or "tensorrt" in name:
                    continue  # the C API library and TensorRT's provider: not what Python's CUDA runs need
                if name.startswith("onnxruntime/") and not name.endswith("/"):
                    info = tarfile.TarInfo(name)
                    info.mode = 0o755 if name.endswith(".so") else 0o644
                    content = wheel.read(name)
                    info.size = len(content)
                    with tempfile.SpooledTemporaryFile() as buffer:
                        buffer.write(content)
                        buffer.seek(0)
                        tar.addfile(info, buffer)
    (out / "a" / "extension_name").write_text(Path(extension).name)


def model_parts(out: Path, data: Path, sentences: int) -> None:
    exported = ROOT / "exported" / "gpu"
    if not (exported / "decoder.fp16.onnx").exists():
        subprocess.run([sys.executable, "-m", "export", "--out", str(exported), "--fp16", "--force"], check=True)
    model = out / "b" / "model"
    shutil.rmtree(model, ignore_errors=True)
    model.mkdir(parents=True)
    manifest = json.loads((exported / "manifest.json").read_text())
    manifest["variants"] = {"fp16": manifest["variants"]["fp16"]}
    keep = {"encoder.fp16.onnx", "decoder.fp16.onnx", "sentencepiece.model"}
    manifest["files"] = {name: digest for name, digest in manifest["files"].items() if name in keep}
    for name in keep:
        shutil.copy(exported / name, model / name)
    (model / "manifest.json").write_text(json.dumps(manifest, indent=2))
    check = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--model", str(exported)]
    reference = [
        "--data",
        str(data),
        "--sentences",
        str(sentences),
        "--write-reference",
        str(out / "b" / "reference.json"),
    ]
    subprocess.run([*check, *reference], check=True, cwd=ROOT)
    corpus = out / "b" / "data"
    corpus.mkdir(exist_ok=True)
    for language in ("en", "de"):
        for found in data.glob(f"test_2016_flickr.{language}*"):
            shutil.copy(found, corpus / found.name)
    generated = out / "b" / "proto"
    generated.mkdir(exist_ok=True)
    for found in (ROOT / "proto").glob("*_pb2*.py"):
        shutil.copy(found, generated / found.name)


def beam_search_part(out: Path) -> None:
    import onnx

    from export.generation_op import BeamSearchOp, build_beam_search
    from model.checkpoint import DEFAULT_CHECKPOINT, load_checkpoint

    graph = BeamSearchOp.float16(build_beam_search(load_checkpoint(DEFAULT_CHECKPOINT)[0]))
    onnx.save(graph, str(out / "b" / "beam_search.fp16.onnx"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu")
    parser.add_argument("--onnxruntime-gpu", default="1.31.1", help="a CUDA 13 build (1.27 or later)")
    parser.add_argument("--arch", type=int, default=90, help="the GPU's compute capability: 90 for H100 and H200")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--sentences", type=int, default=1000)
    args = parser.parse_args(argv)
    for part in ("a", "b"):
        (args.out / part).mkdir(parents=True, exist_ok=True)
    cache = args.out / "cache"
    cache.mkdir(exist_ok=True)
    onnxruntime_parts(args.onnxruntime_gpu, args.arch, args.out, cache)
    model_parts(args.out, args.data, args.sentences)
    beam_search_part(args.out)
    for part in ("a", "b"):
        size = sum(f.stat().st_size for f in (args.out / part).rglob("*") if f.is_file())
        print(f"{args.out / part}: {size / 2**20:.1f} MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
