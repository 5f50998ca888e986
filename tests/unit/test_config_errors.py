"""Config errors through the CLI: one short message that names the key, exit status 2, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import cli
from gateway.config import ConfigError, load_config

MODEL = "models: [{name: m, sources: [{gguf: m.gguf}]}]\n"


def run_plan(tmp_path: Path, text: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    config = tmp_path / "voltgate.yaml"
    config.write_text(text)
    result = CliRunner().invoke(cli, ["plan", "--config", str(config), *args], env=env)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("text", "args", "expected"),
    [
        ("gpus: 3xfoo\n" + MODEL, (), "gpus: GPU layout '3xfoo': cannot read 'foo'"),
        ("gpus: 17xv100-16gb\n" + MODEL, (), "gpus: GPU layout '17xv100-16gb': count must be 1-16"),
        ("gpus: 'a10:lots:8.6'\n" + MODEL, (), "gpus: GPU layout 'a10:lots:8.6': in 'a10:lots:8.6' memory must be"),
        (MODEL, ("--gpus", "2xbar"), "gpus (from --gpus or VOLTGATE_GPUS): GPU layout '2xbar'"),
        ("server: foo\n" + MODEL, (), "server: expected a mapping of settings"),
        ("models: [{name: m, sources: [{ggu: m.gguf}]}]\n", (), "models.0.sources.0: a source needs one of the keys"),
        ("models: [{name: m, sources: [{hf: m, format: hff}]}]\n", (), "models.0.sources.0.format: Input should be"),
        ("models: [{name: m, sources: [{gguf: m.gguf}], tp: 3}]\n", (), "models.0.tp: tp must be a power of two"),
        ("models: [{name: m, sources: [{gguf: m.gguf}], contxt: 9}]\n", (), "models.0.contxt: unknown key"),
    ],
)
def test_a_config_error_is_one_short_message_naming_the_key(
    tmp_path: Path, text: str, args: tuple[str, ...], expected: str
) -> None:
    code, output = run_plan(tmp_path, text, *args)
    assert code == 2, output
    assert "Traceback" not in output and "Error:" not in output.replace("error:", "")
    lines = output.strip().splitlines()
    assert len(lines) == 2, output  # "error: FILE: invalid configuration" and the key's line
    assert expected in lines[1], output


def test_a_bad_environment_override_names_the_variable(tmp_path: Path) -> None:
    code, output = run_plan(tmp_path, MODEL, env={"VOLTGATE_PORT": "eighty"})
    assert code == 2
    assert output.strip().splitlines() == [
        "error: invalid environment override: VOLTGATE_PORT: Input should be a valid integer, unable to parse "
        "string as an integer"
    ]


def test_a_config_path_that_is_a_directory_is_a_config_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["plan", "--config", str(tmp_path)])
    assert result.exit_code == 2
    assert "cannot read the config file" in result.output and "Traceback" not in result.output


def test_load_config_raises_config_error_for_a_bad_layout(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("gpus: 3xfoo\n" + MODEL)
    with pytest.raises(ConfigError, match=r"gpus: GPU layout '3xfoo'"):
        load_config(config)


@pytest.mark.parametrize("gpus", ["auto", "none", "v100-16gb", "2xv100-32gb", "v100-32gb,2xv100-16gb", "a10:24:8.6"])
def test_good_layouts_still_load(tmp_path: Path, gpus: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"gpus: '{gpus}'\n" + MODEL)
    assert load_config(config).gpus == gpus


@pytest.mark.parametrize("args", [(), ("--json",)])
def test_plan_exits_1_when_every_model_is_refused_as_serve_does(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, ["plan", "--config", str(write(tmp_path, "gpus: none\n" + MODEL)), *args])
    assert result.exit_code == 1, result.output
    assert "no model could be placed" in result.output and "Traceback" not in result.output
    if args:
        assert json.loads(result.stdout)["decisions"][0]["plan"] is None  # the report is still printed whole


def write(tmp_path: Path, text: str) -> Path:
    config = tmp_path / "voltgate.yaml"
    config.write_text(text)
    return config
