"""The `gpus:` layout grammar, read without NVML: what a simulated layout names (docs/hardware.md).

A leaf below `config` (which checks the layout while it validates `gpus`, so a typo names the key) and below
`placement` (whose `inventory_from_spec` turns the entries into `GPU`s); neither imports the other for it.

    layout := "auto" | "none" | entry ("," entry)*
    entry  := [N "x"] kind                       N in 1-16: N GPUs of that kind, linked as the kind says
    kind   := a named V100 (v100-16gb, v100-32gb-pcie, ...) | name:memory_gib:capability[:nvlink|pcie|pcie-switch]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

LinkKind = Literal["nvlink", "pcie-switch", "pcie-host"]
"""How two GPUs reach each other: NVLink, PCIe below a switch, or PCIe through the CPU (gateway/placement/
interconnect.py turns a GPU set's links into an all-reduce cost)."""

# What NVML reports for the two V100 sizes (MiB); docs/hardware.md holds the H200 to these when emulating a V100.
_V100_16GB_MIB = 16_160
_V100_32GB_MIB = 32_510

# Named layouts: name -> (GPU name, memory MiB, compute capability, link). Without a suffix a V100 is the SXM2
# board (NVLink), as these names meant before links were modelled (docs/hardware.md says why).
_NAMED_GPUS: dict[str, tuple[str, int, tuple[int, int], LinkKind]] = {
    "v100-16gb": ("Tesla V100-SXM2-16GB", _V100_16GB_MIB, (7, 0), "nvlink"),
    "v100-32gb": ("Tesla V100-SXM2-32GB", _V100_32GB_MIB, (7, 0), "nvlink"),
    "v100-16gb-sxm2": ("Tesla V100-SXM2-16GB", _V100_16GB_MIB, (7, 0), "nvlink"),
    "v100-32gb-sxm2": ("Tesla V100-SXM2-32GB", _V100_32GB_MIB, (7, 0), "nvlink"),
    "v100-16gb-pcie": ("Tesla V100-PCIE-16GB", _V100_16GB_MIB, (7, 0), "pcie-host"),
    "v100-32gb-pcie": ("Tesla V100-PCIE-32GB", _V100_32GB_MIB, (7, 0), "pcie-host"),
    "v100-16gb-pcie-switch": ("Tesla V100-PCIE-16GB", _V100_16GB_MIB, (7, 0), "pcie-switch"),
    "v100-32gb-pcie-switch": ("Tesla V100-PCIE-32GB", _V100_32GB_MIB, (7, 0), "pcie-switch"),
}
_LINK_WORDS: dict[str, LinkKind] = {"nvlink": "nvlink", "pcie": "pcie-host", "pcie-switch": "pcie-switch"}
"""The optional fourth field of `name:memory_gib:capability:link`."""
_COUNT = re.compile(r"^(\d+)\s*x\s*(.+)$", re.IGNORECASE)


class InventoryError(Exception):
    """A GPU layout string could not be understood; the message says which part and what is accepted."""


@dataclass(frozen=True)
class LayoutEntry:
    """One comma-separated entry of a simulated layout: `count` GPUs of one kind, linked by `link`."""

    count: int
    name: str
    memory_mib: int
    compute_capability: tuple[int, int]
    link: LinkKind


def is_simulated(spec: str) -> bool:
    """Whether `spec` names a simulated layout (not `auto`, which reads NVML, nor `none`/`cpu`/empty)."""
    return spec.strip().lower() not in ("auto", "none", "cpu", "")


def parse_layout(spec: str) -> tuple[LayoutEntry, ...]:
    """The entries of a simulated layout (`is_simulated(spec)`); raises `InventoryError` naming the part it
    cannot read and what is accepted."""
    entries = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            raise InventoryError(f"GPU layout {spec!r}: empty entry between commas")
        count, kind = 1, part
        match = _COUNT.match(part)
        if match:
            count, kind = int(match.group(1)), match.group(2).strip()
            if not 1 <= count <= 16:
                raise InventoryError(f"GPU layout {part!r}: count must be 1-16")
        entries.append(LayoutEntry(count, *_parse_kind(kind, spec)))
    return tuple(entries)


def check_layout(spec: str) -> None:
    """Raise `InventoryError` if `spec` is not `auto`, `none` or a layout `parse_layout` can read. Reads no
    NVML (config validation calls it)."""
    if is_simulated(spec):
        parse_layout(spec)


def _parse_kind(kind: str, spec: str) -> tuple[str, int, tuple[int, int], LinkKind]:
    named = _NAMED_GPUS.get(kind.lower())
    if named is not None:
        return named
    fields = kind.split(":")
    link_word = fields.pop().strip().lower() if len(fields) == 4 else "pcie"
    if len(fields) != 3 or link_word not in _LINK_WORDS:
        known = ", ".join(sorted(_NAMED_GPUS))
        raise InventoryError(
            f"GPU layout {spec!r}: cannot read {kind!r}; use auto, none, {known}, NxLAYOUT (2xv100-16gb) or "
            "name:memory_gib:capability[:nvlink|pcie|pcie-switch] (a10:24:8.6)"
        )
    name, memory, capability = (f.strip() for f in fields)
    try:
        mib = round(float(memory) * 1024)
        major, _, minor = capability.partition(".")
        cc = (int(major), int(minor or 0))
    except ValueError:
        raise InventoryError(
            f"GPU layout {spec!r}: in {kind!r} memory must be GiB (16) and capability major.minor (7.0)"
        ) from None
    if mib <= 0 or not name:
        raise InventoryError(f"GPU layout {spec!r}: {kind!r} needs a name and a positive memory size")
    return name, mib, cc, _LINK_WORDS[link_word]
