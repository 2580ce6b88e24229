"""What the GPU check carries to a machine without a package index (benchmarks/gpu_prepare.py): of a CUDA
library's kernels only the GPU's own generation's keep their bytes, and nothing outside its .nv_fatbin section
changes."""

from __future__ import annotations

import struct
import sys

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_prepare  # noqa: E402


def fatbin(entries: list[tuple[int, bytes]]) -> bytes:
    """One fatbin: its header, then per (arch, payload) an entry header of 64 bytes and the payload."""
    body = b""
    for arch, payload in entries:
        header = bytearray(64)
        struct.pack_into("<HHIQ", header, 0, 2, 0x101, 64, len(payload))
        struct.pack_into("<I", header, 28, arch)
        body += bytes(header) + payload
    return struct.pack("<IHHQ", gpu_prepare.FATBIN_MAGIC, 1, 16, len(body)) + body


def elf(sections: dict[str, bytes]) -> bytes:
    """A minimal 64-bit ELF whose section table names ``sections`` (and a string table) at their offsets."""
    names = b"\0" + b"".join(name.encode() + b"\0" for name in sections) + b".shstrtab\0"
    data, offsets = bytearray(64), {}
    for name, content in sections.items():
        offsets[name] = len(data)
        data += content
    strings = len(data)
    data += names
    table = len(data)
    rows = [(0, 0, 0)] + [
        (names.index(name.encode() + b"\0"), offsets[name], len(content)) for name, content in sections.items()
    ]
    rows.append((names.index(b".shstrtab\0"), strings, len(names)))
    for name_at, offset, size in rows:
        data += struct.pack("<IIQQQQ", name_at, 1, 0, 0, offset, size) + bytes(24)
    struct.pack_into("<Q", data, 0x28, table)
    struct.pack_into("<HHH", data, 0x3A, 64, len(rows), len(rows) - 1)
    return bytes(data)


def test_only_the_kept_archs_kernels_keep_their_bytes():
    magic = struct.pack("<I", gpu_prepare.FATBIN_MAGIC)
    text = b"code" + magic + b"not a fatbin, whatever follows" * 4  # the magic outside the section: left alone
    kernels = fatbin([(80, b"A" * 40), (90, b"B" * 24), (120, b"C" * 32)]) + fatbin([(90, b"D" * 8), (75, b"E" * 8)])
    library = elf({".text": text, ".nv_fatbin": kernels})
    kept, sizes = gpu_prepare.keep_one_arch(library, 90)
    assert sizes == {80: 40, 90: 32, 120: 32, 75: 8}
    assert len(kept) == len(library) and kept.count(b"B" * 24) == 1 and kept.count(b"D" * 8) == 1
    for gone in (b"A", b"C", b"E"):
        assert gone * 8 not in kept
    start, end = gpu_prepare.fatbin_section(library)
    assert kept[:start] == library[:start] and kept[end:] == library[end:]  # only the section changed
