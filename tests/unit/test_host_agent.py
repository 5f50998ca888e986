"""The host agent's own work, in-process (no Ray, no worker started): its inventory, which model files it has,
and a start it cannot make answered as a FAILED report that says why (never an error loop)."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.base import DeploymentPlan, EngineName, LMDeployOptions
from gateway.cluster.agent import UnknownWorker
from gateway.cluster.host_agent import LocalHostAgent
from gateway.lifecycle.workers import WorkerState


async def test_it_reports_its_inventory_and_which_files_it_holds(tmp_path: Path) -> None:
    (tmp_path / "here.gguf").write_bytes(b"GGUF")
    agent = LocalHostAgent("ws-3", bind_host="10.0.0.3", gpus="2xv100-16gb")
    report = await agent.describe([str(tmp_path / "here.gguf"), str(tmp_path / "gone.gguf")])
    assert report.host == "ws-3" and report.address == "10.0.0.3"
    assert [g.total_bytes for g in report.inventory.gpus] == [16_160 << 20] * 2
    assert report.files == {str(tmp_path / "here.gguf"): True, str(tmp_path / "gone.gguf"): False}
    assert report.workers == []
    with pytest.raises(UnknownWorker, match="runs no worker 'm'"):
        await agent.worker("m")
    await agent.stop_worker("m")  # unknown names are no error


async def test_a_start_this_host_cannot_make_is_a_failed_report_naming_why() -> None:
    plan = DeploymentPlan(model="big", engine=EngineName.LMDEPLOY, source_path=Path("/models/big"),
                          model_format="hf", context_tokens=4096,
                          lmdeploy=LMDeployOptions(executable="/nonexistent/lmdeploy"))  # fmt: skip
    agent = LocalHostAgent("dgx", bind_host="10.0.0.1", gpus="v100-32gb")
    report = await agent.start_worker(plan, "token", wait_s=5)
    assert report.state is WorkerState.FAILED
    assert report.last_error and "host 'dgx' cannot start 'big'" in report.last_error
    assert "pip install 'voltgate[lmdeploy]'" in report.last_error
    assert (await agent.describe()).workers == []


def test_binding_every_interface_needs_the_address_to_advertise() -> None:
    with pytest.raises(ValueError, match="address other hosts reach it at"):
        LocalHostAgent("h", bind_host="0.0.0.0", gpus="none")
    assert LocalHostAgent("h", bind_host="0.0.0.0", advertise="10.0.0.9", gpus="none").host == "h"
