"""Which CPU features the host has, which the llama.cpp build uses (and where it is), and whether its extra
buffer types are safe.

Pure functions and stdlib only: the worker, the install self-test, `voltgate doctor` and the benchmarks all
import this module, and none of it loads llama.cpp.

The one decision here (docs/hardware.md, "The AMX crash"): llama.cpp's AMX matrix kernels
(`ggml_backend_amx_mul_mat`) crash with SIGSEGV on the first multi-token decode on Sapphire-Rapids-class
Xeons (llama.cpp issue #20824, open). A native build on such a host compiles them in, and llama.cpp moves
every supported weight into the "AMX" extra buffer type at load. Loading with `use_extra_bufts = false`
keeps the weights in ordinary CPU buffers, so the AMX kernels never run. We turn extra buffers off only
where the build has AMX and the host can run it; elsewhere the CPU "repack" buffer (faster Q4_0/Q4_K/IQ4_NL
matrix products on AVX2/AVX-512) stays on.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# What the operator can set: auto (the rule above), on (always use extra buffers), off (never).
ExtraBufts = Literal["auto", "on", "off"]
EXTRA_BUFTS_ENV = "VOLTGATE_LLAMA_EXTRA_BUFTS"
LIB_PATH_ENV = "LLAMA_CPP_LIB_PATH"


def llama_lib_dir() -> Path | None:
    """The folder llama-cpp-python loads libllama and libggml* from: `LLAMA_CPP_LIB_PATH` when set (a build of
    one's own), else the package's `lib/`; None when llama-cpp-python is not installed."""
    override = os.environ.get(LIB_PATH_ENV)
    if override:
        return Path(override)
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "lib"


def physical_cores(sys_cpu: Path = Path("/sys/devices/system/cpu")) -> int:
    """The physical cores this process may run on: one per distinct `thread_siblings_list`, as llama.cpp counts
    them for its default `-t` (`cpu_get_num_physical_cores`), but over the CPUs of this process's affinity mask
    only (llama.cpp looks at every CPU; a container pinned to 4 CPUs gets 4 here). A VM that shows no SMT
    siblings (16 vCPUs, 1 thread per core) gets 16, a 2-way SMT host half its logical CPUs; where the topology
    is not readable, the logical CPUs this process may use."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    siblings = set()
    for cpu in cpus:
        try:
            siblings.add((sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text().strip())
        except OSError:
            return max(1, len(cpus))
    return max(1, len(siblings))


# Written by the install self-test when the default crashed and the safe variant worked (see selftest.py).
SAFE_SETTINGS_FILE = "voltgate-llama-safe.json"


def host_cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The `flags` of the first processor in /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def host_cpu_model(cpuinfo: str | None = None) -> str:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return "unknown"
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return "unknown"


def system_info_sections(system_info: str) -> dict[str, dict[str, str]]:
    """`llama_print_system_info()` by backend: `CPU : SSE3 = 1 | ... | CUDA : ARCHS = 700,900 | ...` gives
    {"CPU": {"SSE3": "1", ...}, "CUDA": {"ARCHS": "700,900", ...}}."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = sections.setdefault("", {})
    for part in system_info.split("|"):
        head, sep, rest = part.partition(" : ")
        if sep and "=" not in head:
            current = sections.setdefault(head.strip(), {})
            part = rest
        name, eq, value = part.partition("=")
        if eq and name.strip():
            current[name.strip()] = value.strip()
    sections.pop("", None)
    return sections


def build_features(system_info: str) -> dict[str, bool]:
    """The CPU backend's features as {feature: on}: `CPU : SSE3 = 1 | AVX = 1 | ... | AMX_INT8 = 1 | ...`."""
    cpu = system_info_sections(system_info).get("CPU", {})
    return {name: value != "0" for name, value in cpu.items()}


def host_has_amx(flags: frozenset[str]) -> bool:
    """Whether the host flags (Linux /proc/cpuinfo names) say the AMX tile unit is present."""
    return "amx_tile" in flags and ("amx_int8" in flags or "amx_bf16" in flags)


@dataclass(frozen=True)
class ExtraBuftsDecision:
    use_extra_bufts: bool
    setting: ExtraBufts
    reason: str


def decide_extra_bufts(
    host_flags: frozenset[str], build: dict[str, bool], setting: ExtraBufts = "auto"
) -> ExtraBuftsDecision:
    """Whether llama.cpp may move weights into its extra (AMX / repack) buffer types on this host."""
    if setting == "on":
        return ExtraBuftsDecision(True, setting, f"{EXTRA_BUFTS_ENV}=on: extra buffer types forced on")
    if setting == "off":
        return ExtraBuftsDecision(False, setting, f"extra buffer types off by setting ({EXTRA_BUFTS_ENV}=off)")
    if build.get("AMX_INT8") and host_has_amx(host_flags):
        return ExtraBuftsDecision(
            False,
            setting,
            "the llama.cpp build has AMX kernels and this CPU runs them: they crash (llama.cpp #20824), "
            "so weights stay in plain CPU buffers (use_extra_bufts=false)",
        )
    return ExtraBuftsDecision(True, setting, "no AMX kernels in use: extra (repack) buffer types on")


def configured_setting(prefix: str | None = None) -> ExtraBufts:
    """The operator's setting: the environment variable, else what the self-test recorded, else auto."""
    value = os.environ.get(EXTRA_BUFTS_ENV, "").strip().lower()
    if value in ("auto", "on", "off"):
        return value  # type: ignore[return-value]
    recorded = read_safe_setting(prefix)
    return recorded if recorded is not None else "auto"


def safe_settings_path(prefix: str | None = None) -> Path:
    import sys

    return Path(prefix or sys.prefix) / SAFE_SETTINGS_FILE


def read_safe_setting(prefix: str | None = None) -> ExtraBufts | None:
    import json

    path = safe_settings_path(prefix)
    try:
        value = json.loads(path.read_text()).get("extra_bufts")
    except (OSError, ValueError, AttributeError):
        return None
    return value if value in ("auto", "on", "off") else None
