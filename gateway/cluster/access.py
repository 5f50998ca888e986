"""How a worker another host reaches is launched: bound to the interface the operator names, with a secret.

`remote_launch_spec` rewrites an engine adapter's `LaunchSpec` (which binds the loopback) to bind `bind_host`
and to require `token`: our llama.cpp worker reads it from `VOLTGATE_WORKER_TOKEN`
(`backends.llamacpp.worker.auth`); LMDeploy's api_server takes it as `--api-keys` (its own bearer check; the
token is then visible in that host's process list, docs/cluster.md says so). The gateway sends
`auth_headers(token)` on every call to that worker, health checks included.
"""

from __future__ import annotations

import secrets

from backends.base import LaunchSpec
from backends.llamacpp.worker.auth import TOKEN_ENV

_BIND_FLAGS = ("--host", "--server-name")  # our llama.cpp worker, LMDeploy's api_server
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def new_worker_token() -> str:
    """A fresh secret for one launch (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def remote_launch_spec(spec: LaunchSpec, bind_host: str, token: str) -> LaunchSpec:
    """`spec` binding `bind_host` instead of the loopback and refusing calls without `token`.

    Raises ValueError for an empty token: a worker bound beyond the loopback without one would be an open
    model server."""
    if not token:
        raise ValueError("a worker other hosts can reach needs a launch token")
    argv = list(spec.argv)
    for flag in _BIND_FLAGS:
        if flag in argv:
            argv[argv.index(flag) + 1] = bind_host
    if "api_server" in argv:
        argv += ["--api-keys", token]
    return spec.model_copy(update={"argv": tuple(argv), "env": {**spec.env, TOKEN_ENV: token}})
