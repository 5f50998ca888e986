"""`self_test`: the decision around the probe (the probe itself runs for real in tests/integration)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.llamacpp import cpu_features as cf
from backends.llamacpp.selftest import ProbeResult, ProbeRun, self_test

MODEL = Path("model.gguf")
RESULT = ProbeResult(26, 8, 200.0, 40.0, " Madrid.", True, "CPU : AVX2 = 1 |")


def ok(setting: str) -> ProbeRun:
    return ProbeRun(True, 0, None, RESULT, "", setting)


def segv(setting: str) -> ProbeRun:
    return ProbeRun(False, -11, "SIGSEGV", None, "ggml_backend_amx_mul_mat\n", setting)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cf.EXTRA_BUFTS_ENV, raising=False)


def test_a_host_that_decodes_passes_with_one_probe(tmp_path: Path) -> None:
    calls: list[str] = []
    outcome = self_test(MODEL, probe=lambda _m, s: calls.append(s) or ok(s), prefix=str(tmp_path))
    assert outcome.ok and calls == ["auto"]
    assert not cf.safe_settings_path(str(tmp_path)).exists()


def test_a_crash_with_the_default_records_the_safe_setting_that_works(tmp_path: Path) -> None:
    calls: list[str] = []

    def probe(_m: Path, setting: str) -> ProbeRun:
        calls.append(setting)
        return segv(setting) if setting == "auto" else ok(setting)

    outcome = self_test(MODEL, probe=probe, prefix=str(tmp_path))
    assert outcome.ok and outcome.setting == "off" and calls == ["auto", "off"]
    record = json.loads(cf.safe_settings_path(str(tmp_path)).read_text())
    assert record["extra_bufts"] == "off" and "SIGSEGV" in record["why"]
    assert cf.configured_setting(str(tmp_path)) == "off"  # what every worker then loads with
    assert "crashed" in outcome.message


def test_when_nothing_decodes_it_fails_in_plain_words(tmp_path: Path) -> None:
    outcome = self_test(MODEL, probe=lambda _m, s: segv(s), prefix=str(tmp_path))
    assert not outcome.ok
    assert "killed by SIGSEGV" in outcome.message
    assert "voltgate doctor" in outcome.message and "What to do" in outcome.message
    assert "ggml_backend_amx_mul_mat" in outcome.message  # the child's last lines are shown
    assert not cf.safe_settings_path(str(tmp_path)).exists()
