"""A mixture-of-experts GGUF through the real gateway and worker, its routed experts kept in host memory.

Issue 39: the tiny random-weight Qwen3-MoE (`tests.fixtures.tiny_moe`) is inspected (experts, active experts)
and served with `llamacpp.n_cpu_moe` set, which the worker hands to llama.cpp as tensor buffer overrides (the
routed experts of those layers in the CPU's buffer, as `llama-server --n-cpu-moe`). On this CPU-only machine
every tensor is in host memory anyway, so this checks the path (the flag, the override list llama.cpp accepts,
a model that loads and answers); where the experts end up on a GPU is the GPU machine's to check.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.placement.inspection import inspect_gguf
from tests.conftest import free_port
from tests.e2e.conftest import Gateway, model_entry, running_gateway, write_config
from tests.e2e.streams import worker_processes
from tests.fixtures.tiny_moe import N_EXPERT, N_EXPERT_USED, N_LAYER, write_tiny_moe

pytestmark = pytest.mark.e2e

MOE = "tiny-moe"


@pytest.fixture(scope="module")
def moe_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_moe(smollm2_path, tmp_path_factory.mktemp("moe") / "tiny-moe.gguf")


@pytest.fixture(scope="module")
def moe_gateway(moe_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("moe-gateway")
    entry = model_entry(moe_path, MOE, context=1024, concurrency=2, llamacpp={"n_threads": 1, "n_cpu_moe": 2})
    with running_gateway(write_config(tmp, moe_path, free_port(), models=[entry]), tmp / "gateway.log") as gateway:
        yield gateway


def test_the_moe_shape_is_read_from_the_gguf(moe_path: Path) -> None:
    shape = inspect_gguf(moe_path).shape
    assert shape is not None
    assert (shape.n_layers, shape.n_experts, shape.n_experts_used) == (N_LAYER, N_EXPERT, N_EXPERT_USED)


def test_a_moe_with_experts_in_host_memory_answers_chat_and_completions(moe_gateway: Gateway) -> None:
    (worker,) = worker_processes(moe_gateway)
    argv = worker.cmdline()
    assert argv[argv.index("--n-cpu-moe") + 1] == "2"
    # llama.cpp took the override list: it warns that overridden tensors are read through mmap
    assert "tensor overrides to CPU" in moe_gateway.log()
    client = moe_gateway.client()
    chat = client.chat.completions.create(
        model=MOE, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0
    )
    assert chat.usage is not None and chat.usage.completion_tokens >= 1
    assert chat.choices[0].finish_reason in ("stop", "length")
    text = client.completions.create(model=MOE, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert text.usage is not None and text.usage.completion_tokens >= 1
