"""Each native tool-call format on real weights: the real SmolLM2 GGUF re-templated as another family.

The template decides the format (how tools reach the prompt, the call syntax the grammar forces, the parser
that reads it back); the model only has to follow the grammar. So a forced call through the real worker
process proves the whole native path of that family: render → grammar → generate → parse → OpenAI shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest

from tests.fixtures.gguf_templates import retemplated_gguf, template_text
from tests.worker_process import MODEL, running_worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_forecast", "description": "Weather forecast", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
FAMILIES = ["qwen2_5", "hermes3", "llama3_2", "mistral_nemo", "mistral_small_3_2"]


@pytest.fixture(scope="module", params=FAMILIES)
def family_worker(
    request: pytest.FixtureRequest, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    family = str(request.param)
    tmp = tmp_path_factory.mktemp(family)
    model = retemplated_gguf(smollm2_path, tmp / f"smollm2-{family}.gguf", template_text(family))
    with running_worker(model, tmp / "worker.log", "--ctx", "4096", "--slots", "1", "--n-threads", "2") as (_, url):
        yield family, url


def _ask(url: str, **extra: object) -> dict:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Forecast for Oslo, 3 days?"}],
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 96,
        **extra,
    }
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_named_call_in_the_familys_native_syntax_is_parsed_back(family_worker: tuple[str, str]) -> None:
    family, url = family_worker
    body = _ask(url, tool_choice={"type": "function", "function": {"name": "get_forecast"}},
                parallel_tool_calls=False)  # fmt: skip
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls", (family, choice)
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_forecast"], family
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), SCHEMA)
    assert calls[0]["id"].startswith("call_")


def test_a_streamed_call_arrives_as_openai_deltas(family_worker: tuple[str, str]) -> None:
    family, url = family_worker
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": "Forecast for Oslo?"}], "tools": TOOLS,
        "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0, "max_tokens": 96, "stream": True,
    }  # fmt: skip
    deltas = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"]:
                    deltas.append(chunk["choices"][0])
    parts = [part for d in deltas for part in d["delta"].get("tool_calls", [])]
    assert parts and parts[0]["id"] and parts[0]["function"]["name"] in ("get_forecast", "get_time"), family
    arguments = "".join(p["function"].get("arguments", "") for p in parts)
    assert isinstance(json.loads(arguments), dict)
    assert deltas[-1]["finish_reason"] == "tool_calls"
