"""`voltgate serve --cluster` over a local Ray cluster (a head and hosts `a` and `b`, in a loopback-only
namespace, tests/ray/conftest.py): the real gateway process, real llama.cpp workers on the embedded SmolLM2
GGUF started by each host's agent, the openai SDK.

One scenario, one cluster (the cluster takes most of the time on a small box): `alpha` may run only on `a`,
`gamma` only on `b`, `beta` anywhere (the plan puts it on `b`), `delta` with two replicas anywhere (the plan
spreads them: `delta` on `b`, `delta@2` on `a`).

1. a request is served on each host; `/v1/placement`, `/metrics` and the status page name each model's host;
2. host `b` is killed while `beta` streams: the stream ends with an error frame and `[DONE]`; once `b` is
   declared lost, `delta` answers at once from its replica on `a`; `beta` is re-placed on `a` and answers
   again (the time is measured); `gamma` gets a 503 naming it and the lost host;
3. host `b` joins again: `gamma` is served there again;
4. host `b` freezes (every process of its node stopped with SIGSTOP, standing in for a partition) until the
   gateway declares it lost, then resumes: the gateway takes it back without a restart of Ray there, stops the
   worker it kept from before (`gamma`'s), and serves `gamma` there again.

With VOLTGATE_RECORD=PATH the measured times are appended to PATH as one JSON line (docs/cluster.md's numbers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

pytest.importorskip("ray", reason="needs the cluster extra: pip install -e '.[cluster]'")

# isort: split

from gateway.cluster.ray_agent import host_resource
from tests.conftest import free_port
from tests.ray.conftest import NODE_IP, OBJECT_STORE_BYTES, LocalCluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]

GUARD_S = 240.0  # a guard against a hang, never a speed assertion
HOST_SILENCE_S = 12  # server.host_silence_s: the frozen host is declared lost after this (30 by default)


def _config(path: Path, gguf: Path) -> Path:
    source = f"sources: [{{gguf: {gguf}}}], context: 512"
    path.write_text(
        f"gpus: none\nserver: {{host_silence_s: {HOST_SILENCE_S}}}\nmodels:\n"
        f"  - {{name: alpha, {source}, hosts: [a]}}\n"
        f"  - {{name: beta, {source}}}\n"
        f"  - {{name: gamma, {source}, hosts: [b]}}\n"
        f"  - {{name: delta, {source}, replicas: 2}}\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def gateway(local_cluster: LocalCluster, smollm2_path: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The real gateway, `voltgate serve --cluster ray:ADDRESS`, until every model is ready."""
    port = free_port()
    log = tmp_path / "gateway.log"
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(_config(tmp_path / "c.yaml", smollm2_path)),
            "--host", NODE_IP, "--port", str(port), "--cluster", f"ray:{local_cluster.cluster.address}"]  # fmt: skip
    env = {**os.environ, "VOLTGATE_HOST_GPUS": "a=none,b=none"}
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://{NODE_IP}:{port}"
    try:
        _until(lambda: httpx.get(base + "/ready", timeout=5).status_code == 200, log, "every model ready")
        yield base, log
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        # exit 0 after a clean drain, not Ray's SIGTERM handler's 15 (what systemd records as a failure)
        assert code == 0, f"exit {code} after SIGTERM:\n{log.read_text()[-3000:]}"


def _until(check: Callable[[], bool], log: Path, what: str) -> float:
    """Seconds until `check()` is true (exceptions count as false); fails with the gateway's log after GUARD_S."""
    start = time.monotonic()
    while time.monotonic() - start < GUARD_S:
        try:
            if check():
                return time.monotonic() - start
        except (httpx.HTTPError, openai.APIError):
            pass
        time.sleep(0.25)
    lines = [line for line in log.read_text(errors="replace").splitlines() if "voltgate.access" not in line]
    pytest.fail(f"not {what} within {GUARD_S:.0f} s; gateway log (access lines left out):\n" + "\n".join(lines)[-8000:])


def _hosts(base: str) -> dict[str, str | None]:
    data = httpx.get(base + "/v1/placement", timeout=10).json()
    return {d["model"]: d["host"] for d in data["decisions"]}


def _ask(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                           max_tokens=8, temperature=0)  # fmt: skip
    return reply.choices[0].message.content or ""


def _stream_while_killing(base: str, kill: Callable[[], None]) -> list[str]:
    """Stream from `beta` and kill its host after the third frame: every SSE data line, to the end."""
    body = {"model": "beta", "stream": True, "max_tokens": 460, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Count from 1 to 1000, one number per line."}]}  # fmt: skip
    # ignore_eos: the answer cannot end on its own before the kill lands (it once ended after one token)
    lines: list[str] = []
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=120)) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line.removeprefix("data: "))
                if len(lines) == 3:
                    kill()
    return lines


def test_serve_over_two_hosts_survives_losing_one_and_regains_it(
    local_cluster: LocalCluster, gateway: tuple[str, Path]
) -> None:
    import ray

    base, log = gateway
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    assert _hosts(base) == {"alpha": "a", "beta": "b", "gamma": "b", "delta": "b", "delta@2": "a"}
    assert _ask(client, "alpha") and _ask(client, "beta")  # a request served on each host
    metrics = httpx.get(base + "/metrics", timeout=10).text
    assert 'voltgate:model_host{host="b",model="beta"} 1.0' in metrics
    assert 'voltgate:model_host{host="a",model="alpha"} 1.0' in metrics
    assert 'pool="a:host"' in metrics and 'pool="b:host"' in metrics  # each host's own memory pools
    status = httpx.get(base + "/ui/api/status", timeout=10).json()  # the status page: bars and models per host
    assert {p["pool"]: p["host"] for p in status["pools"]} == {"a:host": "a", "b:host": "b"}
    hosts = {m["name"]: m["cluster_host"] for m in status["models"]}
    assert hosts == {"alpha": "a", "beta": "b", "gamma": "b", "delta": "b", "delta@2": "a"}

    killed: list[float] = []

    def kill_b() -> None:
        killed.append(time.monotonic())
        local_cluster.cluster.remove_node(local_cluster.nodes["b"], False)  # SIGKILL: the host dies

    lines = _stream_while_killing(base, kill_b)
    assert killed, "the stream ended before the host was killed"
    assert lines[-1] == "[DONE]", lines[-3:]
    errors = [frame["error"] for frame in map(json.loads, lines[:-1]) if "error" in frame]  # not the word in a text
    assert errors, f"no error frame before [DONE]: {lines[-3:]}"
    assert "host 'b'" in errors[0]["message"] and "re-placed" in errors[0]["message"], errors  # not "restarted"
    stream_cut_s = time.monotonic() - killed[0]
    _until(lambda: _hosts(base)["gamma"] is None, log, "host b declared lost")
    assert _ask(client, "delta")  # at once: its replica on host a serves while the one from b is re-placed
    delta_s = time.monotonic() - killed[0]

    answered_s = _until(lambda: bool(_ask(client, "beta")), log, "beta answering again after host b's loss")
    replaced_s = time.monotonic() - killed[0]
    assert _hosts(base)["beta"] == "a"  # re-placed on the remaining host
    with pytest.raises(openai.APIStatusError) as refused:
        _ask(client, "gamma")
    assert refused.value.status_code == 503
    message = str(refused.value.body)
    assert "gamma" in message and "host 'b' is lost" in message, message
    assert _ask(client, "alpha")  # host a served on throughout

    dead = local_cluster.nodes["b"].node_id

    def b_dead() -> bool:
        return not any(n["NodeID"] == dead and n["Alive"] for n in ray.nodes())  # type: ignore[no-untyped-call]

    _until(b_dead, log, "host b seen dead by Ray")
    joined = time.monotonic()
    node: dict[str, Any] = {"node_ip_address": NODE_IP, "object_store_memory": OBJECT_STORE_BYTES,
                            "include_dashboard": False}  # fmt: skip
    local_cluster.nodes["b"] = local_cluster.cluster.add_node(**node, num_cpus=1, resources={host_resource("b"): 1})
    _until(lambda: bool(_ask(client, "gamma")), log, "gamma served again after host b rejoined")
    rejoined_s = time.monotonic() - joined
    assert _hosts(base)["gamma"] == "b"
    assert _hosts(base)["beta"] == "a"  # nothing serving was moved back
    assert _hosts(base)["delta"] == "a"  # re-placed beside its replica: the one host there was

    frozen_s, back_s = _freeze_b_until_lost_then_resume(local_cluster, base, log, client)

    record = os.environ.get("VOLTGATE_RECORD")
    if record:  # one JSON line per run (bench/results/2026-12-02-cluster/serve_host_loss.jsonl)
        with Path(record).open("a", encoding="utf-8") as out:
            out.write(json.dumps({"date": time.strftime("%Y-%m-%d"), "stream_cut_s": round(stream_cut_s, 2),
                                  "beta_answers_again_s": round(replaced_s, 2), "beta_polled_s": round(answered_s, 2),
                                  "delta_replica_answers_s": round(delta_s, 2),
                                  "gamma_served_after_rejoin_s": round(rejoined_s, 2),
                                  "freeze_declared_lost_s": round(frozen_s, 2),
                                  "gamma_served_after_resume_s": round(back_s, 2)}) + "\n")  # fmt: skip


def _node_tree(node: Any) -> list[int]:
    """Every process of a Ray node: its own (raylet and helpers) and all their descendants (its workers, the
    agent actor, the llama.cpp workers that agent started), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree = [process.pid for _, process in node.live_processes()]
    for pid in tree:  # grows while it is walked: breadth first
        tree.extend(child for child, parent in parents.items() if parent == pid and child not in tree)
    return tree


def _freeze_b_until_lost_then_resume(
    local_cluster: LocalCluster, base: str, log: Path, client: openai.OpenAI
) -> tuple[float, float]:
    """Step 4: the seconds until the frozen host is declared lost, and until `gamma` answers after the resume."""
    node = local_cluster.nodes["b"]
    pids = _node_tree(node)
    started = time.monotonic()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        _until(lambda: _hosts(base)["gamma"] is None, log, "host b declared lost while frozen")
        frozen_s = time.monotonic() - started
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert frozen_s < 60, "froze past ~64 s, when a resumed raylet takes its workers down: not this case"
    resumed = time.monotonic()
    _until(lambda: bool(_ask(client, "gamma")), log, "gamma served again after host b resumed")
    back_s = time.monotonic() - resumed
    assert _hosts(base) == {"alpha": "a", "beta": "a", "gamma": "b", "delta": "a", "delta@2": "a"}
    assert node.node_id == local_cluster.nodes["b"].node_id  # the same Ray node: nothing restarted
    text = log.read_text(errors="replace")
    assert "host b is back: stopping its leftover worker gamma" in text, text[-4000:]
    return frozen_s, back_s
