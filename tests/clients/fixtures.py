"""Recorded client traffic → the committed fixtures under tests/fixtures/clients/, and loading them back.

`python -m tests.clients.fixtures RECORDING.jsonl OUT.json --client "codex-cli 0.171.0"` keeps each POST's path,
the headers a gateway might read and the body, with long texts trimmed (instructions, system prompts, tool
descriptions, reminders: cut to `KEEP_CHARS` with a marker) so the shape stays exactly what the client sent:
every key, every tool with its full parameter schema, every item and content block in order.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "clients"
KEEP_CHARS = 160
MARK = " …[trimmed]"
_TEXT_KEYS = frozenset({"text", "instructions", "description", "content", "output"})
_HEADERS = frozenset({"content-type", "user-agent", "anthropic-version", "anthropic-beta", "openai-beta", "accept"})


def trim(value: Any, key: str | None = None) -> Any:
    """`value` with every long text under a text-bearing key cut short; schemas (`parameters`,
    `input_schema`) are kept whole, except their descriptions."""
    if isinstance(value, dict):
        return {k: trim(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [trim(v, key) for v in value]
    if isinstance(value, str) and key in _TEXT_KEYS and len(value) > KEEP_CHARS:
        return value[:KEEP_CHARS] + MARK
    return value


def _metadata(body: dict[str, Any]) -> dict[str, Any]:
    """Per-installation ids (Codex's client_metadata, Claude Code's metadata.user_id) replaced by fixed ones."""
    out = dict(body)
    for key in ("prompt_cache_key", "client_metadata"):
        if key in out:
            out[key] = "recorded" if isinstance(out[key], str) else {"recorded": "ids removed"}
    if isinstance(out.get("metadata"), dict) and "user_id" in out["metadata"]:
        out["metadata"] = {**out["metadata"], "user_id": "recorded"}
    return out


def build(recording: Path, client: str) -> dict[str, Any]:
    exchanges = []
    for line in recording.read_text().splitlines():
        exchange = json.loads(line)
        if exchange["method"] != "POST" or not isinstance(exchange.get("body"), dict):
            continue
        exchanges.append(
            {
                "path": exchange["path"],
                "headers": {k: v for k, v in exchange["headers"].items() if k in _HEADERS},
                "body": trim(_metadata(exchange["body"])),
                "reply": "scripted" if exchange.get("scripted") else "gateway",
                **({"status": exchange["status"]} if "status" in exchange else {}),
            }
        )
    return {"client": client, "exchanges": exchanges}


def load(name: str) -> dict[str, Any]:
    """A committed fixture by file name (without `.json`)."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("recording", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--client", required=True)
    args = parser.parse_args()
    args.out.write_text(json.dumps(build(args.recording, args.client), indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
