"""Where and how a result was measured: command, git commit, host, CPU/GPU, package versions, model shape."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
_PACKAGES = ("llama-cpp-python", "httpx", "uvicorn", "starlette", "fastapi", "lmdeploy")


def command_line() -> str:
    """The exact command that is running, as a shell would have to type it."""
    return shlex.join(sys.orig_argv)


def _run(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=REPO, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_state() -> dict[str, Any]:
    commit = _run(["git", "rev-parse", "HEAD"])
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "commit": commit or "none (no commit yet)",
        "branch": _run(["git", "rev-parse", "--abbrev-ref", "HEAD"]),
        "dirty": bool(dirty) if dirty is not None else None,
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def gpus() -> list[dict[str, str]]:
    """GPUs as nvidia-smi reports them; empty when there is no NVIDIA driver."""
    if shutil.which("nvidia-smi") is None:
        return []
    out = _run(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"])
    rows = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            rows.append(dict(zip(("index", "name", "memory_total", "driver"), parts, strict=True)))
    return rows


def packages() -> dict[str, str]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def hardware() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "memory_bytes": memory_bytes(),
        "gpus": gpus(),
    }


def gguf_shape(path: Path) -> dict[str, Any]:
    """Architecture, shape and quantisation of a GGUF file from its header (the `gguf` package)."""
    from gguf import GGUFReader  # imported here: only needed when a GGUF is named

    reader = GGUFReader(str(path))
    fields: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if not fld.types or key.startswith(("tokenizer.", "general.license")):
            continue
        try:
            value = fld.contents()
        except Exception:  # odd field types are simply skipped
            continue
        if isinstance(value, (int, float, str)):
            fields[key] = value
    arch = fields.get("general.architecture", "")
    keys = (
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "context_length",
    )
    tensor_types: dict[str, int] = {}
    for tensor in reader.tensors:
        tensor_types[tensor.tensor_type.name] = tensor_types.get(tensor.tensor_type.name, 0) + 1
    return {
        "path": str(path),
        "file_bytes": path.stat().st_size,
        "name": fields.get("general.name"),
        "architecture": arch,
        "file_type": fields.get("general.file_type"),
        **{k.replace(".", "_"): fields.get(f"{arch}.{k}") for k in keys},
        "parameters": sum(int(t.n_elements) for t in reader.tensors),
        "tensor_types": tensor_types,
    }


def collect(**extra: Any) -> dict[str, Any]:
    """Everything a result file needs to say where it came from; `extra` is merged in last."""
    return {
        "command": command_line(),
        "cwd": os.getcwd(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": git_state(),
        "hardware": hardware(),
        "python": platform.python_version(),
        "packages": packages(),
        **extra,
    }
