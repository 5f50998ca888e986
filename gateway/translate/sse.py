"""Server-sent-event framing shared by the translated APIs: every event is named after its `type`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def encode_event(event: Mapping[str, Any]) -> bytes:
    """`event: <type>` then one `data:` line of compact JSON, as both OpenAI's Responses API and
    Anthropic's Messages API frame their streams (neither sends a `[DONE]` terminator)."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def encode_events(events: Iterable[Mapping[str, Any]]) -> bytes:
    """Several events, framed one after another (one write to the client)."""
    return b"".join(encode_event(event) for event in events)
