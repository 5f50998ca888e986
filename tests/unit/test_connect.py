"""`voltgate connect`: each client's settings names and values, what the plan decides (context, reply length,
compaction), and `--write`'s merge with a backup (files under a temporary home; no sockets)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from backends.base import DeploymentPlan, EngineName
from gateway.config import Config
from gateway.ops.connect import (
    ConnectError,
    Target,
    max_output_tokens,
    render,
    settings_for,
    target_for,
    to_toml,
    write,
)

TARGET = Target(base_url="http://gpu-1:8000", model="coder", small_model="coder-small", context=32768,
                max_output=4096)  # fmt: skip


def plan(name: str, context: int, task: str = "generate") -> DeploymentPlan:
    return DeploymentPlan.model_validate({"model": name, "engine": EngineName.LLAMACPP, "context_tokens": context,
                                          "source_path": Path(f"/m/{name}.gguf"), "model_format": "gguf",
                                          "slots": 1, "task": task})  # fmt: skip


def config(**server: Any) -> Config:
    models = [{"name": "embed", "sources": [{"gguf": "/m/e.gguf"}], "task": "embed"},
              {"name": "coder", "aliases": ["c"], "sources": [{"gguf": "/m/c.gguf"}], "context": 32768},
              {"name": "tiny", "sources": [{"gguf": "/m/t.gguf"}], "default_max_tokens": 256}]  # fmt: skip
    return Config.model_validate({"server": {"host": "0.0.0.0", "port": 9000, **server}, "models": models,
                                  "gpus": "none", "auth": {"keys_env": None}})  # fmt: skip


def test_the_target_takes_the_context_the_plan_gives_not_the_one_configured() -> None:
    plans = [plan("embed", 512, "embed"), plan("coder", 16384), plan("tiny", 8192)]  # coder fell back to 16k
    target = target_for(config(max_tokens_cap=4096), plans, model=None, small_model="tiny", url=None, key_env="K")
    assert (target.model, target.small_model, target.context) == ("coder", "tiny", 16384)
    assert (target.max_output, target.compact_window) == (4096, 12288)
    assert target.base_url == "http://127.0.0.1:9000" and target.open_mode
    by_alias = target_for(config(), plans, model="c", small_model=None, url="http://gw/v1/", key_env="K")
    assert (by_alias.model, by_alias.small_model, by_alias.base_url) == ("coder", "coder", "http://gw")
    with pytest.raises(ConnectError, match="no placed chat model is named 'embed'"):
        target_for(config(), plans, model="embed", small_model=None, url=None, key_env="K")


def test_a_reply_never_takes_more_than_a_quarter_of_the_context() -> None:
    assert max_output_tokens(32768, 4096, None) == 4096
    assert max_output_tokens(8192, 4096, 512) == 2048  # the cap, held to a quarter
    assert max_output_tokens(8192, None, 512) == 512  # the model's default_max_tokens
    assert max_output_tokens(8192, None, None) == 2048


def test_claude_code_gets_its_own_names_for_models_window_and_compaction(tmp_path: Path) -> None:
    settings = settings_for("claude-code", TARGET, tmp_path)
    ((path, body),) = settings.files.items()
    assert path == tmp_path / ".claude" / "settings.json" and body["model"] == "coder"
    env = body["env"]
    assert env["ANTHROPIC_BASE_URL"] == "http://gpu-1:8000"  # Claude Code appends /v1/messages
    assert (
        env["ANTHROPIC_MODEL"]
        == env["ANTHROPIC_DEFAULT_OPUS_MODEL"]
        == env["ANTHROPIC_DEFAULT_SONNET_MODEL"]
        == "coder"
    )
    assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "coder-small"
    assert (env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"], env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"]) == ("32768", "28672")
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "4096"
    assert body["apiKeyHelper"] == "printenv VOLTGATE_API_KEY" and "ANTHROPIC_AUTH_TOKEN" not in env
    assert settings.notes and "VOLTGATE_API_KEY" in settings.notes[0]


def test_codex_gets_a_responses_provider_and_the_models_window_in_valid_toml(tmp_path: Path) -> None:
    ((path, body),) = settings_for("codex", TARGET, tmp_path).files.items()
    parsed = tomllib.loads(render(path, body))
    assert parsed["model"] == "coder" and parsed["model_provider"] == "voltgate"
    assert (parsed["model_context_window"], parsed["model_max_output_tokens"]) == (32768, 4096)
    assert parsed["model_auto_compact_token_limit"] == 28672
    provider = parsed["model_providers"]["voltgate"]
    assert (provider["base_url"], provider["env_key"], provider["wire_api"]) == (
        "http://gpu-1:8000/v1", "VOLTGATE_API_KEY", "responses")  # fmt: skip


def test_opencode_and_open_webui(tmp_path: Path) -> None:
    ((path, body),) = settings_for("opencode", TARGET, tmp_path).files.items()
    assert path == tmp_path / ".config" / "opencode" / "opencode.json"
    provider = body["provider"]["voltgate"]
    assert provider["options"] == {"baseURL": "http://gpu-1:8000/v1", "apiKey": "{env:VOLTGATE_API_KEY}"}
    assert provider["models"]["coder"]["limit"] == {"context": 32768, "output": 4096}
    assert (body["model"], body["small_model"]) == ("voltgate/coder", "voltgate/coder-small")
    webui = settings_for("open-webui", TARGET, tmp_path)
    assert not webui.files and webui.env["OPENAI_API_BASE_URL"] == "http://gpu-1:8000/v1"
    assert webui.env["TASK_MODEL_EXTERNAL"] == "coder-small"


def test_write_merges_into_the_users_file_after_a_backup(tmp_path: Path) -> None:
    path = tmp_path / ".claude" / "settings.json"
    assert write(path, {"env": {"A": "1"}, "model": "m"}) is None  # a new file: nothing to back up
    path.write_text(json.dumps({"env": {"A": "old", "KEEP": "x"}, "permissions": {"allow": ["Bash"]}}))
    backup = write(path, {"env": {"A": "1"}, "model": "m"}, now=1234)
    assert backup == path.with_name("settings.json.bak-1234")
    assert json.loads(backup.read_text())["env"]["A"] == "old"
    assert json.loads(path.read_text()) == {"env": {"A": "1", "KEEP": "x"}, "permissions": {"allow": ["Bash"]},
                                            "model": "m"}  # fmt: skip


def test_write_keeps_a_codex_config_s_other_tables_and_refuses_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('model = "gpt-5"\n[mcp_servers.docs]\ncommand = "npx"\nargs = ["-y", "docs"]\n'
                    '[[skills]]\nname = "a"\n[profiles.fast]\nmodel = "x"\n')  # fmt: skip
    write(path, {"model": "coder", "model_providers": {"voltgate": {"name": "voltgate"}}}, now=1)
    parsed = tomllib.loads(path.read_text())
    assert parsed["model"] == "coder" and parsed["mcp_servers"]["docs"]["args"] == ["-y", "docs"]
    assert parsed["skills"] == [{"name": "a"}] and parsed["profiles"]["fast"]["model"] == "x"
    assert parsed["model_providers"]["voltgate"]["name"] == "voltgate"
    path.write_text("model = [unclosed\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        write(path, {"model": "coder"})
    assert path.read_text() == "model = [unclosed\n"


def test_toml_strings_escape_as_toml_reads_them() -> None:
    body = {"a": 'quote " back\\slash\nnewline', "b": True, "c": 1.5, "t": {"x y": {"k": [1, 2]}}}
    assert tomllib.loads(to_toml(body)) == body
