"""A worker that dies by a real SIGSEGV on every request is not restarted forever in silence.

The worker is `tests.fakes.fake_worker --segv-on-request`: a real process that kills itself with SIGSEGV when
a request arrives (as llama.cpp's AMX kernels did on the first decode). The supervisor must give up after
`crash_limit` crashes in a row with no request served between them, name the signal and the doctor in the
503, count each crash by cause, and try again only when asked (`start(retry=True)`: an admin load).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.errors import GatewayError
from gateway.lifecycle.supervisor import WorkerMachine
from gateway.lifecycle.workers import WorkerState
from tests.integration.test_supervisor import fake, supervised, wait_for

pytestmark = pytest.mark.integration


async def _crash_once(client: httpx.AsyncClient, worker: WorkerMachine) -> None:
    await wait_for(lambda: worker.state is WorkerState.READY, 30)
    with pytest.raises(httpx.HTTPError):
        await client.post(worker.base_url() + "/v1/chat/completions", json={"messages": []}, timeout=10)
    await wait_for(lambda: worker.state is not WorkerState.READY, 10)


async def test_three_segfaults_in_a_row_mark_the_worker_failed_with_the_signal() -> None:
    crashes: list[tuple[str, str]] = []
    async with httpx.AsyncClient() as client:
        worker = supervised(
            "m", fake("--segv-on-request"), client=client, crash_limit=3, on_crash=lambda *a: crashes.append(a)
        )
        worker.start()
        try:
            for _ in range(3):
                await _crash_once(client, worker)
            await wait_for(lambda: worker.gave_up is not None, 10)
            assert crashes == [("m", "SIGSEGV")] * 3
            assert worker.state is WorkerState.FAILED
            await asyncio.sleep(2.5)  # past the backoff it would have used: no fourth start
            assert worker.state is WorkerState.FAILED and worker.pid is None
            with pytest.raises(GatewayError) as refused:
                worker.base_url()
            assert refused.value.status == 503
            assert "SIGSEGV" in refused.value.message and "voltgate doctor" in refused.value.message
            assert "SIGSEGV" in (worker.last_error or "")
            with pytest.raises(Exception, match="SIGSEGV"):
                await worker.await_ready(5)  # a waiting request is told at once, not after a time-out
            worker.start()  # a plain start (a request) does not restart a worker that gave up
            assert worker.pid is None
            worker.start(retry=True)  # an admin load or a config reload does
            await wait_for(lambda: worker.state is WorkerState.READY, 30)
            assert worker.gave_up is None
        finally:
            await worker.stop(grace_s=2)


async def test_a_request_served_between_crashes_ends_the_streak() -> None:
    async with httpx.AsyncClient() as client:
        worker = supervised("m", fake("--crash-after", "2"), client=client, crash_limit=2)
        worker.start()
        try:
            for _ in range(3):  # each life serves one request, then dies on the second
                await wait_for(lambda: worker.state is WorkerState.READY, 30)
                ok = await client.post(worker.base_url() + "/v1/chat/completions", json={"messages": []})
                assert ok.status_code == 200
                worker.note_success()
                with pytest.raises(httpx.HTTPError):
                    await client.post(worker.base_url() + "/v1/chat/completions", json={"messages": []})
                await wait_for(lambda: worker.state is not WorkerState.READY, 10)
            assert worker.gave_up is None  # three crashes, but never two in a row without a served request
        finally:
            await worker.stop(grace_s=2)
