"""`voltgate connect`: a client's settings for this gateway (Claude Code, Codex CLI, opencode, Open WebUI).

From a `Target` (where the gateway listens, which models to use, the context the plan gives the model and the
reply length it serves), each client's own settings file and environment, with the names each reads
(docs/agents.md, "voltgate connect"). `write` merges them into the client's file and backs the old one up first.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.base import DeploymentPlan
    from gateway.config import Config

Client = Literal["claude-code", "codex", "opencode", "open-webui"]
CLIENTS: tuple[Client, ...] = ("claude-code", "codex", "opencode", "open-webui")
PROVIDER = "voltgate"  # the provider id written into Codex's and opencode's configs
OPEN_MODE_KEY = "voltgate-open-mode"  # any string does in open mode; the clients insist on one


@dataclass(frozen=True)
class Target:
    """What a client must know of the gateway. `context`: the tokens the plan gives one session of `model`;
    `max_output`: the reply length to ask for (the gateway's cap, else the model's default, never more than a
    quarter of the context); `key_env`: the variable holding a voltgate key (`open_mode`: no key needed)."""

    base_url: str  # http://host:port, no /v1
    model: str
    small_model: str
    context: int
    max_output: int
    key_env: str = "VOLTGATE_API_KEY"
    open_mode: bool = False

    @property
    def compact_window(self) -> int:
        """The prompt size at which an agent should compact: the context less the reply it may ask for."""
        return self.context - self.max_output


def max_output_tokens(context: int, cap: int | None, default_max_tokens: int | None) -> int:
    """The reply length a client should ask for: `max_tokens_cap`, else the model's `default_max_tokens`, else a
    quarter of the context; never more than a quarter, so a prompt at the compact window still has room."""
    wanted = cap or default_max_tokens or context // 4
    return max(1, min(wanted, context // 4))


class ConnectError(Exception):
    """The config has no model to connect to as asked; the message says which names there are."""


def target_for(
    cfg: Config, plans: Sequence[DeploymentPlan], *, model: str | None, small_model: str | None,
    url: str | None, key_env: str,
) -> Target:  # fmt: skip
    """The `Target` for a config and its placed `plans`: `model` (a name or alias; default: the first placed
    chat model), `small_model` (default: `model`), the URL (default: the config's host and port, a wildcard
    host as 127.0.0.1), and open mode when the config and its key variable hold no key."""
    chat = {p.model: p for p in plans if p.task == "generate"}
    names = {name: spec.name for spec in cfg.models for name in (spec.name, *spec.aliases) if spec.name in chat}
    if not chat:
        raise ConnectError("no chat model of this config could be placed (see `voltgate plan`)")
    main = names.get(model, "") if model is not None else next(iter(chat))
    small = names.get(small_model, "") if small_model is not None else main
    for asked, found in ((model, main), (small_model, small)):
        if not found:
            raise ConnectError(f"no placed chat model is named {asked!r}; there are: {', '.join(sorted(names))}")
    spec = next(m for m in cfg.models if m.name == main)
    context = chat[main].context_tokens
    host = "127.0.0.1" if cfg.server.host in ("0.0.0.0", "::", "") else cfg.server.host
    keys_env = cfg.auth.keys_env
    open_mode = not cfg.auth.keys and not (keys_env and os.environ.get(keys_env))
    return Target(
        base_url=(url or f"http://{host}:{cfg.server.port}").rstrip("/").removesuffix("/v1"),
        model=main, small_model=small, context=context,
        max_output=max_output_tokens(context, cfg.server.max_tokens_cap, spec.default_max_tokens),
        key_env=key_env, open_mode=open_mode,
    )  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """One client's settings: `files` (path → the content to merge in), `env` (variables to export besides;
    Claude Code's go in its settings file's `env`), `notes` (what to do by hand, such as exporting the key)."""

    files: Mapping[Path, dict[str, Any]]
    env: Mapping[str, str]
    notes: tuple[str, ...] = ()


def settings_for(client: Client, target: Target, home: Path) -> Settings:
    """The settings of `client` for `target`, its files under `home` (the user's home directory)."""
    return _BUILDERS[client](target, home)


def _claude_code(t: Target, home: Path) -> Settings:
    """~/.claude/settings.json: the `env` Claude Code applies to every session, and its `model`. The names are
    Claude Code's (code.claude.com/docs env-vars, model-config): without CLAUDE_CODE_MAX_CONTEXT_TOKENS it
    assumes a window for a model it does not know (up to 1M) and never compacts before the real one overflows."""
    env = {
        "ANTHROPIC_BASE_URL": t.base_url,
        "ANTHROPIC_MODEL": t.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": t.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": t.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": t.small_model,  # background work (titles, summaries)
        "CLAUDE_CODE_SUBAGENT_MODEL": t.model,
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(t.context),
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(t.compact_window),
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(t.max_output),
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    body: dict[str, Any] = {"env": env, "model": t.model}
    notes: tuple[str, ...] = ()
    if t.open_mode:
        env["ANTHROPIC_AUTH_TOKEN"] = OPEN_MODE_KEY
    else:  # the key stays in its variable: Claude Code runs the helper and sends what it prints
        body["apiKeyHelper"] = f"printenv {t.key_env}"
        notes = (f"export {t.key_env}=<your voltgate key> before starting claude",)
    return Settings({home / ".claude" / "settings.json": body}, {}, notes)


def _codex(t: Target, home: Path) -> Settings:
    """$CODEX_HOME/config.toml (default ~/.codex): a `voltgate` provider on the Responses API, the model, and
    the model's window, reply length and compaction limit, which Codex otherwise guesses for a model it has
    no metadata for."""
    codex_home = Path(os.environ.get("CODEX_HOME", home / ".codex"))
    body = {
        "model": t.model,
        "model_provider": PROVIDER,
        "model_context_window": t.context,
        "model_max_output_tokens": t.max_output,
        "model_auto_compact_token_limit": t.compact_window,
        "model_providers": {
            PROVIDER: {
                "name": PROVIDER,
                "base_url": t.base_url + "/v1",
                "env_key": t.key_env,
                "wire_api": "responses",
                "stream_idle_timeout_ms": 600_000,
            }
        },
    }
    env = {t.key_env: OPEN_MODE_KEY} if t.open_mode else {}
    notes = () if t.open_mode else (f"export {t.key_env}=<your voltgate key> before starting codex",)
    return Settings({codex_home / "config.toml": body}, env, notes)


def _opencode(t: Target, home: Path) -> Settings:
    """~/.config/opencode/opencode.json: an OpenAI-compatible provider (`@ai-sdk/openai-compatible`) whose
    models carry their `limit` (context, output), which opencode compacts by, and the model choices."""
    models = {name: {"name": name, "limit": {"context": t.context, "output": t.max_output}}
              for name in dict.fromkeys((t.model, t.small_model))}  # fmt: skip
    key = OPEN_MODE_KEY if t.open_mode else f"{{env:{t.key_env}}}"
    body = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": PROVIDER,
                "options": {"baseURL": t.base_url + "/v1", "apiKey": key},
                "models": models,
            }
        },
        "model": f"{PROVIDER}/{t.model}",
        "small_model": f"{PROVIDER}/{t.small_model}",
    }
    notes = () if t.open_mode else (f"export {t.key_env}=<your voltgate key> before starting opencode",)
    return Settings({home / ".config" / "opencode" / "opencode.json": body}, {}, notes)


def _open_webui(t: Target, _home: Path) -> Settings:
    """Open WebUI reads its connection from the environment (e.g. `docker run --env-file`): the OpenAI
    connection, the model for its background tasks (titles, tags, follow-ups) and no Ollama probing."""
    env = {
        "OPENAI_API_BASE_URL": t.base_url + "/v1",
        "OPENAI_API_KEY": OPEN_MODE_KEY if t.open_mode else f"<your voltgate key, from ${t.key_env}>",
        "TASK_MODEL_EXTERNAL": t.small_model,
        "ENABLE_OLLAMA_API": "false",
    }
    return Settings({}, env, ("pass these to Open WebUI's container (--env-file) or its shell",))


_BUILDERS: dict[Client, Callable[[Target, Path], Settings]] = {
    "claude-code": _claude_code, "codex": _codex, "opencode": _opencode, "open-webui": _open_webui,
}  # fmt: skip


# -- rendering and writing --------------------------------------------------------------------------------
def render(path: Path, body: Mapping[str, Any]) -> str:
    """A settings file's text: TOML for `.toml`, else JSON."""
    return to_toml(body) if path.suffix == ".toml" else json.dumps(body, indent=2) + "\n"


def shell_exports(env: Mapping[str, str]) -> str:
    return "".join(f"export {name}={_shell_quote(value)}\n" for name, value in env.items())


def _shell_quote(value: str) -> str:
    return value if value.replace("_", "").replace("-", "").replace(".", "").isalnum() else json.dumps(value)


def merged(existing: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, Any]:
    """`existing` with `ours` laid over it, tables merged key by key (a user's other settings stay)."""
    out = dict(existing)
    for key, value in ours.items():
        old = out.get(key)
        out[key] = merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def write(path: Path, body: Mapping[str, Any], *, now: float | None = None) -> Path | None:
    """Merge `body` into the file at `path` (created if missing). An existing file is copied first to
    `<name>.bak-<unix time>`, whose path is returned; one that does not parse is an error, never overwritten.
    Raises `ValueError` naming the file when it cannot be read as what it should be."""
    existing: dict[str, Any] = {}
    backup = None
    if path.exists():
        text = path.read_text(encoding="utf-8")
        try:
            existing = tomllib.loads(text) if path.suffix == ".toml" else (json.loads(text) if text.strip() else {})
        except (tomllib.TOMLDecodeError, ValueError) as exc:
            raise ValueError(f"{path} is not valid {path.suffix[1:].upper()}: {exc}; fix or move it first") from None
        if not isinstance(existing, dict):
            raise ValueError(f"{path} does not hold an object at the top level; fix or move it first")
        backup = path.with_name(f"{path.name}.bak-{int(now if now is not None else time.time())}")
        shutil.copy2(path, backup)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(path, merged(existing, body)), encoding="utf-8")
    return backup


def to_toml(body: Mapping[str, Any]) -> str:
    """A TOML document of plain values, tables and arrays of tables (what Codex's config holds); comments in
    a file it replaces are kept only in the backup."""
    lines: list[str] = []
    _toml_table(body, (), lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_table(table: Mapping[str, Any], prefix: tuple[str, ...], lines: list[str]) -> None:
    def is_tables(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)

    plain = {k: v for k, v in table.items() if not isinstance(v, dict) and not is_tables(v)}
    if prefix and (plain or not table):
        lines += ["", f"[{'.'.join(map(_toml_key, prefix))}]"]
    lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in plain.items()]
    for key, value in table.items():
        if isinstance(value, dict):
            _toml_table(value, (*prefix, key), lines)
        elif is_tables(value):
            for item in value:
                lines += ["", f"[[{'.'.join(map(_toml_key, (*prefix, key)))}]]"]
                lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in item.items()]


def _toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "_-" for c in key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return str(value.isoformat()) if hasattr(value, "isoformat") else json.dumps(str(value))
