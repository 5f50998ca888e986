"""The TurboMind adapter: exact argv/env from plans, request translation, error normalisation."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from backends.base import DeploymentPlan, EngineName, LMDeployOptions
from backends.lmdeploy import LMDeployAdapter, LMDeployNotInstalled
from backends.request import EngineRequest


@pytest.fixture
def lmdeploy_bin(tmp_path: Path) -> str:
    exe = tmp_path / "lmdeploy"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def plan(exe: str, **overrides: object) -> DeploymentPlan:
    fields: dict[str, object] = {
        "model": "llama-2-7b",
        "engine": EngineName.LMDEPLOY,
        "source_path": Path("/models/llama-2-7b-hf"),
        "model_format": "hf",
        "gpu_indices": (0,),
        "context_tokens": 4096,
        "slots": 8,
        "max_batch_size": 32,
        "cache_max_entry_count": 0.85,
        "lmdeploy": LMDeployOptions(executable=exe),
    }
    fields.update(overrides)
    return DeploymentPlan.model_validate(fields)


@pytest.mark.parametrize(
    ("overrides", "expected_tail", "visible"),
    [
        (
            {},
            [
                "--tp",
                "1",
                "--session-len",
                "4096",
                "--max-batch-size",
                "32",
                "--cache-max-entry-count",
                "0.85",
                "--quant-policy",
                "0",
            ],
            "0",
        ),
        (
            {
                "tp": 2,
                "gpu_indices": (2, 3),
                "context_tokens": 2048,
                "max_batch_size": 64,
                "cache_max_entry_count": 0.8,
            },
            [
                "--tp",
                "2",
                "--session-len",
                "2048",
                "--max-batch-size",
                "64",
                "--cache-max-entry-count",
                "0.8",
                "--quant-policy",
                "0",
            ],
            "2,3",
        ),
        (
            {"quant_policy": 8, "max_batch_size": None, "slots": 4},
            [
                "--tp",
                "1",
                "--session-len",
                "4096",
                "--max-batch-size",
                "4",
                "--cache-max-entry-count",
                "0.85",
                "--quant-policy",
                "8",
            ],
            "0",
        ),
    ],
)
def test_argv_and_env_follow_the_plan(
    lmdeploy_bin: str, overrides: dict, expected_tail: list[str], visible: str
) -> None:
    spec = LMDeployAdapter().launch_spec(plan(lmdeploy_bin, **overrides), port=23333)
    argv = list(spec.argv)
    assert argv[:4] == [lmdeploy_bin, "serve", "api_server", "/models/llama-2-7b-hf"]
    assert argv[4:10] == ["--backend", "turbomind", "--model-format", "hf", "--dtype", "float16"]
    assert argv[10:20] == expected_tail
    assert argv[20:26] == ["--server-name", "127.0.0.1", "--server-port", "23333", "--model-name", "llama-2-7b"]
    assert argv[26:] == ["--enable-prefix-caching"]  # on for every plan: tp > 1 and KV int8 included
    assert spec.env["CUDA_VISIBLE_DEVICES"] == visible
    assert spec.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert spec.health_path == "/v1/models"


@pytest.mark.parametrize("overrides", [{}, {"quant_policy": 4}, {"tp": 2, "gpu_indices": (0, 1)},
                                       {"vision_encoder": "Qwen2-VL ViT"}])  # fmt: skip
def test_prefix_caching_is_on_for_every_kind_of_plan_until_the_model_turns_it_off(
    lmdeploy_bin: str, overrides: dict
) -> None:
    on = LMDeployAdapter().launch_spec(plan(lmdeploy_bin, **overrides), port=1)
    assert on.argv.count("--enable-prefix-caching") == 1
    off = plan(lmdeploy_bin, **overrides, lmdeploy=LMDeployOptions(executable=lmdeploy_bin, prefix_caching=False))
    assert "--enable-prefix-caching" not in LMDeployAdapter().launch_spec(off, port=1).argv


def test_awq_weights_use_model_format_awq(lmdeploy_bin: str) -> None:
    spec = LMDeployAdapter().launch_spec(plan(lmdeploy_bin, model_format="awq"), port=1)
    assert spec.argv[spec.argv.index("--model-format") + 1] == "awq"


def test_missing_lmdeploy_is_a_clear_error_naming_the_extra(tmp_path: Path) -> None:
    with pytest.raises(LMDeployNotInstalled, match=r"voltgate\[lmdeploy\]"):
        LMDeployAdapter().launch_spec(plan(str(tmp_path / "nope")), port=1)


def test_executable_is_found_on_path(lmdeploy_bin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.path.dirname(lmdeploy_bin) + os.pathsep + os.environ["PATH"])
    spec = LMDeployAdapter().launch_spec(plan("lmdeploy"), port=1)
    assert spec.argv[0] == lmdeploy_bin


def test_requests_are_translated_to_lmdeploy_dialect() -> None:
    request = EngineRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": False},
            "max_tokens": 5,
            "top_k": 40,
            "repetition_penalty": 1.1,
            "ignore_eos": True,
            "response_format": {"type": "json_object"},
        }
    )
    out = LMDeployAdapter().translate_request(request)
    assert out["stream_options"] == {"include_usage": True}
    assert out["max_tokens"] == 5 and out["top_k"] == 40 and out["repetition_penalty"] == 1.1 and out["ignore_eos"]
    assert out["response_format"]["type"] == "json_schema"
    assert out["messages"] == [{"role": "user", "content": "hi"}]


def test_tools_and_json_schema_pass_to_lmdeploy_in_openai_shape() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    request = EngineRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [tool],
            "tool_choice": "auto",
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        }
    )
    out = LMDeployAdapter().translate_request(request)
    assert out["tools"] == [tool]
    assert out["tool_choice"] == "auto"
    assert out["response_format"] == {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


def test_the_plans_tool_parser_becomes_lmdeploys_flag_and_enables_tools(lmdeploy_bin: str) -> None:
    with_parser = plan(lmdeploy_bin).model_copy(update={"tool_parser": "qwen"})
    argv = LMDeployAdapter().launch_spec(with_parser, port=1).argv
    assert argv[argv.index("--tool-call-parser") + 1] == "qwen"
    assert LMDeployAdapter().capabilities(with_parser).tools
    assert not LMDeployAdapter().capabilities(plan(lmdeploy_bin)).tools
    assert "--tool-call-parser" not in LMDeployAdapter().launch_spec(plan(lmdeploy_bin), port=1).argv


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (
            400,
            b'{"object":"error","message":"The input token length 5000 exceed session_len 4096","code":400}',
            "context_length_exceeded",
        ),
        (  # lmdeploy 0.18, seen live on the GPU machine (bench/results/2026-11-29-gpu-h200/turbomind-extra)
            400,
            b'{"error":{"message":"Input length (6010) must be smaller than the model context length (1024).",'
            b'"type":"invalid_request_error","param":null,"code":"invalid_request_error"}}',
            "context_length_exceeded",
        ),
        (
            404,
            b'{"object":"error","message":"The model `x` does not exist.","type":"invalid_request_error","code":404}',
            None,
        ),
        (500, b"Internal Server Error", None),
    ],
)
def test_lmdeploy_errors_are_normalised(status: int, body: bytes, code: str | None) -> None:
    err = LMDeployAdapter().normalize_error(status, body)
    assert err.code == code
    assert err.message


def test_a_named_tool_choice_becomes_required_over_that_tool_alone() -> None:
    """LMDeploy 0.18 ignores a named tool_choice but enforces "required" (probed on the GPU machine)."""
    tools = [
        {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}}},
    ]
    request = EngineRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools,
         "tool_choice": {"type": "function", "function": {"name": "b"}}}
    )  # fmt: skip
    out = LMDeployAdapter().translate_request(request)
    assert out["tool_choice"] == "required"
    assert [t["function"]["name"] for t in out["tools"]] == ["b"]


def test_top_p_zero_becomes_top_k_one_for_turbomind() -> None:
    """OpenAI's minimum top_p is 0 (only the most likely token); TurboMind wants top_p > 0: same rule, as top_k."""
    request = EngineRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_p": 0})
    out = LMDeployAdapter().translate_request(request)
    assert "top_p" not in out and out["top_k"] == 1
    kept = LMDeployAdapter().translate_request(request.model_copy(update={"top_p": 0.5}))
    assert kept["top_p"] == 0.5 and "top_k" not in kept


def test_the_plans_reasoning_parser_becomes_lmdeploys_flag(lmdeploy_bin: str) -> None:
    with_parser = plan(lmdeploy_bin).model_copy(update={"reasoning_parser": "default"})
    argv = LMDeployAdapter().launch_spec(with_parser, port=1).argv
    assert argv[argv.index("--reasoning-parser") + 1] == "default"
    assert "--reasoning-parser" not in LMDeployAdapter().launch_spec(plan(lmdeploy_bin), port=1).argv


def test_template_switches_reach_lmdeploy_and_the_thinking_budget_does_not() -> None:
    """LMDeploy takes `chat_template_kwargs` and has no thinking budget (docs/reasoning.md)."""
    request = EngineRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello", "reasoning_content": "greet"},
                {"role": "user", "content": "again"},
            ],
            "chat_template_kwargs": {"enable_thinking": True},
            "thinking_budget_tokens": 512,
            "thinking_budget_message": "Time to answer.",
        }
    )
    out = LMDeployAdapter().translate_request(request)
    assert out["chat_template_kwargs"] == {"enable_thinking": True}
    assert "thinking_budget_tokens" not in out and "thinking_budget_message" not in out
    assert out["messages"][1] == {"role": "assistant", "content": "hello", "reasoning_content": "greet"}


@pytest.mark.parametrize(
    ("extra_args", "flag", "value"),
    [
        (("--dtype", "bfloat16"), "--dtype", "bfloat16"),
        (("--dtype=bfloat16",), "--dtype", "bfloat16"),
        (("--dtype bfloat16",), "--dtype", "bfloat16"),
        (("--dtype", "float16", "--dtype", "bfloat16"), "--dtype", "bfloat16"),  # the last wins, as in argparse
        (("--disable-metrics",), "--disable-metrics", ""),
        (("--disable-metrics", "--dtype", "bfloat16"), "--disable-metrics", ""),
        (("--dtype", "bfloat16"), "--disable-metrics", None),
        ((), "--dtype", None),
    ],
)
def test_extra_args_are_read_as_lmdeploys_argparse_would(extra_args: tuple[str, ...], flag: str, value: str) -> None:
    assert LMDeployOptions(extra_args=extra_args).extra_value(flag) == value
