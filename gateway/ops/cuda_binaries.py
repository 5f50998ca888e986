"""What a CUDA shared library was built for, read from the file without loading it.

* `fatbin_archs(path)`: the SM architectures of the cubins in its `.nv_fatbin` section (70 = V100). A
  library whose cubins lack 70 cannot run on a V100 (PTX for an older arch could be JIT-compiled; we report
  PTX separately). Fatbin layout: containers of `u32 magic 0xBA55ED50, u16 version, u16 header size, u64
  payload size`, each holding entries of `u16 kind (1 PTX, 2 cubin), u16 version, u32 header size, u64 size`
  with the arch as u32 at byte 28 of the entry header.
* `needed_sonames(path, prefix)`: the versioned sonames it links against (`libcudart.so.12`), found in its
  dynamic string table.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
_KIND_PTX, _KIND_CUBIN = 1, 2


@dataclass(frozen=True)
class Archs:
    cubin: frozenset[int]
    ptx: frozenset[int]

    def runs_on(self, sm: int) -> bool:
        """A cubin for exactly this arch, or PTX at or below it that the driver can compile."""
        return sm in self.cubin or any(p <= sm for p in self.ptx)


def _section(mm: mmap.mmap, wanted: bytes) -> tuple[int, int] | None:
    if mm[:4] != b"\x7fELF" or mm[4] != 2:  # ELF64 only
        return None
    (e_shoff,) = struct.unpack_from("<Q", mm, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", mm, 0x3A)
    if not e_shoff or e_shstrndx >= e_shnum:
        return None

    def header(i: int) -> tuple[int, int, int, int, int, int]:
        name, kind, flags, addr, offset, size = struct.unpack_from("<IIQQQQ", mm, e_shoff + i * e_shentsize)
        return name, kind, flags, addr, offset, size

    strtab = header(e_shstrndx)[4]
    for i in range(e_shnum):
        name, _type, _flags, _addr, offset, size = header(i)
        end = mm.find(b"\0", strtab + name)
        if mm[strtab + name : end] == wanted:
            return offset, size
    return None


def fatbin_archs(path: Path) -> Archs | None:
    """The cubin and PTX archs in `path`'s `.nv_fatbin`; None when it has none (or is no ELF64 file)."""
    cubin: set[int] = set()
    ptx: set[int] = set()
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        found = _section(mm, b".nv_fatbin")
        if found is None:
            return None
        pos, end = found[0], found[0] + found[1]
        while pos + 16 <= end:
            magic, _ver, header_size, size = struct.unpack_from("<IHHQ", mm, pos)
            if magic != FATBIN_MAGIC:  # padding between containers
                pos += 1
                continue
            entry, stop = pos + header_size, pos + header_size + size
            while entry + 32 <= stop:
                kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", mm, entry)
                (arch,) = struct.unpack_from("<I", mm, entry + 28)
                if kind == _KIND_CUBIN:
                    cubin.add(arch)
                elif kind == _KIND_PTX:
                    ptx.add(arch)
                if entry_header == 0:
                    break
                entry += entry_header + payload
            pos = stop
    return Archs(frozenset(cubin), frozenset(ptx))


def needed_sonames(path: Path, prefix: str) -> list[str]:
    """Versioned sonames starting with `prefix` named in the file (`libcudart.so.12`), sorted."""
    pattern = re.compile(re.escape(prefix.encode()) + rb"\.so\.(\d+)")
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return sorted({f"{prefix}.so.{m.group(1).decode()}" for m in pattern.finditer(mm)})


def soname_major(names: list[str]) -> int | None:
    majors = [int(n.rsplit(".", 1)[1]) for n in names]
    return max(majors) if majors else None
