"""RemoteHandle: the `gateway.lifecycle.workers.WorkerHandle` of an OpenAI endpoint on another host (a `remote`
source), driven like any other worker by `gateway.lifecycle.supervisor.WorkerMachine` under
`gateway.lifecycle.policy.REMOTE`.

Nothing is started or stopped here: `launch()` remembers the URL, healthy is `GET <root>/v1/models` answering
200, and the worker ends when that check fails. The machine then restarts it (checks again) forever, never
giving up, with the capped backoff that bounds how soon it is READY again (docs/lifecycle.md, "A remote
endpoint").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Sequence

import httpx

from gateway.lifecycle.workers import Wording, WorkerExit, WorkerStartError

log = logging.getLogger("voltgate.remote")

HEALTH_INTERVAL_S = 5.0
"""Between two checks while the endpoint answers."""
POLL_INTERVAL_S = 0.5
"""Between two checks while a start waits for an answer."""
START_WINDOW_S = 1.0
"""How long one start waits for an answer before it fails (and the backoff, then another start, follow)."""
CHECK_TIMEOUT_S = 5.0
"""One check's timeout."""


def remote_wording(root_url: str) -> Wording:
    """What a model's 503s and broken calls say of its endpoint: never "loading" or "restarted"."""
    return Wording(
        loading=f"is waiting for its endpoint {root_url} to answer",
        restarting=f"is waiting for its endpoint {root_url} to answer again",
        unavailable=f"is unavailable: its endpoint {root_url} is not answering",
        retried="is checked again every few seconds",
        lost=f"the connection to its endpoint {root_url} was lost",
        lost_next="",
        starting_phase=f"waiting for its endpoint {root_url} to answer",
        restarting_phase=f"waiting for its endpoint {root_url} to answer again",
        loads=False,
    )


class RemoteHandle:
    """Health checks of one remote endpoint, as a `WorkerHandle`; it keeps no lifecycle state."""

    pid: int | None = None  # nothing runs on this host

    def __init__(
        self,
        name: str,
        root_url: str,
        *,
        client: httpx.AsyncClient,
        interval_s: float = HEALTH_INTERVAL_S,
        poll_s: float = POLL_INTERVAL_S,
        start_window_s: float = START_WINDOW_S,
    ) -> None:
        self.name = name
        self.root_url = root_url.rstrip("/")
        self.wording = remote_wording(self.root_url)
        self._client = client
        self._interval_s = interval_s
        self._poll_s = poll_s
        self._start_window_s = start_window_s
        self._launched = False
        self._ended = asyncio.Event()  # the endpoint stopped answering, or `terminate()`
        self._errors: collections.deque[str] = collections.deque(maxlen=8)

    def url(self) -> str | None:
        return self.root_url if self._launched else None

    def alive(self) -> bool:
        return self._launched and not self._ended.is_set()

    def log_lines(self) -> Sequence[str]:
        """The last failed checks (there is no log of another host's process to quote)."""
        return list(self._errors)

    async def launch(self) -> None:
        self._launched = True
        self._ended = asyncio.Event()

    async def wait_healthy(self) -> None:
        """Check every `poll_s` until it answers 200; `WorkerStartError` naming the endpoint and the last error
        when it has not within `start_window_s`."""
        deadline = asyncio.get_running_loop().time() + self._start_window_s
        while True:
            failed = await self._check()
            if failed is None:
                return
            if asyncio.get_running_loop().time() >= deadline:
                self._ended.set()
                raise WorkerStartError(f"its endpoint {self.root_url} is not answering: {failed.message}", failed.cause)
            await asyncio.sleep(self._poll_s)

    async def wait_exit(self) -> WorkerExit:
        """Check every `interval_s` while it answers; return when a check fails (or on `terminate()`)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), self._interval_s)
            if self._ended.is_set():
                return WorkerExit("terminated", f"the checks of its endpoint {self.root_url} were stopped")
            failed = await self._check()
            if failed is not None:
                self._ended.set()
                message = f"its endpoint {self.root_url} stopped answering: {failed.message}"
                log.warning("remote %s: %s", self.name, message)
                return WorkerExit(failed.cause, message)

    async def terminate(self, grace_s: float) -> None:
        """Stop checking; nothing else to end on another host."""
        del grace_s
        self._ended.set()
        self._launched = False

    async def _check(self) -> WorkerExit | None:
        """One `GET <root>/v1/models`: None when it answers 200, else what went wrong (`unreachable`: no answer,
        `unhealthy`: another status)."""
        try:
            response = await self._client.get(self.root_url + "/v1/models", timeout=CHECK_TIMEOUT_S)
        except httpx.HTTPError as exc:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            failed = WorkerExit("unreachable", f"GET /v1/models: {detail}")
        else:
            if response.status_code == 200:
                return None
            failed = WorkerExit("unhealthy", f"GET /v1/models answered {response.status_code}")
        self._errors.append(failed.message)
        return failed
