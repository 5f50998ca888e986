"""A short real decode in a child process: proves the llama.cpp build answers on this host before we serve.

`probe()` loads a GGUF the way the workers do (the same `use_extra_bufts` decision), decodes a multi-token
prompt in one batch and then a few tokens one at a time, and times both. `run_probe()` runs it in a child
process, so a crash (SIGSEGV in a native kernel, the AMX bug) is reported instead of killing the caller.
`self_test()` is what `voltgate selftest` (run by `make run` and `make test` after every install) does: probe
with the automatic setting and, if that crashes, with extra buffer types off; record the safe setting when
only the second works; fail in plain words when neither does.

    python -m backends.llamacpp.selftest --model M.gguf [--extra-bufts auto|on|off] [--gpu-layers N] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from backends.llamacpp import cpu_features

PROMPT = (
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome. "
    "The capital of Spain is"
)


@dataclass(frozen=True)
class ProbeResult:
    prompt_tokens: int
    generated_tokens: int
    prefill_tok_s: float
    decode_tok_s: float
    text: str
    use_extra_bufts: bool
    system_info: str


@dataclass(frozen=True)
class ProbeSpec:
    """How a probe loads and decodes: the extra-buffers setting, GPU layers, threads, prompt and output sizes
    (`prompt_tokens` 0: the prompt as written)."""

    setting: cpu_features.ExtraBufts = "auto"
    n_gpu_layers: int = 0
    n_threads: int | None = None
    prompt_tokens: int = 0
    gen_tokens: int = 8

    def argv(self) -> list[str]:
        """The child's options (`main` reads them back)."""
        out = [
            "--extra-bufts",
            self.setting,
            "--gpu-layers",
            str(self.n_gpu_layers),
            "--gen-tokens",
            str(self.gen_tokens),
        ]
        if self.n_threads:
            out += ["--threads", str(self.n_threads)]
        if self.prompt_tokens:
            out += ["--prompt-tokens", str(self.prompt_tokens)]
        return out


def probe(model: Path, spec: ProbeSpec) -> ProbeResult:
    """Load `model`, decode the prompt (or `prompt_tokens` tokens of it, repeated) and `gen_tokens` more."""
    from backends.llamacpp.worker import native

    lib = native.lib
    native.init_backend()
    decision = native.extra_bufts_decision(spec.setting)
    n_threads, prompt_tokens, gen_tokens = spec.n_threads, spec.prompt_tokens, spec.gen_tokens
    loaded = native.load_model(model, n_gpu_layers=spec.n_gpu_layers, decision=decision)
    try:
        vocab = lib.llama_model_get_vocab(loaded)
        tokens = _tokenize(lib, vocab, PROMPT)
        if prompt_tokens:
            tokens = (tokens * (prompt_tokens // len(tokens) + 1))[:prompt_tokens]
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = len(tokens) + gen_tokens + 8
        cparams.n_batch = cparams.n_ubatch = max(len(tokens), 8)
        cparams.no_perf = True
        if n_threads:
            cparams.n_threads = cparams.n_threads_batch = n_threads
        ctx = lib.llama_init_from_model(loaded, cparams)
        if not ctx:
            raise native.NativeError("failed to create a llama.cpp context")
        try:
            prefill, decode, out = _generate(lib, ctx, vocab, tokens, gen_tokens)
        finally:
            lib.llama_free(ctx)
    finally:
        lib.llama_model_free(loaded)
    return ProbeResult(
        prompt_tokens=len(tokens),
        generated_tokens=gen_tokens,
        prefill_tok_s=len(tokens) / prefill,
        decode_tok_s=gen_tokens / decode if decode > 0 else 0.0,
        text=out,
        use_extra_bufts=decision.use_extra_bufts,
        system_info=native.system_info(),
    )


def _tokenize(lib: Any, vocab: Any, text: str) -> list[int]:
    raw = text.encode()
    buf = (ctypes.c_int32 * (len(raw) + 8))()
    n = lib.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, True)
    return list(buf[:n])


def _generate(lib: Any, ctx: Any, vocab: Any, tokens: list[int], n: int) -> tuple[float, float, str]:
    arr = (ctypes.c_int32 * len(tokens))(*tokens)
    t0 = time.perf_counter()
    if lib.llama_decode(ctx, lib.llama_batch_get_one(arr, len(tokens))) != 0:
        raise RuntimeError("llama_decode failed on the prompt")
    t1 = time.perf_counter()
    n_vocab = int(lib.llama_vocab_n_tokens(vocab))
    pieces = []
    one = (ctypes.c_int32 * 1)()
    for _ in range(n):
        logits = lib.llama_get_logits_ith(ctx, -1)
        best = _argmax(logits, n_vocab)
        one[0] = best
        piece = ctypes.create_string_buffer(64)
        size = lib.llama_token_to_piece(vocab, best, piece, 64, 0, False)
        pieces.append(piece.raw[: max(size, 0)])
        if lib.llama_decode(ctx, lib.llama_batch_get_one(one, 1)) != 0:
            raise RuntimeError("llama_decode failed on a generated token")
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, b"".join(pieces).decode("utf-8", "replace")


def _argmax(logits: Any, n_vocab: int) -> int:
    import numpy as np

    view = np.ctypeslib.as_array(logits, shape=(n_vocab,))
    return int(view.argmax())


@dataclass(frozen=True)
class ProbeRun:
    """One probe in a child process: its result, or how the child died."""

    ok: bool
    returncode: int
    signal: str | None
    result: ProbeResult | None
    stderr_tail: str
    setting: str

    def describe(self) -> str:
        if self.ok and self.result is not None:
            r = self.result
            return (
                f"ok: {r.prompt_tokens}-token prompt at {r.prefill_tok_s:.0f} tok/s, "
                f"{r.generated_tokens} tokens at {r.decode_tok_s:.0f} tok/s (extra buffers "
                f"{'on' if r.use_extra_bufts else 'off'})"
            )
        how = f"killed by {self.signal}" if self.signal else f"exit status {self.returncode}"
        return f"the decode {how}"


def run_probe(model: Path, spec: ProbeSpec | None = None, *, timeout_s: float = 300.0) -> ProbeRun:
    """`probe` in a child process: its result, or the signal or exit status it died with."""
    spec = spec or ProbeSpec()
    setting = spec.setting
    cmd = [sys.executable, "-m", "backends.llamacpp.selftest", "--probe", "--json", "--model", str(model)]
    cmd += spec.argv()
    env = dict(os.environ)
    env.pop(cpu_features.EXTRA_BUFTS_ENV, None)  # the setting is explicit here
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        return ProbeRun(False, -1, "timeout", None, tail.decode() if isinstance(tail, bytes) else tail, setting)
    sig = signal.Signals(-done.returncode).name if done.returncode < 0 else None
    result = None
    if done.returncode == 0:
        try:
            result = ProbeResult(**json.loads(done.stdout.strip().splitlines()[-1]))
        except (ValueError, TypeError, IndexError):
            return ProbeRun(False, 0, None, None, done.stdout[-2000:] + done.stderr[-2000:], setting)
    return ProbeRun(done.returncode == 0, done.returncode, sig, result, done.stderr[-2000:], setting)


@dataclass(frozen=True)
class SelfTest:
    """What `self_test` found: `ok` means this host answers with `setting` (recorded when it is not auto)."""

    ok: bool
    setting: str
    runs: tuple[ProbeRun, ...]
    message: str


Probe = Callable[[Path, cpu_features.ExtraBufts], ProbeRun]


def _run(model: Path, setting: cpu_features.ExtraBufts) -> ProbeRun:
    return run_probe(model, ProbeSpec(setting=setting))


def self_test(model: Path, *, probe: Probe = _run, prefix: str | None = None) -> SelfTest:
    """Decode with the configured setting; if that crashes, with extra buffer types off (recorded for the
    workers when it works); fail with what to do when neither answers."""
    setting = cpu_features.configured_setting(prefix)
    first = probe(model, setting)
    if first.ok:
        return SelfTest(True, setting, (first,), f"llama.cpp decodes on this host: {first.describe()}")
    if setting != "off":
        second = probe(model, "off")
        if second.ok:
            _record_safe_setting("off", first, prefix)
            return SelfTest(
                True, "off", (first, second),
                f"the default llama.cpp setting crashed here ({first.describe()}); with extra buffer types off it "
                f"works ({second.describe()}), so voltgate now loads every model that way on this host "
                f"(recorded in {cpu_features.safe_settings_path(prefix)}; docs/troubleshooting.md)",
            )  # fmt: skip
        runs: tuple[ProbeRun, ...] = (first, second)
    else:
        runs = (first,)
    return SelfTest(False, setting, runs, _failure_text(first))


def _record_safe_setting(setting: str, crashed: ProbeRun, prefix: str | None) -> None:
    record = {
        "extra_bufts": setting,
        "why": f"the install self-test's decode was {crashed.describe().removeprefix('the decode ')} "
        f"with setting {crashed.setting!r}",
        "cpu": cpu_features.host_cpu_model(),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    cpu_features.safe_settings_path(prefix).write_text(json.dumps(record, indent=1) + "\n")


def _failure_text(run: ProbeRun) -> str:
    tail = "\n    ".join(run.stderr_tail.strip().splitlines()[-6:])
    return (
        f"llama.cpp cannot answer on this host: a short real decode of the embedded model was "
        f"{run.describe().removeprefix('the decode ')}, also with llama.cpp's extra buffer types off.\n"
        "  What to do:\n"
        "  1. run `voltgate doctor` (or `.venv/bin/voltgate doctor`): it names the CPU features the build uses "
        "and checks the C++ runtime;\n"
        "  2. rebuild llama-cpp-python for this CPU: `make clean && make run` (on a CPU with AMX the Makefile "
        "builds without the AMX kernels), or set CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX2=ON' for a "
        "portable build;\n"
        "  3. if Python runs from another distribution (conda, a bundled venv), try "
        "LD_PRELOAD=$(g++ -print-file-name=libstdc++.so.6) (docs/troubleshooting.md)."
        + (f"\n  The child's last lines:\n    {tail}" if tail else "")
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one short real llama.cpp decode")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--probe", action="store_true", help="run in this process (the child's side)")
    ap.add_argument("--extra-bufts", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prompt-tokens", type=int, default=0)
    ap.add_argument("--gen-tokens", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    spec = ProbeSpec(args.extra_bufts, args.gpu_layers, args.threads, args.prompt_tokens, args.gen_tokens)
    if args.probe:
        print(json.dumps(asdict(probe(args.model, spec))), flush=True)  # noqa: T201 - the parent reads this line
        return 0
    run = run_probe(args.model, spec)
    print(json.dumps(asdict(run)) if args.json else run.describe())  # noqa: T201
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
