"""`voltgate doctor` and `voltgate selftest` as a user runs them: real subprocesses, the real llama.cpp build,
a real decode of the embedded model. `--json` is validated against tests/schemas/doctor.schema.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.integration
SCHEMA = json.loads((REPO / "tests" / "schemas" / "doctor.schema.json").read_text())


def voltgate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("GGML_CUDA_FORCE_MMQ", "VOLTGATE_GPUS")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], cwd=REPO, capture_output=True, text=True, timeout=300,
        env=environment, check=False,
    )  # fmt: skip


def doctor_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    done = voltgate("doctor", "--json", *args, env=env)
    report = json.loads(done.stdout)
    jsonschema.validate(report, SCHEMA)
    return done.returncode, report


def rows(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in report["checks"]}


def test_doctor_on_this_host_passes_with_a_real_decode() -> None:
    code, report = doctor_json()
    checks = rows(report)
    assert code == 0 and report["ok"], report
    assert checks["python"]["verdict"] == "ok"
    assert checks["llama.cpp build"]["found"].startswith("llama-cpp-python 0.3.36")
    assert checks["decode self-test"]["verdict"] == "ok" and "tok/s" in checks["decode self-test"]["found"]
    assert "AMX" in checks["amx"]["found"]
    assert checks["llama.cpp cuda"]["found"].startswith("off")
    assert checks["model smollm2-135m"]["verdict"] == "ok"


def test_doctor_with_a_simulated_v100_says_the_cpu_build_wastes_the_gpu() -> None:
    code, report = doctor_json("--gpus", "2xv100-16gb", "--no-selftest")
    checks = rows(report)
    assert code == 0
    assert "sm7.0" in checks["gpu 0"]["found"] and "simulated" in checks["gpu 1"]["found"]
    assert checks["llama.cpp cuda"]["verdict"] == "warn"
    assert "CMAKE_CUDA_ARCHITECTURES=70" in checks["llama.cpp cuda"]["todo"]
    assert "lmdeploy" in checks["lmdeploy"]["todo"]


def test_doctor_warns_about_forced_mmq() -> None:
    _, report = doctor_json("--gpus", "v100-32gb", "--no-selftest", env={"GGML_CUDA_FORCE_MMQ": "1"})
    assert rows(report)["GGML_CUDA_FORCE_MMQ"]["verdict"] == "warn"


def test_a_missing_model_file_is_a_blocker_with_exit_status_1(tmp_path: Path) -> None:
    config = tmp_path / "voltgate.yaml"
    config.write_text(yaml.safe_dump({
        "gpus": "none", "models": [{"name": "gone", "sources": [{"gguf": str(tmp_path / "missing.gguf")}]}],
    }))  # fmt: skip
    code, report = doctor_json("--config", str(config), "--no-selftest")
    assert code == 1 and not report["ok"]
    assert rows(report)["model gone"]["verdict"] == "fail"
    text = voltgate("doctor", "--config", str(config), "--no-selftest")
    assert text.returncode == 1 and "BLOCKED" in text.stdout and "missing" in text.stdout


def test_an_unreadable_config_is_a_blocker(tmp_path: Path) -> None:
    config = tmp_path / "voltgate.yaml"
    config.write_text("models: [{name: x, sources: [], context: nope}]\n")
    code, report = doctor_json("--config", str(config), "--no-selftest")
    assert code == 1 and rows(report)["config"]["verdict"] == "fail"


def test_selftest_decodes_the_embedded_model() -> None:
    done = voltgate("selftest")
    assert done.returncode == 0, done.stderr
    assert "llama.cpp decodes on this host" in done.stdout and "tok/s" in done.stdout
    off = voltgate("selftest", env={"VOLTGATE_LLAMA_EXTRA_BUFTS": "off"})
    assert off.returncode == 0 and "extra buffers off" in off.stdout
