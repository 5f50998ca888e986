"""Reading a CUDA library's architectures and CUDA runtime from the file (the doctor's sm_70 checks).

The library is a real ELF64 shared object built here with gcc, whose `.nv_fatbin` section holds a fatbin
container written by this test (two cubins and a PTX entry), and which names `libcudart.so.12`.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from gateway.ops.cuda_binaries import FATBIN_MAGIC, fatbin_archs, needed_sonames, soname_major


def _entry(kind: int, arch: int, payload: bytes) -> bytes:
    header = struct.pack("<HHIQ", kind, 0x101, 64, len(payload)) + b"\0" * 12 + struct.pack("<I", arch)
    return header.ljust(64, b"\0") + payload


def _container(entries: list[bytes]) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def _library(tmp: Path, fatbin: bytes) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc (the llama.cpp build needs it too)")
    data = ", ".join(str(b) for b in fatbin)
    src = tmp / "lib.c"
    src.write_text(
        f'__attribute__((section(".nv_fatbin"), used)) const unsigned char fatbin[] = {{{data}}};\n'
        'const char *needed = "libcudart.so.12";\n'
    )
    out = tmp / "libfake.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


def test_cubin_and_ptx_archs_are_read_from_the_fatbin(tmp_path: Path) -> None:
    blob = _container([_entry(2, 70, b"\1" * 40), _entry(2, 90, b"\2" * 24)]) + b"\0" * 8
    blob += _container([_entry(1, 80, b"ptx text")])
    lib = _library(tmp_path, blob)
    archs = fatbin_archs(lib)
    assert archs is not None
    assert archs.cubin == {70, 90} and archs.ptx == {80}
    assert archs.runs_on(70) and archs.runs_on(90) and archs.runs_on(86)  # 86: the sm_80 PTX compiles
    assert needed_sonames(lib, "libcudart") == ["libcudart.so.12"]
    assert soname_major(needed_sonames(lib, "libcudart")) == 12


def test_a_library_without_sm70_code_does_not_run_on_a_v100(tmp_path: Path) -> None:
    archs = fatbin_archs(_library(tmp_path, _container([_entry(2, 90, b"\3" * 16)])))
    assert archs is not None and not archs.runs_on(70)


def test_a_file_without_a_fatbin_has_no_archs(tmp_path: Path) -> None:
    plain = tmp_path / "plain.so"
    plain.write_bytes(b"not an ELF file at all")
    assert fatbin_archs(plain) is None
    assert soname_major([]) is None
