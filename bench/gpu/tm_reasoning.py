"""On the GPU machine: TurboMind's reasoning parser through voltgate, on each API (issue 36).

    python3 -m bench.gpu.tm_reasoning make /tmp/gpu/models/7b /tmp/gpu/models/7b-think
    python3 -m bench.gpu.tm_reasoning check --base-url http://127.0.0.1:8000 --model think --out RESULTS/reasoning.jsonl

`make` gives the random-weight 7B (`.gpu/make_model.py`) a thinking chat template in a second folder (the weights
linked, not copied): the generation prompt pre-fills `<think>\\n` as Qwen3's and DeepSeek-R1's templates do, unless
`enable_thinking` is false. Its template says `<think>`, so the plan picks LMDeploy's `default` reasoning parser by
itself (`gateway/placement/tool_parsers.py`), which is the first check. Random weights never close the block, so
with thinking on every output token is thinking: the checks assert that it arrives as thinking in each API's shape
(chat `reasoning_content` and `reasoning_tokens`, a Responses `reasoning` item, a Messages `thinking` block, streamed
and not) and that thinking switched off (`reasoning_effort: none`) reaches the template and gives answer text.
One JSON line per check: {"check", "ok", "status", "detail"}, as `bench.gpu.turbomind_features`.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

from bench.gpu.turbomind_features import Checks, stream_chunks

THINK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: "
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:"
    "{% if enable_thinking is defined and not enable_thinking %} <think>\n\n</think>\n\n"
    "{% else %} <think>\n{% endif %}{% endif %}"
)
HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "unused"}


TAGS = ("<think>", "</think>")
OWN = ("tokenizer_config.json", "tokenizer.json")


def make(source: Path, dest: Path) -> None:
    """`dest`: `source`'s files linked; its tokenizer with `<think>` and `</think>` as tokens, its chat template the
    thinking one."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        target = dest / path.name
        if path.name not in OWN and not target.exists():
            target.symlink_to(path.resolve())
    first = add_think_tokens(source, dest, THINK_TEMPLATE)
    print(f"{dest}: thinking template, {TAGS} as tokens {first}, {first + 1}")


def add_think_tokens(source: Path, dest: Path, template: str | None = None) -> int:
    """`source`'s tokenizer files written to `dest` with `<think>` and `</think>` as tokens (LMDeploy's reasoning
    parser refuses a tokenizer without them), in place of the vocabulary's last two pieces so the embedding's size
    stays; `template`, if given, as the chat template. Returns the first tag's id."""
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first = len(vocab) - len(TAGS)
    for i, tag in enumerate(TAGS):
        vocab[first + i] = [tag, 0.0]
        tokenizer.setdefault("added_tokens", []).append({"id": first + i, "content": tag, "single_word": False,
            "lstrip": False, "rstrip": False, "normalized": False, "special": False})  # fmt: skip
    config = json.loads((source / "tokenizer_config.json").read_text())
    if template is not None:
        config["chat_template"] = template
    decoder = config.setdefault("added_tokens_decoder", {})
    for i, tag in enumerate(TAGS):
        decoder[str(first + i)] = {"content": tag, "lstrip": False, "normalized": False, "rstrip": False,
                                   "single_word": False, "special": False}  # fmt: skip
    for name in OWN:  # `dest` may hold links to `source`'s files: replace them, never write through them
        (dest / name).unlink(missing_ok=True)
    (dest / "tokenizer.json").write_text(json.dumps(tokenizer))
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return first


def chat_checks(c: Checks) -> None:
    placement = c.http.get("/v1/placement")
    text = placement.text
    picked = '"reasoning_parser":"default"' in text.replace(" ", "")
    c.record("plan_picks_reasoning_parser", placement, picked, text[:600])
    r = c.chat(max_tokens=24)
    message = r.json()["choices"][0]["message"] if r.status_code == 200 else {}
    usage = r.json().get("usage", {}) if r.status_code == 200 else {}
    details = usage.get("completion_tokens_details") or {}
    c.record("chat_reasoning_content", r, bool(message.get("reasoning_content")) and not message.get("content"),
             {"message": message, "usage": usage})  # fmt: skip
    c.record("chat_reasoning_tokens_counted", r, (details.get("reasoning_tokens") or 0) > 0, usage)
    r = c.chat(max_tokens=24, stream=True, stream_options={"include_usage": True})
    deltas = [ch["choices"][0]["delta"] for ch in stream_chunks(r) if ch.get("choices")]
    thinking = any(d.get("reasoning_content") for d in deltas) and not any(d.get("content") for d in deltas)
    c.record("chat_stream_reasoning_deltas", r, thinking and r.text.rstrip().endswith("[DONE]"), deltas[:4])
    r = c.chat(max_tokens=24, reasoning_effort="none")
    message = r.json()["choices"][0]["message"] if r.status_code == 200 else {}
    c.record("chat_thinking_off_gives_answer_text", r, bool(message.get("content"))
             and not message.get("reasoning_content"), message)  # fmt: skip


def responses_checks(c: Checks) -> None:
    body: dict[str, Any] = {"model": c.model, "input": "hi", "max_output_tokens": 24, "reasoning": {"effort": "low"}}
    r = c.http.post("/v1/responses", json=body)
    reply = r.json() if r.status_code == 200 else {}
    items = reply.get("output", [])
    c.record("responses_reasoning_item", r, any(i.get("type") == "reasoning" for i in items),
             {"output": items[:2], "usage": reply.get("usage")})  # fmt: skip
    r = c.http.post("/v1/responses", json={**body, "stream": True})
    events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    c.record("responses_stream_reasoning_events", r, any(e.startswith("response.reasoning") for e in events)
             and events[-1] in ("response.completed", "response.incomplete"), sorted(set(events)))  # fmt: skip


def messages_checks(c: Checks) -> None:
    body = {"model": c.model, "max_tokens": 1040, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    r = c.http.post("/v1/messages", json=body, headers=HEADERS)
    blocks = r.json().get("content", []) if r.status_code == 200 else []
    c.record("messages_thinking_block", r, any(b.get("type") == "thinking" and b.get("thinking") for b in blocks),
             blocks[:2])  # fmt: skip
    r = c.http.post("/v1/messages", json={**body, "stream": True}, headers=HEADERS)
    c.record("messages_stream_thinking_delta", r, '"thinking_delta"' in r.text and "message_stop" in r.text,
             r.text[:600])  # fmt: skip


def check(args: argparse.Namespace) -> int:
    with open(args.out, "w") as out:
        checks = Checks(args.base_url, args.model, out)
        for name, fn in (("chat", chat_checks), ("responses", responses_checks), ("messages", messages_checks)):
            checks.run(name, partial(fn, checks))
    print(f"{checks.failed} failed", file=sys.stderr)
    return 1 if checks.failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.tm_reasoning")
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("source", type=Path)
    m.add_argument("dest", type=Path)
    k = sub.add_parser("check")
    k.add_argument("--base-url", default="http://127.0.0.1:8000")
    k.add_argument("--model", required=True)
    k.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "make":
        make(args.source, args.dest)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
