"""The GPUs placement may use and how they are linked: read from NVML (names, memory, NVLink and PCIe topology),
or simulated from a layout string such as `2xv100-16gb` or `4xv100-32gb-pcie`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pynvml import NVML_P2P_CAPS_INDEX_NVLINK, NVML_P2P_STATUS_OK, NVML_TOPOLOGY_MULTIPLE

from gateway.config_gpus import InventoryError as InventoryError  # the layout's error, raised through here
from gateway.config_gpus import LinkKind as LinkKind
from gateway.config_gpus import is_simulated, parse_layout

MIB = 1 << 20
GIB = 1 << 30


class GPU(BaseModel):
    """One GPU as placement sees it. `index` is the NVML index (PCI bus order), which CUDA agrees with when
    workers run with CUDA_DEVICE_ORDER=PCI_BUS_ID."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    name: str
    uuid: str | None = None
    total_bytes: int = Field(ge=0)
    free_bytes: int = Field(ge=0)
    compute_capability: tuple[int, int]
    simulated: bool = False
    nvlink_peers: tuple[int, ...] = Field(default=(), description="GPUs this one reaches over NVLink")
    switch_peers: tuple[int, ...] = Field(
        default=(), description="GPUs this one reaches over PCIe below a switch, without the CPU"
    )

    @property
    def supports_bf16(self) -> bool:
        """BF16 arithmetic needs sm80 or newer; a V100 (sm70) has none."""
        return self.compute_capability >= (8, 0)

    @property
    def kind(self) -> tuple[str, int, tuple[int, int]]:
        """GPUs of the same kind are interchangeable for tensor parallelism."""
        return (self.name, self.total_bytes, self.compute_capability)

    def describe(self) -> str:
        cc = ".".join(map(str, self.compute_capability))
        free, total = self.free_bytes / GIB, self.total_bytes / GIB
        links = "".join(
            f", {label} to {','.join(map(str, peers))}"
            for label, peers in (("NVLink", self.nvlink_peers), ("PCIe switch", self.switch_peers))
            if peers
        )
        return f"GPU {self.index} {self.name} ({free:.1f} of {total:.1f} GiB free, sm{cc}{links})"


class Inventory(BaseModel):
    """The GPUs of one host, plus host memory when known (`None` for a simulated layout)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: tuple[GPU, ...] = ()
    source: Literal["nvml", "simulated", "none"] = "none"
    host_memory_bytes: int | None = None
    note: str | None = Field(default=None, description="why NVML gave no GPUs, when it did not")


def inventory_from_spec(spec: str, *, nvml: Any = None) -> Inventory:
    """`auto` reads NVML (no driver means no GPUs, never an error); `none` is no GPUs; anything else is a
    simulated layout: `v100-16gb`, `2xv100-16gb`, `v100-32gb`, with `-sxm2` (NVLink, the default), `-pcie`
    (PCIe through the CPU) or `-pcie-switch` (PCIe below a switch) after the size, `name:memory_gib:capability`
    with an optional `:nvlink`/`:pcie`/`:pcie-switch` (for example `a10:24:8.6:pcie`, PCIe when left out), or
    a comma-separated mix of those (`v100-32gb,2xv100-16gb`). The GPUs of one entry are linked as it says;
    GPUs of different entries only through the CPU.

    Raises `InventoryError` for a layout it cannot read.
    """
    text = spec.strip().lower()
    if text == "auto":
        return inventory_from_nvml(nvml)
    if not is_simulated(text):
        return Inventory(source="none", host_memory_bytes=host_memory_bytes())
    gpus: list[GPU] = []
    for entry in parse_layout(spec):
        group = tuple(range(len(gpus), len(gpus) + entry.count))
        for index in group:
            peers = tuple(i for i in group if i != index)
            gpus.append(
                GPU(
                    index=index,
                    name=entry.name,
                    total_bytes=entry.memory_mib * MIB,
                    free_bytes=entry.memory_mib * MIB,
                    compute_capability=entry.compute_capability,
                    simulated=True,
                    nvlink_peers=peers if entry.link == "nvlink" else (),
                    switch_peers=peers if entry.link == "pcie-switch" else (),
                )
            )
    return Inventory(gpus=tuple(gpus), source="simulated")


def inventory_from_nvml(nvml: Any = None) -> Inventory:
    """Every GPU NVML reports, by index. Any NVML failure (no library, no driver, a broken device) yields an
    empty inventory whose `note` says why, so a CPU-only host plans for the CPU instead of crashing."""
    host = host_memory_bytes()
    if nvml is None:
        try:
            import pynvml as nvml_module
        except ImportError as exc:  # nvidia-ml-py not installed
            return Inventory(source="none", host_memory_bytes=host, note=f"NVML unavailable: {exc}")
        nvml = nvml_module
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: all mean "no GPUs here"
        return Inventory(source="none", host_memory_bytes=host, note=f"NVML unavailable: {exc}")
    try:
        gpus = _with_links(nvml, [_read_device(nvml, i) for i in range(nvml.nvmlDeviceGetCount())])
    except Exception as exc:
        return Inventory(source="none", host_memory_bytes=host, note=f"NVML failed while listing GPUs: {exc}")
    finally:
        _quietly(nvml.nvmlShutdown)
    return Inventory(gpus=gpus, source="nvml" if gpus else "none", host_memory_bytes=host)


def _read_device(nvml: Any, index: int) -> GPU:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    return GPU(
        index=index,
        name=_text(nvml.nvmlDeviceGetName(handle)),
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        total_bytes=int(memory.total),
        free_bytes=int(memory.free),
        compute_capability=(int(major), int(minor)),
    )


def _with_links(nvml: Any, gpus: list[GPU]) -> tuple[GPU, ...]:
    """The GPUs with their NVLink and PCIe-switch peers. A pair NVML cannot answer for counts as PCIe through
    the CPU, the slowest link: topology is a speed input, never a reason to lose the inventory."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(g.index) for g in gpus]
    nvlink: dict[int, list[int]] = {g.index: [] for g in gpus}
    switch: dict[int, list[int]] = {g.index: [] for g in gpus}
    for a, first in enumerate(gpus):
        for b in range(a + 1, len(gpus)):
            second = gpus[b]
            kind = _pair_link(nvml, handles[a], handles[b], (first.name, second.name))
            peers = nvlink if kind == "nvlink" else switch if kind == "pcie-switch" else None
            if peers is not None:
                peers[first.index].append(second.index)
                peers[second.index].append(first.index)
    return tuple(
        g.model_copy(update={"nvlink_peers": tuple(nvlink[g.index]), "switch_peers": tuple(switch[g.index])})
        for g in gpus
    )


def _pair_link(nvml: Any, a: object, b: object, names: tuple[str, str]) -> LinkKind:
    """NVLink when NVML reports NVLink peer-to-peer between the two (NVSwitch systems included); where the
    driver cannot say, two SXM boards (V100-SXM2, A100-SXM4) count as NVLinked, as they are in DGX/HGX
    systems. Otherwise the PCIe path: below a switch (PIX/PXB) or through the CPU (PHB, NODE, SYS)."""
    try:
        if nvml.nvmlDeviceGetP2PStatus(a, b, NVML_P2P_CAPS_INDEX_NVLINK) == NVML_P2P_STATUS_OK:
            return "nvlink"
    except Exception:  # NVMLError_NotSupported on drivers or boards without the query
        if all("sxm" in name.lower() for name in names):
            return "nvlink"
    try:
        level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(a, b))
    except Exception:  # not supported (non-Linux, vGPU): assume the slow path
        return "pcie-host"
    return "pcie-switch" if level <= NVML_TOPOLOGY_MULTIPLE else "pcie-host"  # MULTIPLE: several PCIe switches


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _quietly(call: Callable[[], object]) -> None:
    try:
        call()
    except Exception:  # shutting NVML down must never turn a good inventory into an error
        return


def host_memory_bytes() -> int | None:
    """Physical memory of this host, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


HOST_BUDGET_FRACTION = 0.8
"""Without `server.memory_budget_bytes`, models may hold this much of the memory available at start."""


def host_available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable (memory that can be had without swapping, page cache included), or None off Linux."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_budget_bytes(configured: int | None) -> int | None:
    """The host memory models may hold: the configured budget, else 80 % of MemAvailable now (else of the
    physical memory), or None where neither is known."""
    if configured is not None:
        return configured
    available = host_available_bytes() or host_memory_bytes()
    return int(available * HOST_BUDGET_FRACTION) if available else None
