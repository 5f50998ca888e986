"""FakeWorker: a small real process standing in for an engine worker in supervisor tests.

It speaks just enough of the worker contract (GET /health, streaming /v1/chat/completions) and
misbehaves on request: never ready (or only after a while), crash after N requests, die by SIGSEGV on
every request (as the AMX bug kills llama.cpp), ignore SIGTERM,
spawn a child, print a fatal log line, hold memory like loaded weights. Stands for
`backends.llamacpp.worker` / `lmdeploy serve api_server` where a test is about process supervision, not
inference.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fail-ready", action="store_true", help="/health answers 503 forever")
    parser.add_argument("--crash-after", type=int, default=0, help="exit(3) after N completions")
    parser.add_argument("--segv-on-request", action="store_true", help="die by a real SIGSEGV on each request")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--exit-at-start", type=int, default=None, help="print a line and exit with this code")
    parser.add_argument("--log-line", default=None, help="print this line every 0.2 s")
    parser.add_argument("--spawn-child", default=None, help="write the pid of a spawned sleeping child here")
    parser.add_argument("--chunks", type=int, default=5)
    parser.add_argument("--ready-after", type=float, default=0.0, help="/health answers 503 for this long")
    parser.add_argument("--hold-mib", type=int, default=0, help="keep this much memory resident (like weights)")
    args = parser.parse_args()
    started = time.monotonic()
    held = b"\x01" * (args.hold_mib << 20)  # written, so resident (a bytearray would stay untouched)

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.exit_at_start is not None:
        print("fake: loading model... error: failed to load model (simulated)", flush=True)
        sys.exit(args.exit_at_start)
    if args.spawn_child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(args.spawn_child, "w") as f:
            f.write(str(child.pid))
    if args.log_line:
        import threading

        def spam() -> None:
            while True:
                print(args.log_line, flush=True)
                time.sleep(0.2)

        threading.Thread(target=spam, daemon=True).start()

    served = 0

    async def health(_: Request) -> JSONResponse:
        if args.fail_ready or time.monotonic() - started < args.ready_after:
            return JSONResponse({"status": "loading", "held": len(held)}, status_code=503)
        return JSONResponse({"status": "ok", "slots": 1, "slots_busy": 0})

    async def chat(request: Request) -> StreamingResponse | JSONResponse:
        nonlocal served
        body = await request.json()
        served += 1
        if args.segv_on_request:
            print("fake: segmentation fault in a native kernel, as asked", flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)  # the default action: the process dies with -11, like llama.cpp
        if args.crash_after and served >= args.crash_after:
            print("fake: crashing as asked", flush=True)
            os._exit(3)
        created = int(time.time())
        base = {"id": "chatcmpl-fake", "created": created, "model": body.get("model", "fake")}
        if not body.get("stream"):
            return JSONResponse(
                {
                    **base,
                    "object": "chat.completion",
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )

        async def frames():  # type: ignore[no-untyped-def]
            for i in range(args.chunks):
                chunk = {
                    **base,
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}],
                }
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(frames(), media_type="text/event-stream")

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", health),  # the health path of `lmdeploy serve api_server`, which it stands for
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ]
    )
    print(f"fake: listening on {args.port}", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
