"""API keys: hashed keys from the config, plain keys from an env var, per-key model allow-lists and limits.

Keys are compared as sha256 digests in constant time; only a short key id ever reaches logs or metrics.
No key configured means open mode, which the gateway announces loudly at start.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import deque
from dataclasses import dataclass, field

from gateway.config import AuthSettings, KeySpec
from gateway.errors import ErrorCode, GatewayError

KEY_PREFIX = "vg-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass
class Principal:
    """Who is calling, with their limits and live usage counters."""

    key_id: str
    models: tuple[str, ...] = ()
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    scopes: tuple[str, ...] = ()  # extra rights: "admin" = the /admin API
    in_flight: int = 0
    _requests: deque[float] = field(default_factory=deque)
    _tokens: deque[tuple[float, int]] = field(default_factory=deque)
    _token_total: int = 0  # the sum of `_tokens`' counts, kept as they come and go (never re-summed)

    def check_model(self, model: str, aliases: tuple[str, ...] = ()) -> None:
        if self.models and model not in self.models and not set(aliases) & set(self.models):
            raise GatewayError(
                ErrorCode.MODEL_NOT_ALLOWED, f"key {self.key_id!r} may not use model {model!r}", param="model"
            )

    def admit(self) -> None:
        """Count a request against the key's limits or raise 429 with Retry-After."""
        now = time.monotonic()
        while self._requests and now - self._requests[0] > 60:
            self._requests.popleft()
        while self._tokens and now - self._tokens[0][0] > 60:
            self._token_total -= self._tokens.popleft()[1]
        if self.max_concurrent is not None and self.in_flight >= self.max_concurrent:
            raise GatewayError(
                ErrorCode.RATE_LIMITED,
                f"key {self.key_id!r} has {self.in_flight} requests in flight (limit {self.max_concurrent})",
                retry_after_s=2,
            )
        if self.requests_per_minute is not None and len(self._requests) >= self.requests_per_minute:
            raise GatewayError(
                ErrorCode.RATE_LIMITED,
                f"key {self.key_id!r} exceeded {self.requests_per_minute} requests per minute",
                retry_after_s=60 - (now - self._requests[0]),
            )
        if self.tokens_per_minute is not None and self.tokens_in_window >= self.tokens_per_minute:
            raise GatewayError(
                ErrorCode.RATE_LIMITED,
                f"key {self.key_id!r} exceeded {self.tokens_per_minute} tokens per minute",
                retry_after_s=60 - (now - self._tokens[0][0]),
            )
        if self.requests_per_minute is not None:
            self._requests.append(now)
        self.in_flight += 1

    @property
    def tokens_in_window(self) -> int:
        """Tokens this key used in its last 60 s, as of its last `admit()` (O(1): a running total)."""
        return self._token_total

    def done(self, tokens: int) -> None:
        self.in_flight -= 1
        if tokens and self.tokens_per_minute is not None:  # a key without a token limit keeps no window
            self._tokens.append((time.monotonic(), tokens))
            self._token_total += tokens


def presented_key(authorization: str | None, api_key: str | None = None) -> str | None:
    """The key a request carries: `Authorization: Bearer <key>` (OpenAI's SDKs) or `x-api-key: <key>`
    (Anthropic's); the bearer key wins when both are sent. None when neither is there."""
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return api_key.strip() if api_key else None


OPEN = Principal(key_id="open")
ANONYMOUS = Principal(key_id="-")  # a request refused before its key was checked (logs and metrics only)


class KeyStore:
    def __init__(self, settings: AuthSettings, env_keys: str | None) -> None:
        self._by_hash: dict[str, Principal] = {}
        for spec in settings.keys:
            self._add(spec)
        for i, plain in enumerate(k.strip() for k in (env_keys or "").split(",")):
            if plain:
                digest = hash_key(plain)
                self._by_hash[digest] = Principal(key_id=f"env-{i}-{digest[:6]}")

    def _add(self, spec: KeySpec) -> None:
        self._by_hash[spec.sha256] = Principal(
            key_id=spec.id,
            models=spec.models,
            requests_per_minute=spec.requests_per_minute,
            tokens_per_minute=spec.tokens_per_minute,
            max_concurrent=spec.max_concurrent,
            scopes=spec.scopes,
        )

    @property
    def open_mode(self) -> bool:
        return not self._by_hash

    def authenticate(self, authorization: str | None, api_key: str | None = None) -> Principal:
        """The caller of a request with these `Authorization` and `x-api-key` headers (see `presented_key`)."""
        if self.open_mode:
            return OPEN
        key = presented_key(authorization, api_key)
        if key is None:
            raise GatewayError(
                ErrorCode.INVALID_API_KEY,
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
            )
        digest = hash_key(key)
        match: Principal | None = None
        for known, principal in self._by_hash.items():  # compare every entry: no early exit on a hit
            if hmac.compare_digest(known, digest):
                match = principal
        if match is None:
            raise GatewayError(ErrorCode.INVALID_API_KEY, "Incorrect API key provided.")
        return match
