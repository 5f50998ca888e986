"""GPU inventory: simulated layouts and their links, NVML (with its NVLink/PCIe topology) through a fake, and
no NVML meaning no GPUs."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from gateway.placement import GPU, Inventory, InventoryError, inventory_from_nvml, inventory_from_spec
from gateway.placement.interconnect import interconnect_of

MIB = 1 << 20


@pytest.mark.parametrize(
    ("spec", "names", "mib", "capability"),
    [
        ("v100-16gb", ["Tesla V100-SXM2-16GB"], [16_160], (7, 0)),
        ("v100-32gb", ["Tesla V100-SXM2-32GB"], [32_510], (7, 0)),
        ("2xv100-16gb", ["Tesla V100-SXM2-16GB"] * 2, [16_160] * 2, (7, 0)),
        ("4x V100-32GB", ["Tesla V100-SXM2-32GB"] * 4, [32_510] * 4, (7, 0)),
        ("a10:24:8.6", ["a10"], [24 * 1024], (8, 6)),
        ("2xt4:15.5:7.5", ["t4", "t4"], [15_872, 15_872], (7, 5)),
    ],
)
def test_simulated_layouts(spec: str, names: list[str], mib: list[int], capability: tuple[int, int]) -> None:
    inventory = inventory_from_spec(spec)
    assert inventory.source == "simulated"
    assert [g.name for g in inventory.gpus] == names
    assert [g.total_bytes // MIB for g in inventory.gpus] == mib
    assert [g.free_bytes for g in inventory.gpus] == [g.total_bytes for g in inventory.gpus]
    assert [g.index for g in inventory.gpus] == list(range(len(names)))
    assert all(g.compute_capability == capability and g.simulated for g in inventory.gpus)


def test_mixed_layout_keeps_order_and_indices() -> None:
    inventory = inventory_from_spec("v100-32gb, 2xv100-16gb")
    assert [(g.index, g.total_bytes // MIB) for g in inventory.gpus] == [(0, 32_510), (1, 16_160), (2, 16_160)]
    assert inventory.gpus[1].kind == inventory.gpus[2].kind != inventory.gpus[0].kind


@pytest.mark.parametrize(
    ("spec", "name", "link"),
    [
        ("2xv100-32gb", "Tesla V100-SXM2-32GB", "nvlink"),  # the default: the SXM2 board, as before links
        ("2xv100-16gb-sxm2", "Tesla V100-SXM2-16GB", "nvlink"),
        ("4xv100-16gb-pcie", "Tesla V100-PCIE-16GB", "pcie-host"),
        ("4xV100-32GB-PCIE", "Tesla V100-PCIE-32GB", "pcie-host"),
        ("2xv100-32gb-pcie-switch", "Tesla V100-PCIE-32GB", "pcie-switch"),
        ("2xa10:24:8.6", "a10", "pcie-host"),  # a named GPU without a link word: PCIe through the CPU
        ("2xa100:80:8.0:nvlink", "a100", "nvlink"),
        ("2xa10:24:8.6:pcie-switch", "a10", "pcie-switch"),
    ],
)
def test_a_layout_says_how_its_gpus_are_linked(spec: str, name: str, link: str) -> None:
    gpus = inventory_from_spec(spec).gpus
    assert {g.name for g in gpus} == {name}
    assert interconnect_of(gpus) == link


def test_gpus_of_different_entries_meet_only_through_the_cpu() -> None:
    gpus = inventory_from_spec("2xv100-32gb,2xv100-32gb").gpus
    assert [g.nvlink_peers for g in gpus] == [(1,), (0,), (3,), (2,)]
    assert interconnect_of(gpus[:2]) == "nvlink" and interconnect_of(gpus) == "pcie-host"


def test_volta_has_no_bf16() -> None:
    v100, a10 = inventory_from_spec("v100-16gb,a10:24:8.6").gpus
    assert not v100.supports_bf16
    assert a10.supports_bf16


@pytest.mark.parametrize("spec", ["none", "NONE", "cpu"])
def test_none_is_an_empty_inventory(spec: str) -> None:
    inventory = inventory_from_spec(spec)
    assert inventory.gpus == ()
    assert inventory.source == "none"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("v200-16gb", "cannot read 'v200-16gb'"),
        ("v100-16gb,,v100-16gb", "empty entry"),
        ("a10:lots:8.6", "memory must be GiB"),
        ("a10:24", "cannot read"),
        ("0xv100-16gb", "count must be 1-16"),
        ("a10:0:8.6", "positive memory"),
        ("a10:24:8.6:infiniband", "nvlink|pcie|pcie-switch"),
        ("v100-16gb-nvswitch", "cannot read"),
    ],
)
def test_bad_layouts_name_the_bad_part(spec: str, message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        inventory_from_spec(spec)


class FakeNVML:
    """Stands for the `pynvml` module: the calls `inventory_from_nvml` makes, answering for `gpus`, or
    raising `init_error` from nvmlInit like pynvml does without a driver."""

    def __init__(
        self,
        gpus: list[dict[str, object]],
        init_error: Exception | None = None,
        nvlink: set[frozenset[int]] | None = None,
        levels: dict[frozenset[int], int] | None = None,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.shut_down = False
        self.nvlink = nvlink  # pairs with NVLink P2P; None: the driver does not answer (NVMLError_NotSupported)
        self.levels = levels or {}  # nvmlGpuTopologyLevel_t per pair; missing: NotSupported

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, object]:
        return self.gpus[index]

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, object]) -> SimpleNamespace:
        return SimpleNamespace(total=handle["total"], free=handle["free"], used=0)

    def nvmlDeviceGetCudaComputeCapability(self, handle: dict[str, object]) -> tuple[int, int]:
        return (7, 0)

    def nvmlDeviceGetName(self, handle: dict[str, object]) -> object:
        return handle["name"]

    def nvmlDeviceGetUUID(self, handle: dict[str, object]) -> str:
        return f"GPU-{handle['name']!s}"

    def _pair(self, a: dict[str, object], b: dict[str, object]) -> frozenset[int]:
        return frozenset(i for i, g in enumerate(self.gpus) if g is a or g is b)

    def nvmlDeviceGetP2PStatus(self, a: dict[str, object], b: dict[str, object], index: int) -> int:
        assert index == pynvml.NVML_P2P_CAPS_INDEX_NVLINK
        if self.nvlink is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_P2P_STATUS_OK if self._pair(a, b) in self.nvlink else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetTopologyCommonAncestor(self, a: dict[str, object], b: dict[str, object]) -> int:
        level = self.levels.get(self._pair(a, b))
        if level is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return level


def test_nvml_gpus_are_read_with_free_memory() -> None:
    nvml = FakeNVML(
        [
            {"name": b"Tesla V100-SXM2-32GB", "total": 32_510 * MIB, "free": 30_000 * MIB},
            {"name": "Tesla V100-SXM2-32GB", "total": 32_510 * MIB, "free": 32_000 * MIB},
        ]
    )
    inventory = inventory_from_nvml(nvml)
    assert inventory.source == "nvml"
    assert [g.name for g in inventory.gpus] == ["Tesla V100-SXM2-32GB"] * 2
    assert [g.free_bytes // MIB for g in inventory.gpus] == [30_000, 32_000]
    assert inventory.gpus[0].compute_capability == (7, 0)
    assert inventory.gpus[0].uuid is not None and not inventory.gpus[0].simulated
    assert nvml.shut_down


def pcie(name: str) -> dict[str, object]:
    return {"name": name, "total": 16_160 * MIB, "free": 16_000 * MIB}


def test_nvml_topology_gives_nvlink_pcie_switch_and_cpu_peers() -> None:
    """GPUs 0-1 NVLinked, 2-3 below one PCIe switch (PIX), 0 and 2 through the host bridge, the rest across
    sockets."""
    pair = frozenset
    levels = {pair({0, 1}): pynvml.NVML_TOPOLOGY_INTERNAL, pair({2, 3}): pynvml.NVML_TOPOLOGY_SINGLE,
              pair({0, 2}): pynvml.NVML_TOPOLOGY_HOSTBRIDGE}  # fmt: skip
    levels |= {pair(p): pynvml.NVML_TOPOLOGY_SYSTEM for p in ({0, 3}, {1, 2}, {1, 3})}
    nvml = FakeNVML([pcie("Tesla V100-PCIE-16GB") for _ in range(4)], nvlink={pair({0, 1})}, levels=levels)
    gpus = inventory_from_nvml(nvml).gpus
    assert [(g.nvlink_peers, g.switch_peers) for g in gpus] == [((1,), ()), ((0,), ()), ((), (3,)), ((), (2,))]
    assert interconnect_of(gpus[:2]) == "nvlink"
    assert interconnect_of(gpus[2:]) == "pcie-switch"
    assert interconnect_of([gpus[0], gpus[2]]) == "pcie-host"
    assert "NVLink to 1" in gpus[0].describe() and "PCIe switch to 3" in gpus[2].describe()


def test_multiple_pcie_bridges_still_count_as_below_the_cpu() -> None:
    levels = {frozenset({0, 1}): pynvml.NVML_TOPOLOGY_MULTIPLE}
    gpus = inventory_from_nvml(FakeNVML([pcie("Tesla V100-PCIE-16GB")] * 2, nvlink=set(), levels=levels)).gpus
    assert interconnect_of(gpus) == "pcie-switch"


@pytest.mark.parametrize(
    ("name", "link"), [("Tesla V100-SXM2-32GB", "nvlink"), ("Tesla V100-PCIE-32GB", "pcie-host")]
)
def test_without_topology_answers_the_board_name_decides(name: str, link: str) -> None:
    """A driver that answers neither query: SXM2 boards are NVLinked (DGX/HGX), PCIe cards go through the CPU,
    and the inventory is still read."""
    gpus = inventory_from_nvml(FakeNVML([pcie(name), pcie(name)])).gpus
    assert len(gpus) == 2 and interconnect_of(gpus) == link


def test_no_nvml_library_means_no_gpus_not_a_crash() -> None:
    nvml = FakeNVML([], init_error=pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    inventory = inventory_from_nvml(nvml)
    assert inventory == Inventory(source="none", host_memory_bytes=inventory.host_memory_bytes, note=inventory.note)
    assert inventory.gpus == ()
    assert inventory.note is not None and "NVML unavailable" in inventory.note


def test_nvml_failing_while_listing_means_no_gpus() -> None:
    class Broken(FakeNVML):
        def nvmlDeviceGetMemoryInfo(self, handle: dict[str, object]) -> SimpleNamespace:
            raise RuntimeError("GPU is lost")

    nvml = Broken([{"name": "x", "total": 1, "free": 1}])
    inventory = inventory_from_nvml(nvml)
    assert inventory.gpus == () and inventory.note is not None and "GPU is lost" in inventory.note
    assert nvml.shut_down


def test_auto_on_this_host_never_raises() -> None:
    """On the CPU-only CI host NVML is absent: auto gives no GPUs; on a GPU host it lists them."""
    inventory = inventory_from_spec("auto")
    assert inventory.source in ("nvml", "none")
    assert all(isinstance(g, GPU) for g in inventory.gpus)
    assert inventory.host_memory_bytes is None or inventory.host_memory_bytes > 0
