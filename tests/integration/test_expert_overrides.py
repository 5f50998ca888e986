"""The experts-in-host-memory override (`--n-cpu-moe`, issue 39) takes the CPU buffer type from the libggml-cpu
that llama-cpp-python loaded: from `LLAMA_CPP_LIB_PATH` when that is set (a llama.cpp build of one's own, as the
GPU machine's), not from the package's `lib/`, which such a setup may lack (the GPU regression's MoE pair failed
"ships no libggml-cpu" before). A child process: the variable is read when llama_cpp is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROBE = (
    "from backends.llamacpp.worker import native; print(native._ggml_cpu()._name); "
    "print(native.expert_overrides(2)[2].pattern is None)"
)


def probe(env: dict[str, str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_the_cpu_backend_comes_from_where_llama_cpp_loaded_its_libraries(tmp_path: Path) -> None:
    for lib in (Path(llama_cpp.__file__).parent / "lib").iterdir():
        (tmp_path / lib.name).symlink_to(lib)
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    own, ended = probe({**env, "LLAMA_CPP_LIB_PATH": str(tmp_path)})
    assert own.startswith(str(tmp_path)) and "libggml-cpu" in own and ended == "True"
    package, _ = probe(env)
    assert package.startswith(str(Path(llama_cpp.__file__).parent / "lib")), package
