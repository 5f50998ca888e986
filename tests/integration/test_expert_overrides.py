"""`native.expert_overrides`: the tensor buffer overrides behind `--n-cpu-moe` (llama.cpp's patterns, null-ended),
and where their CPU buffer type comes from: the libggml-cpu that llama-cpp-python loaded, from
`LLAMA_CPP_LIB_PATH` when that is set (a llama.cpp build of one's own, as the GPU machine's), not from the
package's `lib/`, which such a setup may lack (the GPU regression's MoE pair failed "ships no libggml-cpu"
before). That one runs in a child process: the variable is read when llama_cpp is imported."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest

from backends.llamacpp.worker.native import expert_overrides

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


def test_none_for_no_layers_one_pattern_per_layer_otherwise_and_one_for_all() -> None:
    assert expert_overrides(0) is None
    two = expert_overrides(2)
    assert two is not None and len(two) == 3
    experts = rb"\.ffn_(up|down|gate)_(ch|)exps"
    assert [e.pattern for e in two] == [rb"blk\.0" + experts, rb"blk\.1" + experts, None]
    assert two[0].buft and two[0].buft == two[1].buft and two[2].buft is None  # the CPU buffer type, then the end
    every = expert_overrides(-1)
    assert every is not None and len(every) == 2


def test_the_patterns_match_the_experts_of_their_layers_only() -> None:
    two = expert_overrides(2)
    assert two is not None
    patterns = [re.compile(e.pattern.decode()) for e in two if e.pattern]
    moved = [n for n in ("blk.0.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight", "blk.1.ffn_gate_exps.weight",
                         "blk.2.ffn_up_exps.weight", "blk.0.ffn_up_shexp.weight", "blk.0.attn_q.weight",
                         "blk.10.ffn_up_exps.weight") if any(p.search(n) for p in patterns)]  # fmt: skip
    assert moved == ["blk.0.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight", "blk.1.ffn_gate_exps.weight"]
