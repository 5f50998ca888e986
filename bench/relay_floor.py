"""The thinnest possible relay (Starlette + httpx streaming passthrough): the floor for the gateway's cost.

No validation, auth, metrics or re-framing: bytes in, bytes out. `python -m bench.relay_floor
--upstream http://127.0.0.1:9100 --port 9200` relays every path to the upstream.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator, Sequence

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

_FORWARDED = ("content-type", "authorization", "accept")


def create_app(upstream: str, transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """The relay app; `transport` replaces the network in tests."""
    client = httpx.AsyncClient(
        base_url=upstream,
        transport=transport,
        timeout=None,
        trust_env=False,
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
    )

    async def relay(request: Request) -> StreamingResponse:
        headers = {k: v for k, v in request.headers.items() if k in _FORWARDED}
        upstream_request = client.build_request(
            request.method,
            request.url.path,
            headers=headers,
            content=await request.body(),
            params=request.query_params,
        )
        response = await client.send(upstream_request, stream=True)
        return StreamingResponse(
            response.aiter_raw(),
            status_code=response.status_code,
            media_type=response.headers.get("content-type"),
            background=BackgroundTask(response.aclose),
        )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with client:
            yield

    return Starlette(routes=[Route("/{path:path}", relay, methods=["GET", "POST"])], lifespan=lifespan)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.relay_floor", description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True, help="upstream root URL, e.g. http://127.0.0.1:9100")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    uvicorn.run(create_app(args.upstream), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
