"""The Ray test harness: every test marked `ray` runs in a loopback-only network namespace.

Ray finds its own address by probing a public DNS address and may contact the machine's non-loopback
address, so a `ray` test is never run in the pytest process itself: `pytest_runtest_protocol` runs it again,
alone, in `unshare -n -p -f --mount-proc` (a new network namespace with only `lo`, brought up; a new PID
namespace, so every Ray process and worker dies with the test) and reports the child's outcome as its own.
In there the cluster always uses 127.0.0.1 as its node IP address, a capped object store (80 MB) and no
dashboard (`local_cluster`). Where the namespace cannot be made (not root, no unshare), the test skips
with that reason; CI runs as root and must run it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from _pytest.reports import TestReport

from tests.conftest import REPO

IN_NETNS = "VOLTGATE_TEST_IN_NETNS"
NODE_IP = "127.0.0.1"
OBJECT_STORE_BYTES = 80 * 1024 * 1024
CHILD_TIMEOUT_S = 900
_UNSHARE = ["unshare", "-n", "-p", "-f", "--mount-proc", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


@functools.cache
def netns_problem() -> str | None:
    """Why a loopback-only namespace cannot be made here, or None when it can."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2) for a loopback-only network namespace"
    try:
        done = subprocess.run([*_UNSHARE, "true"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a loopback-only network namespace: {exc}"
    if done.returncode != 0:
        return f"cannot create a loopback-only network namespace (needs root): {done.stderr.strip()[:200]}"
    return None


def _report(item: pytest.Item, when: str, outcome: str, longrepr: Any = None, sections: Any = ()) -> None:
    report = TestReport(item.nodeid, item.location, dict.fromkeys(item.keywords, 1), outcome, longrepr, when,
                        sections=list(sections))  # fmt: skip
    item.ihook.pytest_runtest_logreport(report=report)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    if item.get_closest_marker("ray") is None or os.environ.get(IN_NETNS):
        return None  # not a Ray test, or already inside the namespace: the ordinary protocol
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    problem = netns_problem()
    if problem is not None:
        _report(item, "setup", "skipped", (str(item.path), item.location[1], f"Skipped: {problem}"))
    else:
        _run_in_netns(item)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _run_in_netns(item: pytest.Item) -> None:
    argv = [*_UNSHARE, sys.executable, "-m", "pytest", item.nodeid, "-q", "-rs", "-p", "no:cacheprovider"]
    env = {**os.environ, IN_NETNS: "1"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=REPO, env=env,
                              check=False)  # fmt: skip
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        _report(item, "call", "failed", f"no outcome within {CHILD_TIMEOUT_S} s in the namespace: {exc}")
        return
    _report(item, "setup", "passed")
    if done.returncode == 0 and " skipped" in output and " passed" not in output:
        reason = next((line for line in output.splitlines() if line.startswith("SKIPPED")), "skipped in the namespace")
        _report(item, "call", "skipped", (str(item.path), item.location[1], reason))
    elif done.returncode == 0:
        _report(item, "call", "passed", sections=[("namespace output", output[-4000:])])
    else:
        _report(
            item,
            "call",
            "failed",
            f"failed in the loopback-only namespace (exit {done.returncode}):\n{output[-12000:]}",
        )
    _report(item, "teardown", "passed")


@dataclass
class LocalCluster:
    """A `ray.cluster_utils.Cluster` and its "host" nodes by name (for `cluster.remove_node`)."""

    cluster: Any
    nodes: dict[str, Any]


@pytest.fixture
def local_cluster() -> Iterator[LocalCluster]:
    """A head (no hosts' resources) and two "hosts", `a` and `b`, each declaring `voltgate_host:<name>`, with
    this process connected as the driver. Only inside the namespace (the harness puts every `ray` test there)."""
    assert os.environ.get(IN_NETNS), "a Ray cluster is only ever started inside the loopback-only namespace"
    ray = pytest.importorskip("ray", reason="needs the cluster extra: pip install -e '.[cluster]'")
    from ray.cluster_utils import Cluster

    from gateway.cluster.ray_agent import NAMESPACE, host_resource

    node = {"node_ip_address": NODE_IP, "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "num_cpus": 1})
    try:
        nodes = {h: cluster.add_node(**node, num_cpus=1, resources={host_resource(h): 1}) for h in ("a", "b")}
        ray.init(address=cluster.address, namespace=NAMESPACE, _node_ip_address=NODE_IP, log_to_driver=False)
        cluster.wait_for_nodes()
        yield LocalCluster(cluster, nodes)
    finally:
        ray.shutdown()
        cluster.shutdown()
