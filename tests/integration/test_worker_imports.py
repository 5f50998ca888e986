"""The llama.cpp worker loads llama.cpp's shared libraries before numpy's.

On the GPU machine (2026-12-01: CUDA build of llama.cpp, Python 3.12, numpy 2.5.2) every process that had
imported numpy before llama_cpp died with SIGSEGV inside `llama_model_load_from_file`, and every process that
imported llama_cpp first loaded and served (bench/results/2026-12-01-gpu-h200-session4/README.md). The order
cannot be checked for the crash here (the CPU build does not crash either way), so this pins the order itself.
"""

from __future__ import annotations

import subprocess
import sys


def _finished_imports(*args: str) -> list[str]:
    """Module names in the order their imports finished (`-X importtime`)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=120, check=True
    )
    return [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]


def test_the_worker_imports_llama_cpps_library_before_numpy() -> None:
    names = _finished_imports("-m", "backends.llamacpp.worker", "--help")
    assert "numpy" in names and "llama_cpp.llama_cpp" in names
    assert names.index("llama_cpp.llama_cpp") < names.index("numpy")


def test_the_check_sees_the_wrong_order_when_numpy_comes_first() -> None:
    names = _finished_imports("-c", "import numpy, llama_cpp")
    assert names.index("numpy") < names.index("llama_cpp.llama_cpp")


def test_the_gpu_hybrid_memory_check_imports_llama_cpps_library_before_numpy() -> None:
    """bench.gpu.hybrid_memory loads llama.cpp in its own process; with numpy first it crashed on the GPU machine
    (2026-12-07: SIGSEGV in the vocabulary's regex, bench/results/2026-12-07-gpu-h100-hybrid-moe-8b/)."""
    names = _finished_imports("-m", "bench.gpu.hybrid_memory", "--help")
    assert "numpy" in names and "llama_cpp.llama_cpp" in names
    assert names.index("llama_cpp.llama_cpp") < names.index("numpy")
