"""The lifecycle owner: which models are in memory and every step of each one's life. Pinned models load at
boot, on-demand ones at their first request; idle ones unload, and least recently used ones are evicted when
another needs the room. Each model's `Policy` says which of these apply to it.

A model's state is its worker's (`gateway.lifecycle.workers.WorkerState`, its diagram above it); this module
adds only its own steps on a model (a load under way, a drain) and a remembered failed load (`Resident`). It
decides nothing itself: each thing that happens is an event, `gateway.lifecycle.decisions.decide` (pure) says
what follows, and this module carries the effects out (the awaits, the lock, the tasks). The policies and
contracts are written once, in docs/lifecycle.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from gateway.config import ServerSettings
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle import decisions
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.eviction import choose_victims, eviction_reason, no_room, shortfall
from gateway.lifecycle.memory import MemoryProbe, ModelMemory, Pools, cluster_memory, estimates_from_placement
from gateway.lifecycle.resident import Hold, Progress, Resident
from gateway.lifecycle.workers import Status, WorkerStartError, WorkerState

__all__ = ["Hold", "Progress", "Residency", "ResidencyMetrics"]


class ResidencyMetrics(Protocol):
    """What the residency reports to: `gateway.ops.metrics.Metrics` in the gateway, injected, so this floor
    imports nothing above it (the Prometheus families are labelled by model; see docs/metrics.md)."""

    load_wait: Any
    model_loads: Any
    load_duration: Any
    model_evictions: Any
    model_memory: Any

    def set_model_state(self, model: str, state: str, states: Sequence[str]) -> None: ...


log = logging.getLogger("voltgate.residency")

REAP_INTERVAL_S = 0.5
MEASURE_INTERVAL_S = 5.0
GPU_RECOVERY_S = 5.0
"""After an unload, how long a GPU may take to show the freed memory before a load is refused."""
STOP_GRACE_S = 10.0


class Residency:
    """The residency manager: see the module docstring for the state machine and its contracts."""

    def __init__(
        self,
        registry: Registry,
        settings: ServerSettings,
        metrics: ResidencyMetrics,
        pools: Pools,
        memory: Mapping[str, ModelMemory] | None = None,
    ) -> None:
        self._registry = registry
        self._settings = settings
        self._metrics = metrics
        self.pools = pools
        self._memory = dict(memory or {})
        self._entries: dict[str, Resident] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    @classmethod
    def from_placement(
        cls,
        registry: Registry,
        settings: ServerSettings,
        metrics: ResidencyMetrics,
        placement: Mapping[str, Any],
        probe: MemoryProbe | None = None,
    ) -> Residency:
        """Budgets and estimates from the placement report the gateway was started with (a cluster's: each
        host's pools, `gateway.lifecycle.memory.cluster_memory`)."""
        if placement.get("cluster"):
            return cls(registry, settings, metrics, *cluster_memory(placement))
        inventory, estimates = estimates_from_placement(placement)
        pools = Pools.from_inventory(inventory, settings.memory_budget_bytes, probe)
        memory = {name: ModelMemory.from_estimate(estimate) for name, estimate in estimates.items()}
        return cls(registry, settings, metrics, pools, memory)

    # -- lifecycle --------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the models loaded at boot (those on GPUs one at a time, in plan order, each measured) and
        the idle reaper. Returns at once; loading happens in the background."""
        at_boot = [e for e in self._all() if e.policy.at_boot]
        on_gpus = [e for e in at_boot if e.memory.gpu_indices]
        for entry in at_boot:
            if entry not in on_gpus:
                entry.deployment.worker.start()
        self._spawn(self._boot(on_gpus), "residency:boot")
        self._spawn(self._reap_loop(), "residency:reaper")

    async def close(self) -> None:
        """Stop the reaper and any load, fail every waiter (503 shutting down), stop every worker."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        for entry in self._all():
            if entry.load_task is not None:
                entry.load_task.cancel()
        tasks = [*self._tasks, *(e.load_task for e in self._all() if e.load_task is not None)]
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for entry in self._all():
            entry.fail_pending(lambda: GatewayError(ErrorCode.SHUTTING_DOWN, "the gateway is shutting down"))
        await asyncio.gather(*(e.deployment.worker.stop(grace_s=STOP_GRACE_S) for e in self._all()))

    # -- requests ---------------------------------------------------------------------------------------
    def check(self, deployment: Deployment) -> None:
        """Fail fast, before a request is admitted: an on-demand model's remembered failed load is returned at
        once until its backoff ends. (A model whose worker restarts itself is waited for in `ensure_loaded`.)"""
        entry = self._entry(deployment)
        if isinstance(self._decide(decisions.Requested(entry.name))[0], decisions.Refuse):
            raise entry.failed_error()

    def try_hold(self, deployment: Deployment) -> Hold | None:
        """A hold at once when the model is served now; None when it must be loaded or is still starting."""
        entry = self._entry(deployment)
        return entry.grant() if isinstance(self._decide(decisions.Requested(entry.name))[0], decisions.Grant) else None

    async def ensure_loaded(self, deployment: Deployment, *, wait_s: float | None = None) -> Hold:
        """Return a `Hold` on the model once it is READY, loading it (one load for every waiter) if needed.

        Raises a 503 `GatewayError` with Retry-After: the load's error (to every waiter), a remembered
        failure still in its backoff, or "still loading" after `wait_s` (the load itself goes on)."""
        entry = self._entry(deployment)
        effects = self._decide(decisions.Requested(entry.name))
        match effects[0]:
            case decisions.Grant():
                return entry.grant()
            case decisions.AwaitWorker():
                return await self._await_worker(entry, wait_s)
            case decisions.Refuse():
                raise entry.failed_error()
        waiter: asyncio.Future[Hold] = asyncio.get_running_loop().create_future()
        entry.pending.add(waiter)  # Enqueue
        self._start_loads(effects)
        started = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(waiter), wait_s)
        except TimeoutError:
            entry.pending.discard(waiter)
            if not waiter.done():  # else it was decided in the same instant: that answer stands
                raise entry.still_loading(time.monotonic() - started) from None
        except asyncio.CancelledError:
            entry.pending.discard(waiter)
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                waiter.result().release()
            raise
        finally:
            self._metrics.load_wait.labels(entry.name).observe(time.monotonic() - started)
        return waiter.result()

    async def _await_worker(self, entry: Resident, wait_s: float | None) -> Hold:
        """Wait for a worker that starts itself to be READY (booting or restarting); its 503 if it cannot be."""
        worker = entry.deployment.worker
        started = time.monotonic()
        try:
            await worker.await_ready(wait_s)
        except WorkerStartError as exc:
            worker.base_url()  # raises the worker's own 503: gave up (the cause), restarting, shutting down
            raise GatewayError(  # it became READY in the same instant it failed for us: ask for a retry
                ErrorCode.WORKER_UNAVAILABLE, f"model {entry.name!r}: {exc}; retry shortly", retry_after_s=1
            ) from None
        finally:
            self._metrics.load_wait.labels(entry.name).observe(time.monotonic() - started)
        return entry.grant()

    def progress(self, deployment: Deployment) -> Progress:
        """What a request waiting for this model waits for (for SSE comments and progress chunks)."""
        return self._entry(deployment).progress_now()

    def state(self, deployment: Deployment) -> Status:
        """For display (/v1/models, /ready, /admin/models); never a precondition."""
        return self._entry(deployment).status()

    def failure(self, deployment: Deployment) -> str | None:
        """Why a FAILED model is failed (for display); None for every other state."""
        return self._entry(deployment).failure()

    def on_worker_state(self, name: str, state: WorkerState) -> None:
        """Called on every worker state change: an on-demand worker that dies while serving frees its memory
        and is FAILED (with backoff) until a request loads it again."""
        entry = self._entries.get(name)
        if entry is None:
            return
        if entry.progress is None:  # no step of ours on it: its worker's own start (or restart) is under way
            entry.phase_started = time.monotonic()
        for effect in self._decide(decisions.WorkerChanged(name, state)):
            if isinstance(effect, decisions.RememberFailure):
                entry.backoff.served_for(effect.served_s)
                self._failed(entry, effect.message)
            else:
                self._publish(entry)

    # -- config reload (gateway.reload) -----------------------------------------------------------------
    def adopt(self, deployment: Deployment, memory: ModelMemory | None) -> None:
        """Take a deployment added by a reload: a fresh entry; one loaded at boot starts now."""
        self._memory[deployment.name] = memory or ModelMemory()
        self._entries[deployment.name] = Resident(deployment, self._memory[deployment.name])
        self._publish(self._entries[deployment.name])
        if deployment.policy.at_boot:
            deployment.worker.start()

    async def retire(self, deployment: Deployment) -> None:
        """A deployment a reload removed or replaced: its waiters are told, its holds end (up to
        `drain_timeout_s`), then its worker stops."""
        entry = self._entries.get(deployment.name)
        if entry is not None and entry.deployment is deployment:
            why = f"model {deployment.name!r} changed in a config reload; retry"
            entry.fail_pending(lambda: GatewayError(ErrorCode.WORKER_UNAVAILABLE, why, retry_after_s=1))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(entry.idle.wait(), self._settings.drain_timeout_s)
        async with self._lock:
            await deployment.worker.stop(grace_s=STOP_GRACE_S)
        if entry is not None and self._entries.get(deployment.name) is entry:
            del self._entries[deployment.name]

    # -- admin ------------------------------------------------------------------------------------------
    async def load(self, deployment: Deployment) -> None:
        """Load now (an admin request): a remembered failure does not wait for its backoff."""
        entry = self._entry(deployment)
        effects = self._decide(decisions.AdminLoad(entry.name))
        if effects and isinstance(effects[0], decisions.RetryWorker):
            deployment.worker.start(retry=True)  # a worker that gave up after a crash loop tries again
            hold = await self._await_worker(entry, self._settings.startup_timeout_s)
            hold.release()
            return
        if effects:  # ForgetFailure: no wait for its backoff, and a worker that gave up is retried
            entry.backoff.retry_at = None
            entry.retry_crashed = True
        hold = await self.ensure_loaded(deployment, wait_s=self._settings.startup_timeout_s)
        hold.release()

    async def unload(self, deployment: Deployment) -> None:
        """Unload now (an admin request), draining requests in flight up to `drain_timeout_s`."""
        entry = self._entry(deployment)
        if any(isinstance(effect, decisions.Refuse) for effect in self._decide(decisions.AdminUnload(entry.name))):
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"model {entry.name!r} is pinned (load: always): it is never unloaded",
                param="model",
            )
        async with self._lock:  # decided again in its turn: it may have been unloaded meanwhile
            for effect in self._decide(decisions.AdminUnload(entry.name)):
                if isinstance(effect, decisions.Unload):
                    await self._unload(entry, effect.reason, effect.why)

    def describe(self, deployment: Deployment) -> dict[str, Any]:
        """The admin view of one model (`Resident.describe`)."""
        return self._entry(deployment).describe()

    def budgets(self) -> dict[str, dict[str, int | None]]:
        """Per pool: the budget, what the models in memory hold (measured or estimated), and what is free."""
        return self.pools.summary([e.memory for e in self._resident()])

    # -- holds ------------------------------------------------------------------------------------------
    def _entry(self, deployment: Deployment) -> Resident:
        entry = self._entries.get(deployment.name)
        if entry is None:
            memory = self._memory.get(deployment.name) or ModelMemory()
            entry = Resident(deployment, memory)
            self._entries[deployment.name] = entry
            self._publish(entry)
        return entry

    def _all(self) -> list[Resident]:
        return [self._entry(d) for d in self._registry]

    # -- loading ----------------------------------------------------------------------------------------
    def _start_loads(self, effects: Sequence[decisions.Effect]) -> None:
        """Carry out the `StartLoad`s among `effects`: one load task for every waiter of the model."""
        for effect in effects:
            if isinstance(effect, decisions.StartLoad):
                entry = self._entries[effect.model]
                entry.load_task = asyncio.create_task(self._load(entry), name=f"load:{entry.name}")
                self._step(entry, "waiting for other loads and unloads to finish")

    async def _load(self, entry: Resident) -> None:
        """One load, for every waiter: its outcome is READY, FAILED (`_failed`, the error remembered) or, when
        every waiter gave up or a model to evict stayed busy, UNLOADED (a failure before it forgotten)."""
        try:
            async with self._lock:
                turn = self._decide(decisions.LoadTurn(entry.name))[0]
                if isinstance(turn, decisions.Forget):  # every waiter gave up while it waited for its turn
                    entry.error = None
                    return
                if await self._make_room(entry):  # MakeRoomAndStart
                    await self._start(entry)
        except GatewayError as exc:
            entry.error = None
            error = exc
            entry.fail_pending(lambda: GatewayError(error.code, error.message, retry_after_s=error.retry_after_s))
        except Exception as exc:
            log.exception("loading %s failed", entry.name)
            self._failed(entry, f"model {entry.name!r} could not be loaded: internal error ({type(exc).__name__})")
        finally:
            entry.load_task = None
            self._step(entry, None)

    async def _start(self, entry: Resident) -> None:
        worker = entry.deployment.worker
        before = self.pools.gpu_used(entry.memory.gpu_indices, entry.memory.host)
        started = time.monotonic()
        self._step(entry, f"starting its worker (needs {entry.memory.describe()})")
        log.info("loading %s (needs %s)", entry.name, entry.memory.describe())
        try:
            retry, entry.retry_crashed = entry.retry_crashed, False
            await worker.ensure_ready(self._settings.startup_timeout_s, retry=retry)
        except WorkerStartError as exc:
            await worker.stop(grace_s=2.0)
            self._metrics.model_loads.labels(entry.name, "failed").inc()
            self._failed(entry, f"model {entry.name!r} failed to load: {exc}")
            return
        entry.last_load_s = time.monotonic() - started
        entry.loads += 1
        self._measure(entry, before)
        self._metrics.model_loads.labels(entry.name, "ok").inc()
        self._metrics.load_duration.labels(entry.name).observe(entry.last_load_s)
        entry.error, entry.backoff.retry_at, entry.ready_at = None, None, time.monotonic()
        log.info("loaded %s in %.1f s: takes %s", entry.name, entry.last_load_s, entry.memory.describe())
        entry.grant_pending()  # READY: in this step, as `_load` ends

    def _failed(self, entry: Resident, message: str) -> None:
        backoff = entry.backoff.fail()
        entry.error = message
        log.error("%s; requests get this error for %.0f s, then the next one tries again", message, backoff)
        self._step(entry, None)
        entry.fail_pending(entry.failed_error)

    # -- memory -----------------------------------------------------------------------------------------
    def _resident(self) -> list[Resident]:
        """The models holding memory: those never evicted (pinned), and the others READY or DRAINING."""
        return [e for e in self._all() if not e.evictable or e.status() in (Status.READY, Status.DRAINING)]

    async def _make_room(self, entry: Resident) -> bool:
        """Unload what must go for `entry` to fit (`gateway.lifecycle.eviction`: idle models least recently used
        first, then busy ones, drained); False, the load failed with the numbers, when even that would not be
        enough. Raises when a model to unload stays busy past the drain bound."""
        residents = self._resident()
        candidates = [e for e in residents if e.evictable and e is not entry and e.status() is Status.READY]
        victims, short = choose_victims(self.pools, entry, residents, candidates)
        if short:
            self._failed(entry, no_room(self.pools, entry, residents, short))
            return False
        for victim in victims:
            await self._unload(victim, "memory", eviction_reason(victim, entry), for_entry=entry)
        return await self._wait_for_gpus(entry)

    async def _wait_for_gpus(self, entry: Resident) -> bool:
        """After unloads a GPU may take a moment to show the memory freed; never start a load that does not
        fit by NVML (a clear refusal beats an out-of-memory crash): False, the load failed, when it does not."""
        if not self.pools.live_gpus or not entry.memory.gpu_indices or entry.memory.host is not None:
            return True  # a cluster host's readings come with its agent's reports: no polling here
        deadline = time.monotonic() + GPU_RECOVERY_S
        while (short := shortfall(self.pools, entry, self._resident())) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.25)  # polling NVML: nothing signals freed GPU memory
        if short:
            self._failed(entry, no_room(self.pools, entry, self._resident(), short))
        return not short

    def _measure(self, entry: Resident, gpu_before: dict[int, int] | None = None) -> None:
        self.pools.measure(entry.memory, entry.deployment.worker.pid, gpu_before)
        self._publish(entry)

    # -- unloading --------------------------------------------------------------------------------------
    async def _unload(self, entry: Resident, reason: str, why: str, *, for_entry: Resident | None = None) -> None:
        """Drain (holds only end), then stop. Runs under the lock. Raises when the drain bound passes."""
        entry.draining = True
        self._step(entry, "unloading")
        if entry.holds:
            bound = self._settings.drain_timeout_s
            waiting = f"waiting for {entry.holds} request(s) on {entry.name!r} to finish (up to {bound:.0f} s)"
            entry.progress = waiting
            if for_entry is not None:
                self._step(for_entry, f"making room: {waiting}")
            log.info("to unload %s: %s", entry.name, waiting)
            try:
                await asyncio.wait_for(entry.idle.wait(), bound)
            except TimeoutError:
                for effect in self._decide(decisions.DrainExpired(entry.name)):
                    if isinstance(effect, decisions.ResumeServing):
                        entry.draining = False
                        self._step(entry, None)  # READY again
                        entry.grant_pending()
                raise GatewayError(
                    ErrorCode.WORKER_UNAVAILABLE,
                    f"could not unload {entry.name!r}"
                    + (f" to make room for {for_entry.name!r}" if for_entry else "")
                    + f": it still has {entry.holds} request(s) in flight after {bound:.0f} s; retry shortly",
                    retry_after_s=10,
                ) from None
        if for_entry is not None:
            self._step(for_entry, f"making room: unloading {entry.name!r}")
        log.warning("unloading %s (%s): %s", entry.name, reason, why)
        await entry.deployment.worker.stop(grace_s=STOP_GRACE_S)
        self._metrics.model_evictions.labels(entry.name, reason).inc()
        entry.backoff.reset()
        entry.draining, entry.error = False, None
        self._step(entry, None)  # UNLOADED
        self._start_loads(self._decide(decisions.Unloaded(entry.name)))  # requests that came while it drained

    async def _reap_loop(self) -> None:
        """Unload on-demand models idle for their `idle_unload_s`; refresh the measured host memory."""
        last_measure = 0.0
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            now = time.monotonic()
            for effect in self._decide(decisions.Tick()):
                if isinstance(effect, decisions.Unload):
                    entry = self._entries[effect.model]
                    entry.reaping = True
                    self._spawn(self._reap(entry), f"reap:{entry.name}")
            if now - last_measure >= MEASURE_INTERVAL_S:
                last_measure = now
                for entry in self._resident():
                    if entry.deployment.worker.state is WorkerState.READY:
                        self._measure(entry)

    async def _reap(self, entry: Resident) -> None:
        try:
            async with self._lock:  # decided again in its turn (a request may have come meanwhile), as the
                view = replace(entry.view(time.monotonic()), reaping=False)  # tick would without this unload
                for effect in decisions.decide({entry.name: view}, decisions.Tick()):
                    if isinstance(effect, decisions.Unload):
                        await self._unload(entry, effect.reason, effect.why)
        finally:
            entry.reaping = False

    async def _boot(self, entries: list[Resident]) -> None:
        """Models loaded at boot on GPUs start one after another (TurboMind sizes its KV cache from the memory free
        when it starts), each measured; a failed start is left to its supervisor's restarts."""
        async with self._lock:
            for entry in entries:
                before = self.pools.gpu_used(entry.memory.gpu_indices, entry.memory.host)
                try:
                    await entry.deployment.worker.ensure_ready(self._settings.startup_timeout_s)
                except WorkerStartError as exc:
                    log.error("model %s did not start: %s (its worker retries)", entry.name, exc)
                    continue
                self._measure(entry, before)

    # -- bookkeeping ------------------------------------------------------------------------------------
    def _decide(self, event: decisions.Event) -> tuple[decisions.Effect, ...]:
        """The scheduler's decision on `event` (`gateway.lifecycle.decisions`), from the models as they are now."""
        now = time.monotonic()
        entries = self._all() if isinstance(event, decisions.Tick) else [self._entries[event.model]]
        return decisions.decide({e.name: e.view(now) for e in entries}, event, closing=self._closing)

    def _step(self, entry: Resident, progress: str | None) -> None:
        """Say what the scheduler does to `entry` now (None: nothing) and publish its status."""
        if progress != entry.progress:
            entry.phase_started = time.monotonic()
        entry.progress = progress
        self._publish(entry)

    def _publish(self, entry: Resident) -> None:
        self._metrics.set_model_state(entry.name, entry.status().value, [s.value for s in Status])
        for pool, n in entry.memory.estimated.items():
            self._metrics.model_memory.labels(entry.name, pool, "estimated").set(n)
        for pool, n in entry.memory.measured.items():
            self._metrics.model_memory.labels(entry.name, pool, "measured").set(n)

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
