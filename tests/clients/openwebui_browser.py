"""Drive a running Open WebUI backend the way its browser UI does, and print what came back as JSON.

Runs under Open WebUI's own Python (it needs python-socketio and aiohttp, which Open WebUI installs):
`OWUI_PYTHON -m tests.clients.openwebui_browser --url http://127.0.0.1:PORT --model NAME [--image FILE.png]`.

The calls and bodies are those of Open WebUI 0.12.4's Svelte frontend (`src/lib/components/chat/Chat.svelte`,
`MessageInput.svelte`, `apis/files`): the first admin signs up; the PNG is uploaded with
`POST /api/v1/files/?process=false` (what `MessageInput` does with an image for a saved chat); a socket.io
connection on `/ws/socket.io` joins the user's room; `POST /api/chat/completions` carries the new chat's
`user_message` with the file, `session_id`, the assistant message id, `parent_id: null` and the background
tasks. The backend answers `{"status": true, "task_ids": [...]}` and streams the answer as socket.io
`events` (a `response:completion` per chunk, then `chat:completion` with `done`), then runs the title, tags
and follow-up tasks. A second, text-only message follows in the same chat. Without `--image`, one text message in
a new chat, and the message as Open WebUI stored it. `--tools on on` keeps Open WebUI's
built-in tools (its default) on both. Standard library, httpx and socketio only: nothing from this repository.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import socketio  # type: ignore[import-not-found]

TIMEOUT_S = 240.0
TASKS_TIMEOUT_S = 30.0  # the test itself waits for the task requests in the proxy log
TEXT_PROMPT = "Explain in two sentences why the sky is blue."  # the message without `--image`
FEATURES = {"voice": False, "image_generation": False, "code_interpreter": False, "web_search": False}


class Events:
    """The socket.io `events` the backend sends to this user, by message id."""

    timeout_s = TIMEOUT_S

    def __init__(self) -> None:
        self.log: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    def add(self, data: dict[str, Any]) -> None:
        self.log.append(data)
        self.changed.set()

    def of(self, message_id: str) -> list[dict[str, Any]]:
        return [e["data"] for e in self.log if e.get("message_id") == message_id]

    async def wait_for(self, check: Any, timeout_s: float | None = None) -> None:
        timeout_s = timeout_s or self.timeout_s
        deadline = time.monotonic() + timeout_s
        while not check():
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching event in {timeout_s} s; last: {self.log[-5:]}")
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                continue


def answer_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The streamed answer: the deltas (`response:completion` events, each an OpenAI chunk as the gateway sent
    it), the final `chat:completion` with `done` and its output, and any error."""
    deltas = [e["data"] for e in events if e.get("type") == "response:completion"]
    final = next((e["data"] for e in events if e.get("type") == "chat:completion" and e["data"].get("done")), {})
    return {
        "delta_events": len(deltas),
        "done": bool(final.get("done")),
        "output": final.get("output"),
        "usage": final.get("usage"),
        "errors": [e for e in events if e.get("type") == "chat:message:error"],
        "types": sorted({e.get("type", "") for e in events}),
    }


async def signup(client: httpx.AsyncClient) -> str:
    body = {"name": "Admin", "email": "admin@example.com", "password": "voltgate-test-1"}
    reply = await client.post("/api/v1/auths/signup", json=body)
    reply.raise_for_status()
    return str(reply.json()["token"])


async def wait_for_model(client: httpx.AsyncClient, model: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        listed = (await client.get("/api/models")).json().get("data", [])
        found = next((m for m in listed if m["id"] == model), None)
        if found is not None:
            return dict(found)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{model} not in Open WebUI's models: {[m['id'] for m in listed]}")
        await asyncio.sleep(1)


async def upload(client: httpx.AsyncClient, image: Path) -> dict[str, Any]:
    files = {"file": (image.name, image.read_bytes(), "image/png")}
    reply = await client.post("/api/v1/files/", params={"process": "false"}, files=files)
    reply.raise_for_status()
    uploaded = reply.json()
    return {
        "type": "file", "file": uploaded, "id": uploaded["id"], "url": uploaded["id"], "name": image.name,
        "collection_name": "", "status": "uploaded", "size": image.stat().st_size, "error": "",
        "itemId": str(uuid.uuid4()), "content_type": "image/png",
    }  # fmt: skip


def completion_body(model: dict[str, Any], sid: str, user_message: dict[str, Any], answer_id: str,
                    chat_id: str | None, builtin_tools: bool) -> dict[str, Any]:  # fmt: skip
    """`generateOpenAIChatCompletion`'s body for a saved chat (no `messages`: the backend reads the chat).
    Without `builtin_tools`, the user's chat setting Function Calling is "legacy" (it rides in `params`, as
    the browser copies `$settings.params` there): Open WebUI then sends no tools."""
    first = user_message["parentId"] is None
    tasks: dict[str, bool] = {"title_generation": True, "tags_generation": True} if first else {}
    params: dict[str, Any] = {"model_controls": {}, **({} if builtin_tools else {"function_calling": "legacy"})}
    return {
        "stream": True, "model": model["id"], "params": params,
        "tool_ids": [], "tool_servers": [], "features": FEATURES,
        "variables": {"{{USER_NAME}}": "Admin", "{{USER_EMAIL}}": "admin@example.com"},
        "model_item": model, "session_id": sid, "chat_id": chat_id, "id": answer_id,
        "parent_id": user_message["parentId"], "user_message": user_message,
        "background_tasks": {**tasks, "follow_up_generation": True},
    }  # fmt: skip


def user_message(text: str, files: list[dict[str, Any]], parent: str | None, model: str) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "parentId": parent, "childrenIds": [], "role": "user", "content": text,
            "files": files, "timestamp": int(time.time()), "models": [model]}  # fmt: skip


async def send(client: httpx.AsyncClient, events: Events, body: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    reply = await client.post("/api/chat/completions", json=body)
    reply.raise_for_status()
    answer_id = body["id"]

    def finished() -> bool:
        mine = events.of(answer_id)
        return any(e.get("type") == "chat:completion" and e["data"].get("done") for e in mine) or any(
            e.get("type") == "chat:message:error" for e in mine
        )

    await events.wait_for(finished)
    return {"reply": reply.json(), "seconds": round(time.monotonic() - started, 1), **answer_of(events.of(answer_id))}


async def session(url: str, model_name: str, image: Path | None, tools: tuple[bool, bool]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S) as client:
        token = await signup(client)
        client.headers["authorization"] = f"Bearer {token}"
        model = await wait_for_model(client, model_name)
        events = Events()
        sio = socketio.AsyncClient()
        sio.on("events", events.add)
        await sio.connect(url, socketio_path="/ws/socket.io", auth={"token": token}, transports=["websocket"])
        await sio.emit("user-join", {"auth": {"token": token}})
        try:
            if image is None:
                return await _one_text_message(client, events, model, sio.get_sid(), tools[1])
            return await _two_messages(client, events, model, sio.get_sid(), image, tools)
        finally:
            await sio.disconnect()


async def _two_messages(
    client: httpx.AsyncClient, events: Events, model: dict[str, Any], sid: str, image: Path, tools: tuple[bool, bool]
) -> dict[str, Any]:
    files = [await upload(client, image)]
    first = user_message("Describe the picture.", files, None, model["id"])
    first_id = str(uuid.uuid4())
    image_turn = await send(client, events, completion_body(model, sid, first, first_id, None, tools[0]))
    chat_id = next(e["chat_id"] for e in events.log if e.get("message_id") == first_id)

    def tasks_done() -> bool:
        types = {e["data"].get("type") for e in events.log if e.get("chat_id") == chat_id}
        return {"chat:title", "chat:tags", "chat:message:follow_ups"} <= types

    # Tags and follow-ups are sent only when the model's answer parses (JSON): a tiny model's may not.
    with contextlib.suppress(TimeoutError):
        await events.wait_for(tasks_done, TASKS_TIMEOUT_S)
    second = user_message("Thanks! What else can you tell me?", [], first_id, model["id"])
    text_turn = await send(client, events, completion_body(model, sid, second, str(uuid.uuid4()), chat_id, tools[1]))
    chat = (await client.get(f"/api/v1/chats/{chat_id}")).json()
    return {
        "model": {"id": model["id"], "capabilities": (model.get("info") or {}).get("meta", {}).get("capabilities")},
        "image_turn": image_turn,
        "text_turn": text_turn,
        "chat_title": chat["chat"].get("title") if "chat" in chat else chat.get("title"),
        "event_types": sorted({e["data"].get("type", "") for e in events.log}),
    }


async def _one_text_message(
    client: httpx.AsyncClient, events: Events, model: dict[str, Any], sid: str, tools: bool
) -> dict[str, Any]:
    """A new chat with one text message (no `--image`): the answer and the chat as Open WebUI stored it."""
    first = user_message(TEXT_PROMPT, [], None, model["id"])
    answer_id = str(uuid.uuid4())
    text_turn = await send(client, events, completion_body(model, sid, first, answer_id, None, tools))
    chat_id = next(e["chat_id"] for e in events.log if e.get("message_id") == answer_id)
    chat = (await client.get(f"/api/v1/chats/{chat_id}")).json()
    stored = (chat.get("chat") or chat).get("history", {}).get("messages", {}).get(answer_id, {})
    return {"text_turn": text_turn, "stored_content": stored.get("content"), "stored_output": stored.get("output")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--image", type=Path, help="a PNG for a first message with it; without: one text message")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds to wait for each answer")
    parser.add_argument(
        "--tools", nargs=2, choices=("on", "off"), default=("off", "off"), metavar=("IMAGE", "TEXT"),
        help="Open WebUI's built-in tools (its default: on) for the image message and the text one",
    )  # fmt: skip
    args = parser.parse_args()
    Events.timeout_s = args.timeout
    tools = (args.tools[0] == "on", args.tools[1] == "on")
    print(json.dumps(asyncio.run(session(args.url, args.model, args.image, tools))))


if __name__ == "__main__":
    main()
