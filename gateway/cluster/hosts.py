"""The hosts of a cluster as placement sees them, and the cluster file that simulates them.

A host is a name, its GPUs (an `Inventory`: NVML on a live host, a layout string in a cluster file), the
address its workers are reached at, and the models whose files it lacks. A cluster file is YAML:

    hosts:
      dgx1:   {gpus: 8xv100-32gb}
      box-a:  {gpus: 4xv100-16gb, address: 10.0.0.12}
      ws-3:   {gpus: v100-16gb, missing: [llama-70b]}   # no file of that model on this host

Reads no Ray: `voltgate plan --cluster FILE` works without the `cluster` extra.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.placement.inventory import Inventory, InventoryError, inventory_from_spec

HOST_NAME_PATTERN = r"^[A-Za-z0-9._-]+$"
"""Host names: what a Ray custom resource name and a Prometheus label value can both carry unchanged."""


class ClusterFileError(Exception):
    """A cluster file could not be read; the message names the file and the key."""


class HostView(BaseModel):
    """One host as the cluster plan sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=HOST_NAME_PATTERN)
    inventory: Inventory
    address: str | None = Field(default=None, description="where its workers are reached (its node IP)")
    missing: frozenset[str] = Field(
        default=frozenset(), description="configured models with no source file on this host"
    )
    memory_available_bytes: int | None = Field(
        default=None, description="its MemAvailable when it joined (its on-demand budget); None: unknown"
    )


class _HostEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: str = Field(default="none", description="a layout string, as `gpus:` in the config takes")
    address: str | None = None
    missing: tuple[str, ...] = ()


class _ClusterFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: dict[str, _HostEntry] = Field(min_length=1)


def load_cluster_file(path: Path) -> list[HostView]:
    """The hosts a cluster file declares, in file order. Raises `ClusterFileError` naming the bad key."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ClusterFileError(f"cluster file {path}: {exc}") from None
    try:
        parsed = _ClusterFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ClusterFileError(f"cluster file {path}: {where}: {first['msg']}") from None
    hosts = []
    for name, entry in parsed.hosts.items():
        if entry.gpus.strip().lower() == "auto":
            raise ClusterFileError(f"cluster file {path}: hosts.{name}.gpus: 'auto' reads this machine; name a layout")
        try:
            inventory = inventory_from_spec(entry.gpus)
        except InventoryError as exc:
            raise ClusterFileError(f"cluster file {path}: hosts.{name}.gpus: {exc}") from None
        try:
            hosts.append(
                HostView(name=name, inventory=inventory, address=entry.address, missing=frozenset(entry.missing))
            )
        except ValidationError:
            raise ClusterFileError(
                f"cluster file {path}: hosts.{name}: a host name is letters, digits, . _ -"
            ) from None
    return hosts
