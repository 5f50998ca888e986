"""The AMX decision: extra buffer types off only where the llama.cpp build has AMX and the CPU runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.llamacpp import cpu_features as cf

SPR_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu sse2 avx avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8 avx_vnni
"""
EPYC_CPUINFO = """processor\t: 0
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 avx512f avx512_vnni avx512_bf16
"""
# What llama_print_system_info() printed on the AMX Xeon (bench/results/2026-12-01-amx), a native build:
NATIVE_AMX = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 "
    "| AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
)
NO_AMX = NATIVE_AMX.replace(" AMX_INT8 = 1 |", "")


def test_host_flags_and_model_are_read_from_cpuinfo() -> None:
    flags = cf.host_cpu_flags(SPR_CPUINFO)
    assert {"amx_tile", "amx_int8", "avx512f"} <= flags
    assert cf.host_has_amx(flags)
    assert not cf.host_has_amx(cf.host_cpu_flags(EPYC_CPUINFO))
    assert cf.host_cpu_model(SPR_CPUINFO) == "Intel(R) Xeon(R) Platinum 8488C"
    assert cf.host_cpu_flags("no flags here") == frozenset()


def test_system_info_is_split_by_backend() -> None:
    sections = cf.system_info_sections(NATIVE_AMX + " CUDA : ARCHS = 700,900 | USE_GRAPHS = 1 | FORCE_MMQ = 1 |")
    assert sections["CPU"]["AMX_INT8"] == "1"
    assert sections["CUDA"] == {"ARCHS": "700,900", "USE_GRAPHS": "1", "FORCE_MMQ": "1"}
    assert "ARCHS" not in sections["CPU"]
    assert cf.build_features(NO_AMX).get("AMX_INT8") is None


@pytest.mark.parametrize(
    ("cpuinfo", "info", "use"),
    [
        (SPR_CPUINFO, NATIVE_AMX, False),  # the crash: AMX kernels compiled in, and the CPU runs them
        (SPR_CPUINFO, NO_AMX, True),  # the Makefile's build on an AMX host: repack stays on
        (EPYC_CPUINFO, NATIVE_AMX, True),  # a prebuilt AMX wheel on a CPU without AMX: its kernels never run
        (EPYC_CPUINFO, NO_AMX, True),
    ],
)
def test_auto_turns_extra_buffers_off_only_where_amx_would_run(cpuinfo: str, info: str, use: bool) -> None:
    decision = cf.decide_extra_bufts(cf.host_cpu_flags(cpuinfo), cf.build_features(info))
    assert decision.use_extra_bufts is use
    assert ("#20824" in decision.reason) is (not use)


def test_the_operator_setting_wins_both_ways() -> None:
    amx, build = cf.host_cpu_flags(SPR_CPUINFO), cf.build_features(NATIVE_AMX)
    assert cf.decide_extra_bufts(amx, build, "on").use_extra_bufts is True
    epyc, plain = cf.host_cpu_flags(EPYC_CPUINFO), cf.build_features(NO_AMX)
    assert cf.decide_extra_bufts(epyc, plain, "off").use_extra_bufts is False


def test_setting_comes_from_the_environment_then_the_self_tests_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(cf.EXTRA_BUFTS_ENV, raising=False)
    assert cf.configured_setting(str(tmp_path)) == "auto"
    cf.safe_settings_path(str(tmp_path)).write_text(json.dumps({"extra_bufts": "off"}))
    assert cf.configured_setting(str(tmp_path)) == "off"
    monkeypatch.setenv(cf.EXTRA_BUFTS_ENV, "ON")
    assert cf.configured_setting(str(tmp_path)) == "on"
    monkeypatch.setenv(cf.EXTRA_BUFTS_ENV, "nonsense")  # an unreadable value is ignored, not fatal
    assert cf.configured_setting(str(tmp_path)) == "off"
    cf.safe_settings_path(str(tmp_path)).write_text("{broken")
    assert cf.configured_setting(str(tmp_path)) == "auto"


def _topology(root: Path, siblings: list[str]) -> Path:
    for cpu, shared in enumerate(siblings):
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "thread_siblings_list").write_text(shared + "\n")
    return root


def test_physical_cores_count_distinct_sibling_sets_of_the_cpus_this_process_may_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp's default `-t`: a VM with 4 vCPUs and no SMT has 4 cores (the worker took half the logical
    CPUs before: 2); a 2-way SMT host half its logical CPUs; unreadable topology: the logical CPUs."""
    monkeypatch.setattr(cf.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert cf.physical_cores(_topology(tmp_path / "vm", ["0", "1", "2", "3"])) == 4
    assert cf.physical_cores(_topology(tmp_path / "smt", ["0,2", "1,3", "0,2", "1,3"])) == 2
    assert cf.physical_cores(tmp_path / "none") == 4
    monkeypatch.setattr(cf.os, "sched_getaffinity", lambda pid: {1, 3})  # pinned to two CPUs
    assert cf.physical_cores(tmp_path / "vm") == 2 and cf.physical_cores(tmp_path / "smt") == 1
