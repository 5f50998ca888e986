"""What a connection may cost the gateway before it has sent a request: a header read timeout and a limit on
open connections per client address, in a small subclass of uvicorn's h11 protocol.

uvicorn closes an idle keep-alive connection after `timeout_keep_alive` (the gateway's
`server.idle_timeout_s`), but only once a response has completed: a connection that never sends a byte, or
sends half its headers and stops, would stay open forever, and a thousand of them exhaust a common
1,024-descriptor limit. Here:

- `header_timeout_s`: from the moment a connection opens, or the moment the first byte of its next request
  arrives after a response, its request headers must be complete within this time; else it is closed.
  Time spent reading a body or running the request never counts.
- `max_per_client`: a client address holding this many open connections has its next one answered at once
  with a `429 rate_limit_exceeded` (OpenAI's envelope, `Connection: close`), before any of its bytes are
  parsed. Other addresses are not affected. The answer is followed by a lingering close (as nginx's
  `lingering_close`): our side is shut for writing, what the client still sends is read and dropped, and
  the socket is closed when the client closes its side or after `REFUSAL_LINGER_S`. Closing at once, with
  the client's request unread in the socket's buffer, makes the kernel send a reset, which can reach the
  client before it reads the 429 (about 42 % of refused connections got a reset instead of the answer).

uvicorn's own refusal of a request it cannot parse (a request line or headers past h11's 16 KiB buffer, a
malformed request) is answered here in OpenAI's envelope (`400 invalid_request_error`, with an
`x-request-id` that its warning in the log carries too), with the same lingering close: uvicorn's is
`text/plain` and closes at once, so a client still sending its 1 MB header got a reset, not the answer.
No route ran, so it is not in the access log or `requests_total`.

The protocol class is built per server (`guarded_h11_protocol`), so the counts belong to one server and tests
can run several.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.errors import ErrorCode, GatewayError

log = logging.getLogger("voltgate")

REFUSAL_LOG_INTERVAL_S = 10.0  # one warning per address in this interval, however many are refused
H11_BUFFER_BYTES = 16 * 1024  # uvicorn's `h11_max_incomplete_event_size` default: request line and headers
REFUSAL_LINGER_S = 2.0  # a refused connection's client has this long to read the 429 and close its side


@dataclass
class ClientConnections:
    """Open connections by client address, and the limit on them."""

    max_per_client: int | None
    header_timeout_s: float
    open: Counter[str] = field(default_factory=Counter)
    _warned_at: dict[str, float] = field(default_factory=dict)

    def acquire(self, address: str) -> bool:
        """Count a new connection from `address`; False (not counted) when it holds the maximum already."""
        if self.max_per_client is not None and self.open[address] >= self.max_per_client:
            now = time.monotonic()
            if now - self._warned_at.get(address, -REFUSAL_LOG_INTERVAL_S) >= REFUSAL_LOG_INTERVAL_S:
                self._warned_at[address] = now
                log.warning("refusing connections from %s: it holds %d (server.max_connections_per_client)",
                            address, self.open[address])  # fmt: skip
            return False
        self.open[address] += 1
        return True

    def release(self, address: str) -> None:
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]
            self._warned_at.pop(address, None)


def _refusal(limit: int) -> bytes:
    error = GatewayError(
        ErrorCode.RATE_LIMITED, f"too many open connections from your address (limit {limit})", retry_after_s=1
    )
    return _response("429 Too Many Requests", error, "retry-after: 1\r\n")


def _response(status: str, error: GatewayError, extra: str = "") -> bytes:
    """A complete HTTP/1.1 response carrying `error` in OpenAI's envelope, closing the connection."""
    body = json.dumps(error.body()).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra}"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the header timeout and per-address limit of its class's `guard`
    (made per server by `guarded_h11_protocol`)."""

    guard: ClassVar[ClientConnections]  # (uvicorn's own `self.connections` is the server's set of protocols)
    _address: str | None = None  # counted in `guard` while open
    _waiting_since: float | None = None  # headers of the next request awaited since (loop time)
    _header_timer: asyncio.TimerHandle | None = None
    _refused: bool = False  # answered with the 429: lingering until the client closes (see the module docstring)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else "unknown"
        if not self.guard.acquire(address):
            assert self.guard.max_per_client is not None
            self._answer_and_linger(_refusal(self.guard.max_per_client))
            return
        self._address = address
        self._waiting_since = self.loop.time()
        self._arm(self.guard.header_timeout_s)

    def _answer_and_linger(self, response: bytes) -> None:
        """Send `response`, shut our side, and drop what the client still sends until it closes its side or
        `REFUSAL_LINGER_S` passes (closing at once would reset the connection before the answer is read)."""
        self._refused = True
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(REFUSAL_LINGER_S, self.transport.close)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse, in OpenAI's envelope with an `x-request-id`."""
        request_id = f"req_{uuid.uuid4().hex}"
        log.warning("refusing a request from %s that the server cannot parse (request id %s): %s",
                    self.client[0] if self.client else "unknown", request_id, msg)  # fmt: skip
        error = GatewayError(
            ErrorCode.INVALID_REQUEST,
            "invalid HTTP request: malformed, or its request line or headers exceed the server's limit "
            f"({H11_BUFFER_BYTES // 1024} KiB)",
        )
        self._answer_and_linger(_response("400 Bad Request", error, f"x-request-id: {request_id}\r\n"))

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped: the connection was answered with its 429
        super().data_received(data)
        if self._address is None:
            return
        if self.cycle is None or self.cycle.response_complete:  # the next request's headers are due
            if self._waiting_since is None:
                self._waiting_since = self.loop.time()
                self._arm(self.guard.header_timeout_s)
        else:
            self._waiting_since = None

    def eof_received(self) -> None:
        if self._refused:  # the client read the 429 and closed its side
            self.transport.close()
            return
        super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if self._address is not None:
            self.guard.release(self._address)
            self._address = None

    def _arm(self, delay_s: float) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(delay_s, self._header_deadline)

    def _header_deadline(self) -> None:
        self._header_timer = None
        since, timeout_s = self._waiting_since, self.guard.header_timeout_s
        if since is None or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._waiting_since = None  # the headers came (in the read that started the request)
            return
        left = since + timeout_s - self.loop.time()
        if left > 0:
            self._arm(left)
            return
        log.info("closing a connection from %s: no complete request headers in %.0f s (server.header_timeout_s)",
                 self._address, timeout_s)  # fmt: skip
        self.transport.close()


def guarded_h11_protocol(connections: ClientConnections) -> type[H11Protocol]:
    """A `GuardedH11Protocol` class counting in `connections` (pass it as `uvicorn.Config(http=...)`)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": connections})


def server_options(connections: ClientConnections, idle_timeout_s: float) -> dict[str, Any]:
    """The `uvicorn.Config` keyword arguments that put `connections` in force."""
    return {"http": guarded_h11_protocol(connections), "timeout_keep_alive": idle_timeout_s}
