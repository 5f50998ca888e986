"""GPU inventory: simulated layouts, NVML through a fake, and no NVML meaning no GPUs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.placement import GPU, Inventory, InventoryError, inventory_from_nvml, inventory_from_spec

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
    ],
)
def test_bad_layouts_name_the_bad_part(spec: str, message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        inventory_from_spec(spec)


class FakeNVML:
    """Stands for the `pynvml` module: the calls `inventory_from_nvml` makes, answering for `gpus`, or
    raising `init_error` from nvmlInit like pynvml does without a driver."""

    def __init__(self, gpus: list[dict[str, object]], init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.shut_down = False

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


def test_no_nvml_library_means_no_gpus_not_a_crash() -> None:
    import pynvml

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
