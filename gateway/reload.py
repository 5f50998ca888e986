"""Config changes without a restart: `SIGHUP`, `POST /admin/reload`, `voltgate serve --watch-config`.

A reload reads the config file again and places its models on the inventory the gateway started with. A file
that does not load, or whose models cannot be placed at all, is refused with the reason and the running
config stays. Otherwise, model by model (by name):

* untouched (same spec, same plan): keeps serving; nothing about it changes, no request is dropped;
* renamed (only its `aliases` or `alias_patterns` changed): keeps serving, and answers to its new names at once;
* removed: leaves the registry at once (new requests: 404), its requests in flight finish (up to
  `server.drain_timeout_s`), then its worker stops;
* changed: the new deployment takes the name at once (new requests wait for it, as at boot), the old one
  drains and stops, then the new one starts (so GPU memory is never counted twice);
* added: placed and started (pinned) or loaded by its first request (on demand);
* and a pinned model that gave up after a crash loop (docs/troubleshooting.md) tries again, changed or not.

Server, auth and other non-model settings are not applied live; the reload result says which changed.
One reload runs at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.base import DeploymentPlan
from gateway.config import Config, ModelSpec
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.memory import ModelMemory, estimates_from_placement
from gateway.lifecycle.residency import Residency

log = logging.getLogger("voltgate.reload")

WATCH_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Desired:
    """What a config file asks for, placed: its plans, the models refused, the placement report."""

    config: Config
    plans: tuple[DeploymentPlan, ...]
    refused: dict[str, str]
    placement: dict[str, Any]


@dataclass
class ReloadResult:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    renamed: list[str] = field(default_factory=list)  # of `unchanged`, those whose names changed
    refused: dict[str, str] = field(default_factory=dict)
    not_applied: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"object": "config.reload", **self.__dict__}


Planner = Callable[[], Desired]
MakeDeployment = Callable[[DeploymentPlan, ModelSpec], Deployment]


class Reloader:
    """Applies a re-read config to the running registry and residency (see the module docstring)."""

    def __init__(
        self,
        planner: Planner,
        current: Desired,
        registry: Registry,
        residency: Residency,
        make: MakeDeployment,
        on_applied: Callable[[Desired], None] | None = None,
    ) -> None:
        self._planner = planner
        self._on_applied = on_applied
        self.current = current
        self._registry = registry
        self._residency = residency
        self._make = make
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()

    async def reload(self) -> ReloadResult:
        async with self._lock:
            try:
                desired = self._planner()
            except Exception as exc:  # a config error of any kind: refuse it, keep what runs
                raise GatewayError(
                    ErrorCode.INVALID_REQUEST, f"config refused, the running config is unchanged: {exc}"
                ) from None
            if not desired.plans:
                raise GatewayError(
                    ErrorCode.INVALID_REQUEST,
                    "config refused, the running config is unchanged: no model could be placed "
                    f"({'; '.join(f'{k}: {v}' for k, v in desired.refused.items()) or 'no models'})",
                )
            result = self._diff(desired)
            await self._apply(desired, result)
            self.current = desired
            if self._on_applied is not None:
                self._on_applied(desired)
            log.info("config reloaded: %s", {k: v for k, v in result.to_json().items() if v and k != "object"})
            return result

    def _diff(self, desired: Desired) -> ReloadResult:
        old_specs = {m.name: m for m in self.current.config.models}
        new_specs = {m.name: m for m in desired.config.models}
        old_plans = {p.model: p for p in self.current.plans}
        new_plans = {p.model: p for p in desired.plans}
        result = ReloadResult(refused=dict(desired.refused))
        for name in sorted(set(old_plans) | set(new_plans)):
            if name not in new_plans:
                result.removed.append(name)
            elif name not in old_plans:
                result.added.append(name)
            elif old_plans[name] != new_plans[name] or _unnamed(old_specs.get(name)) != _unnamed(new_specs.get(name)):
                result.changed.append(name)
            else:
                result.unchanged.append(name)
                if old_specs.get(name) != new_specs.get(name):
                    result.renamed.append(name)
        for key in ("server", "auth", "gpus", "prompt_cache"):
            if getattr(self.current.config, key) != getattr(desired.config, key):
                result.not_applied.append(f"{key} (restart to apply)")
        return result

    async def _apply(self, desired: Desired, result: ReloadResult) -> None:
        new_specs = {m.name: m for m in desired.config.models}
        new_plans = {p.model: p for p in desired.plans}
        estimates = estimates_from_placement(desired.placement)[1]
        memory = {name: ModelMemory.from_estimate(e) for name, e in estimates.items()}
        retiring = [self._registry.remove(name) for name in (*result.removed, *result.changed)]
        self._registry.refused = dict(desired.refused)
        fresh = [self._make(new_plans[n], new_specs[n]) for n in (*result.changed, *result.added)]
        for deployment in fresh:
            self._registry.add(deployment)
        stopping = [self._residency.retire(d) for d in retiring if d is not None]
        added = set(result.added)
        for deployment in fresh:  # an added model need not wait for anything; a changed one for its old self
            if deployment.name in added:
                self._residency.adopt(deployment, memory.get(deployment.name))
        await asyncio.gather(*stopping)
        for deployment in fresh:
            if deployment.name not in added:
                self._residency.adopt(deployment, memory.get(deployment.name))
        for name in result.renamed:  # its worker serves on; only the names that reach it change
            spec = new_specs[name]
            self._registry.rename(name, spec.aliases, spec.alias_patterns)
        for name in result.unchanged:  # a pinned worker that gave up after a crash loop tries again
            kept = self._registry.deployments[name]
            if kept.policy.at_boot:
                kept.worker.start(retry=True)  # a no-op for one that is serving or restarting

    def watch(self, path: Path) -> asyncio.Task[None]:
        """Reload whenever `path` changes (`--watch-config`): its modification time, polled each second."""
        task = asyncio.create_task(self._watch(path), name="reload:watch")
        self._background.add(task)
        return task

    async def _watch(self, path: Path) -> None:
        seen = _mtime(path)
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            now = _mtime(path)
            if now != seen:
                seen = now
                await self.reload_logged("the config file changed")

    async def reload_logged(self, why: str) -> None:
        """A reload that nobody waits on (SIGHUP, the watcher): its outcome goes to the log."""
        log.info("reloading the config: %s", why)
        try:
            await self.reload()
        except GatewayError as exc:
            log.error("%s", exc.message)

    def on_sighup(self) -> None:
        task = asyncio.get_running_loop().create_task(self.reload_logged("SIGHUP"))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


_NAMES = {"aliases", "alias_patterns", "replicas"}  # what a reload changes without touching the model's worker


def _unnamed(spec: ModelSpec | None) -> dict[str, Any] | None:
    """A model's entry without the names that reach it: what decides whether its worker must change."""
    return None if spec is None else spec.model_dump(exclude=_NAMES)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
