"""`voltgate connect` as a user runs it: a real subprocess planning the real SmolLM2 GGUF, printing each
client's settings and, with `--write`, merging them into the client's file under a temporary home."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def voltgate(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VOLTGATE_GPUS", "CODEX_HOME", "VOLTGATE_API_KEYS")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", "connect", *args], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**env, "HOME": str(home)}, check=False,
    )  # fmt: skip


@pytest.fixture
def config(tmp_path: Path, smollm2_path: Path) -> Path:
    path = tmp_path / "voltgate.yaml"
    path.write_text(yaml.safe_dump({
        "server": {"host": "0.0.0.0", "port": 8123, "max_tokens_cap": 1024},
        "gpus": "none",
        "models": [{"name": "smol-chat", "aliases": ["smol"], "alias_patterns": ["claude-*"], "context": 4096,
                    "sources": [{"gguf": str(smollm2_path)}]}],
    }))  # fmt: skip
    return path


def test_codex_config_is_printed_then_written_and_rewritten_with_a_backup(tmp_path: Path, config: Path) -> None:
    home = tmp_path / "home"
    printed = voltgate(home, "codex", "--config", str(config))
    assert printed.returncode == 0, printed.stderr
    assert "context 4096 tokens, replies up to 1024, compact at 3072" in printed.stderr
    assert "model_context_window = 4096" in printed.stdout and not (home / ".codex").exists()
    for _ in range(2):
        written = voltgate(home, "codex", "--config", str(config), "--write")
        assert written.returncode == 0, written.stderr
    parsed = tomllib.loads((home / ".codex" / "config.toml").read_text())
    assert (parsed["model"], parsed["model_max_output_tokens"], parsed["model_auto_compact_token_limit"]) == (
        "smol-chat", 1024, 3072)  # fmt: skip
    assert parsed["model_providers"]["voltgate"]["base_url"] == "http://127.0.0.1:8123/v1"
    assert len(list((home / ".codex").glob("config.toml.bak-*"))) == 1  # the second write backed up the first


def test_claude_code_settings_keep_the_users_own(tmp_path: Path, config: Path) -> None:
    home = tmp_path / "home"
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"env": {"MY_VAR": "1"}, "theme": "dark"}))
    done = voltgate(home, "claude-code", "--config", str(config), "--model", "smol", "--write")
    assert done.returncode == 0, done.stderr
    body = json.loads(settings.read_text())
    assert body["theme"] == "dark" and body["env"]["MY_VAR"] == "1" and body["model"] == "smol-chat"
    assert body["env"]["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "3072"
    assert body["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"


def test_an_unknown_client_or_model_is_an_error_naming_the_choices(tmp_path: Path, config: Path) -> None:
    unknown = voltgate(tmp_path, "cursor", "--config", str(config))
    assert unknown.returncode == 2 and "claude-code, codex, opencode, open-webui" in unknown.stderr
    missing = voltgate(tmp_path, "codex", "--config", str(config), "--model", "gpt-4o")
    assert missing.returncode == 2 and "smol, smol-chat" in missing.stderr
