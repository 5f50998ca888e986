"""The TurboMind path end to end: plan → argv → supervised `lmdeploy serve api_server` → the same OpenAI shapes.

`lmdeploy` here is a stand-in (tests/fakes/standin_bin/lmdeploy) because TurboMind needs a CUDA GPU: it
checks the command line voltgate builds, then serves by delegating to the real llama.cpp worker on the
real SmolLM2 GGUF. The real TurboMind run is in bench/results/ (GPU machine).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, free_port
from tests.e2e.conftest import Gateway, running_gateway
from tests.openai_schema import assert_matches_openai
from tests.unit.placement_models import write_hf_model

pytestmark = pytest.mark.e2e

# SmolLM2-135M's real architecture (config.json of HuggingFaceTB/SmolLM2-135M-Instruct).
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 49152,
}
MODEL = "smollm2-turbomind"


@pytest.fixture(scope="module")
def turbomind_gateway(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Path]]:
    tmp = tmp_path_factory.mktemp("standin")
    hf_dir = write_hf_model(tmp / "SmolLM2-135M-Instruct", SMOLLM2_135M, dtype="BF16")
    port = free_port()
    config = {
        "server": {"host": "127.0.0.1", "port": port},
        "gpus": "v100-16gb",
        "models": [{"name": MODEL, "sources": [{"hf": str(hf_dir)}], "context": 2048, "concurrency": 4}],
    }
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    argv_record = tmp / "argv.json"
    env = {
        "PATH": os.pathsep.join(
            [str(REPO / "tests" / "fakes" / "standin_bin"), os.path.dirname(sys.executable), os.environ["PATH"]]
        ),
        "VOLTGATE_STANDIN_GGUF": str(smollm2_path),
        "VOLTGATE_STANDIN_ARGV": str(argv_record),
        "PYTHONPATH": str(REPO),
    }
    with running_gateway(tmp / "config.yaml", tmp / "gateway.log", env=env) as gateway:
        yield gateway, argv_record


def test_plan_sends_the_model_to_turbomind_with_fp16_flags(turbomind_gateway: tuple[Gateway, Path]) -> None:
    gateway, argv_record = turbomind_gateway
    record = json.loads(argv_record.read_text())
    argv = record["argv"]
    assert argv[:2] == ["serve", "api_server"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--backend"] == "turbomind"
    assert flags["--dtype"] == "float16"  # a BF16 checkpoint is served in FP16 on Volta
    assert flags["--tp"] == "1"
    assert flags["--model-name"] == MODEL
    assert int(flags["--session-len"]) == 2048
    assert "--enable-prefix-caching" in argv  # the stand-in's argparse takes it as TurboMind's does (a bare flag)
    assert record["cuda_visible_devices"] == "0"
    assert "bf16" in gateway.log().lower() or "bfloat16" in gateway.log().lower()


def test_chat_through_turbomind_path_has_the_same_shape(turbomind_gateway: tuple[Gateway, Path]) -> None:
    gateway, _ = turbomind_gateway
    client = gateway.client()
    # An answer longer than 5 tokens, greedily: "Say hi" sampled could end within 5
    # (it did once in CI: bench/results/2026-12-06-ci/ci-0d4b50c.log).
    count = [{"role": "user", "content": "Count from 1 to 50, one number per line."}]
    reply = client.chat.completions.create(model=MODEL, messages=count, max_tokens=5, temperature=0)  # type: ignore[arg-type]
    assert_matches_openai("CreateChatCompletionResponse", reply.model_dump(mode="json", exclude_unset=True))
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_placement_endpoint_explains_the_decision(turbomind_gateway: tuple[Gateway, Path]) -> None:
    import httpx

    gateway, _ = turbomind_gateway
    placement = httpx.get(gateway.base_url + "/placement", timeout=5).json()
    assert "lmdeploy" in json.dumps(placement)


def test_turbomind_answers_carry_the_engines_cached_tokens(turbomind_gateway: tuple[Gateway, Path]) -> None:
    """TurboMind counts its prefix-cache hits (its metrics on, LMDeploy 0.18's default; docs/api.md, "Cached
    tokens"): the count reaches the client on chat (whole and streamed) and on Messages. Here the stand-in's real
    worker counts them; the GPU run is in bench/results/2026-12-07-gpu-h100-tm-cached/."""
    import anthropic

    gateway, _ = turbomind_gateway
    client = gateway.client()
    ask = [{"role": "user", "content": "Say hi, and then say hi once more"}]
    for _ in range(2):  # the second finds the first's prompt cached
        whole = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=2)  # type: ignore[arg-type]
    assert whole.usage is not None and whole.usage.prompt_tokens_details is not None
    assert 0 < (whole.usage.prompt_tokens_details.cached_tokens or 0) <= whole.usage.prompt_tokens
    chunks = list(client.chat.completions.create(model=MODEL, messages=ask, max_tokens=2, stream=True,  # type: ignore[call-overload]
                                                 stream_options={"include_usage": True}))  # fmt: skip
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens_details is not None
    messages = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)
    reply = messages.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Say hi"}])
    assert reply.usage.input_tokens > 0 and reply.usage.cache_read_input_tokens is not None
