"""Multi-turn agent sessions built from the recorded client fixtures (tests/fixtures/clients/), for
`bench.session_replay`.

Each session starts from a request a real client sent (Claude Code's `/v1/messages` after a tool call, Codex's
`/v1/responses` after a tool call, Open WebUI's chat with its 36 built-in tools) and grows like an agent's: each
next turn appends the model's real answer (what the gateway streamed back) and then a tool call with a realistic
tool result (Claude Code, Codex) or the user's next message (Open WebUI), so every prompt is the previous one
plus a few hundred new tokens. The fixtures' long texts are trimmed (tests/clients/fixtures.py), so these
prompts are shorter than the clients' real ones; their shape (system blocks, tools, items) is exact.

Claude Code changes the last three hex digits of its first system block (`x-anthropic-billing-header:
cc_version=2.1.197.<3 hex>`) between requests; `volatile_billing=True` (the default) does the same here, so
the replay measures what the real client gets.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "clients"
SessionKind = Literal["claude", "codex", "openwebui"]
SESSION_KINDS: tuple[SessionKind, ...] = ("claude", "codex", "openwebui")
Api = Literal["messages", "responses", "chat"]

# What an agent's shell commands print in a small Python project: the tool results the replay appends.
TOOL_STEPS: tuple[tuple[str, str], ...] = (
    ("ls -la", "total 48\ndrwxr-xr-x 6 dev dev 4096 Dec  4 10:02 .\ndrwxr-xr-x 3 dev dev 4096 Dec  4 09:58 ..\n"
     "-rw-r--r-- 1 dev dev  412 Dec  4 09:58 Makefile\n-rw-r--r-- 1 dev dev 1820 Dec  4 09:58 README.md\n"
     "-rw-r--r-- 1 dev dev  934 Dec  4 09:58 pyproject.toml\ndrwxr-xr-x 2 dev dev 4096 Dec  4 10:02 src\n"
     "drwxr-xr-x 2 dev dev 4096 Dec  4 10:01 tests"),
    ("cat src/inventory.py", "\"\"\"Stock levels per warehouse.\"\"\"\n\nfrom dataclasses import dataclass\n\n\n"
     "@dataclass\nclass Item:\n    sku: str\n    count: int\n    warehouse: str\n\n\n"
     "def restock(items: list[Item], sku: str, amount: int) -> Item:\n    for item in items:\n"
     "        if item.sku == sku:\n            item.count += amount\n            return item\n"
     "    raise KeyError(sku)\n\n\ndef low_stock(items: list[Item], threshold: int = 5) -> list[Item]:\n"
     "    return [i for i in items if i.count < threshold]"),
    ("python -m pytest -q", "..F.\n=================================== FAILURES ===================================\n"
     "____________________________ test_restock_negative _____________________________\n\n"
     "    def test_restock_negative():\n        items = [Item('a1', 3, 'north')]\n"
     ">       with pytest.raises(ValueError):\nE       Failed: DID NOT RAISE <class 'ValueError'>\n\n"
     "tests/test_inventory.py:21: Failed\n"
     "=========================== short test summary info ============================\n"
     "FAILED tests/test_inventory.py::test_restock_negative - Failed: DID NOT RAISE\n1 failed, 3 passed in 0.04s"),
    ("grep -rn \"restock\" src tests",
     "src/inventory.py:13:def restock(items: list[Item], sku: str, amount: int) -> Item:\n"
     "tests/test_inventory.py:4:from inventory import Item, low_stock, restock\n"
     "tests/test_inventory.py:9:    restock(items, 'a1', 2)\n"
     "tests/test_inventory.py:22:        restock(items, 'a1', -1)"),
    ("git diff",
     "diff --git a/src/inventory.py b/src/inventory.py\nindex 3f2a1c4..8b0d9e2 100644\n--- a/src/inventory.py\n"
     "+++ b/src/inventory.py\n@@ -11,6 +11,8 @@ class Item:\n \n"
     " def restock(items: list[Item], sku: str, amount: int) -> Item:\n"
     "+    if amount <= 0:\n+        raise ValueError(f\"amount must be positive, got {amount}\")\n"
     "     for item in items:"),
    ("python -m pytest -q", "....\n4 passed in 0.03s"),
    ("python -m mypy src", "src/inventory.py:19: error: Missing return statement  [return]\nFound 1 error in 1 file "
     "(checked 1 source file)"),
    ("sed -n 15,25p src/inventory.py", "            item.count += amount\n            return item\n"
     "    raise KeyError(sku)\n\n\ndef low_stock(items: list[Item], threshold: int = 5) -> list[Item]:\n"
     "    return [i for i in items if i.count < threshold]"),
    ("git status --short", " M src/inventory.py\n M tests/test_inventory.py\n?? notes.md"),
)  # fmt: skip

# What an Open WebUI user types next in a chat about the same small project.
USER_STEPS: tuple[str, ...] = (
    "I keep stock levels per warehouse in a Python dataclass. How should I model an item that can be in "
    "several warehouses at once?",
    "Good. Now write a function that moves stock from one warehouse to another and refuses to go below zero.",
    "What tests would you write for that function? List them with one line each.",
    "Can you make the error messages say which warehouse ran short and by how much?",
    "How would I store this in SQLite instead of in memory? Keep it to the standard library.",
    "Show me the schema and the query for the items that are low in any warehouse.",
    "What index would make that query fast when there are a million rows?",
    "Summarise what we built in five bullet points for the README.",
    "Last thing: how do I run all of this from a Makefile?",
)


@dataclass
class Turn:
    """One request of a session: where it goes, what it sends, and the text this turn added to the prompt
    (for the one-turn comparison prompt of the new tokens alone)."""

    index: int
    api: Api
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    new_text: str


def load_fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def billing_suffix(turn: int) -> str:
    """A three-hex-digit suffix that differs from turn to turn, as Claude Code's does."""
    return hashlib.sha256(f"turn-{turn}".encode()).hexdigest()[:3]


def _set_billing(body: dict[str, Any], turn: int) -> None:
    first = body["system"][0]
    first["text"] = re.sub(r"(cc_version=[\d.]+\.)[0-9a-f]{3}", rf"\g<1>{billing_suffix(turn)}", first["text"])


class AgentSession:
    """A session of one kind: `first_turn()`, then `next_turn(answer)` with the model's answer to the last.

    Bodies are deep copies: a turn's body is never changed after it is returned."""

    def __init__(self, kind: SessionKind, model: str, *, max_tokens: int, volatile_billing: bool = True) -> None:
        self.kind = kind
        self.model = model
        self.max_tokens = max_tokens
        self.volatile_billing = volatile_billing
        self._turn = 0
        self._body, self._path, self._headers, self.api = self._start()

    def _start(self) -> tuple[dict[str, Any], str, dict[str, str], Api]:
        if self.kind == "claude":
            ex = load_fixture("claude_tool_round_trip")["exchanges"][0]
            body = copy.deepcopy(ex["body"])
            body["max_tokens"] = self.max_tokens
            return body, "/v1/messages", dict(ex["headers"]), "messages"
        if self.kind == "codex":
            ex = load_fixture("codex_tool_round_trip")["exchanges"][0]
            return (
                copy.deepcopy(ex["body"]) | {"max_output_tokens": self.max_tokens},
                "/v1/responses",
                dict(ex["headers"]),
                "responses",
            )
        ex = load_fixture("openwebui_builtin_tools")["exchanges"][0]
        body = copy.deepcopy(ex["body"]) | {"max_tokens": self.max_tokens, "stream_options": {"include_usage": True}}
        body["messages"] = [{"role": "user", "content": USER_STEPS[0]}]
        return body, "/v1/chat/completions", dict(ex["headers"]), "chat"

    def first_turn(self) -> Turn:
        return self._emit(new_text=self._last_text())

    def _last_text(self) -> str:
        if self.kind == "openwebui":
            return str(self._body["messages"][-1]["content"])
        return "Run echo hi\nhi"

    def _emit(self, new_text: str) -> Turn:
        self._body["model"] = self.model
        if self.kind == "claude" and self.volatile_billing:
            _set_billing(self._body, self._turn)
        turn = Turn(self._turn, self.api, self._path, dict(self._headers), copy.deepcopy(self._body), new_text)
        self._turn += 1
        return turn

    def next_turn(self, answer: str) -> Turn:
        """The next request: the last one, the model's `answer`, then a tool result or a user message."""
        answer = answer.strip() or "(no text)"
        step = self._turn - 1
        if self.kind == "claude":
            new_text = self._append_claude(answer, step)
        elif self.kind == "codex":
            new_text = self._append_codex(answer, step)
        else:
            new_text = USER_STEPS[(step + 1) % len(USER_STEPS)]
            self._body["messages"] += [{"role": "assistant", "content": answer}, {"role": "user", "content": new_text}]
        return self._emit(new_text=f"{answer}\n{new_text}")

    def _append_claude(self, answer: str, step: int) -> str:
        command, output = TOOL_STEPS[step % len(TOOL_STEPS)]
        tool_id = f"toolu_r{step}"
        self._body["messages"] += [
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": answer},
                    {"type": "tool_use", "id": tool_id, "name": "Bash", "input": {"command": command}},
                ],
            },
            {
                "role": "user",
                "content": [{"tool_use_id": tool_id, "type": "tool_result", "content": output, "is_error": False}],
            },
        ]
        return f"{command}\n{output}"

    def _append_codex(self, answer: str, step: int) -> str:
        command, output = TOOL_STEPS[step % len(TOOL_STEPS)]
        call_id = f"call_r{step}"
        self._body["input"] += [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]},
            {"type": "function_call", "name": "exec_command", "arguments": json.dumps({"cmd": command}),
             "call_id": call_id},
            {"type": "function_call_output", "call_id": call_id,
             "output": f"Process exited with code 0\nOutput:\n{output}"},
        ]  # fmt: skip
        return f"{command}\n{output}"


def one_turn_body(api: Api, model: str, text: str, max_tokens: int) -> dict[str, Any]:
    """A one-turn request of `text` alone, in `api`'s shape: the baseline a cached turn's TTFT is held to."""
    if api == "messages":
        return {"model": model, "max_tokens": max_tokens, "stream": True,
                "messages": [{"role": "user", "content": text}]}  # fmt: skip
    if api == "responses":
        return {"model": model, "max_output_tokens": max_tokens, "stream": True, "input": text}
    return {"model": model, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": text}]}  # fmt: skip


def background_tasks(turn: int, history: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Open WebUI's background tasks after answer `turn` (0-based): title and tags after the first answer,
    follow-ups after every one, each as (name, prompt) with `{{MESSAGES:END:N}}` (the last N messages) filled in."""
    tasks = load_fixture("openwebui_builtin_tools")["background_tasks"]
    said = [f"{m['role'].upper()}: {m['content']}" for m in history if isinstance(m["content"], str)]
    names = ("title", "tags", "follow_ups") if turn == 0 else ("follow_ups",)

    def fill(match: re.Match[str]) -> str:
        return "\n".join(said[-int(match.group(1)) :])

    return [(name, re.sub(r"\{\{MESSAGES:END:(\d+)\}\}", fill, str(tasks[name]))) for name in names]
