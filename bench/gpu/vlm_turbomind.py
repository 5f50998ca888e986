"""On the GPU machine: images through voltgate to a TurboMind vision-language model (issue #25, item 3).

    python3 -m bench.gpu.vlm_turbomind --base-url http://127.0.0.1:8000 --model vlm --out RESULTS/vlm.jsonl

Against `voltgate serve` with a random-weight Qwen2-VL (bench/gpu/make_vlm.py) on TurboMind. Random weights make
the text gibberish, so each check asserts what an image must change: the prompt's token count grows by the
image's tokens, two different images give different tokens or logprobs at temperature 0 (and the same image the
same ones), every API answers an image in its own shape, image requests run beside text requests, and the GPU
memory the worker holds (nvidia-smi, per process) after the largest images against the plan's estimate.
One JSON line per check: {"check", "ok", "status", "detail"}; the exit status is the number of failed checks.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

QUESTION = "Describe the picture."


def image_uri(kind: str, side: int, fmt: str = "PNG") -> str:
    """A data URI of a synthetic picture: 'gradient', 'checker' or 'rings' (JPEG for the large ones)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (side, side))
    draw = ImageDraw.Draw(img)
    if kind == "gradient":
        for x in range(side):
            draw.line([(x, 0), (x, side)], fill=(255 * x // side, 64, 255 - 255 * x // side))
    elif kind == "checker":
        cell = max(side // 8, 1)
        for i in range(0, side, cell):
            for j in range(0, side, cell):
                if (i // cell + j // cell) % 2:
                    draw.rectangle([i, j, i + cell, j + cell], fill=(240, 240, 40))
    else:
        for r in range(side // 2, 0, -max(side // 32, 1)):
            c = 255 * r * 2 // side
            draw.ellipse([side // 2 - r, side // 2 - r, side // 2 + r, side // 2 + r], fill=(c, 255 - c, 128))
    buf = io.BytesIO()
    img.save(buf, format=fmt, quality=85) if fmt == "JPEG" else img.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(buf.getvalue()).decode()}"


def user(uri: str | None, text: str = QUESTION) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if uri is not None:
        parts.insert(0, {"type": "image_url", "image_url": {"url": uri}})
    return [{"role": "user", "content": parts}]


def gpu_processes() -> list[dict[str, Any]]:
    """Every compute process on the GPUs with the memory it holds (MiB), from nvidia-smi."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    rows = [line.split(", ") for line in out.strip().splitlines() if line.count(", ") == 2]
    return [{"pid": int(p), "name": n, "used_mib": int(m)} for p, n, m in rows if m.strip().isdigit()]


class Checks:
    def __init__(self, base: str, model: str, out: Any, hold_pid: int | None) -> None:
        self.http = httpx.Client(base_url=base, timeout=600)
        self.model = model
        self.out = out
        self.hold_pid = hold_pid
        self.failed = 0

    def chat(self, messages: list[dict[str, Any]], **body: Any) -> httpx.Response:
        payload = {"model": self.model, "messages": messages, "temperature": 0, "max_tokens": 8, **body}
        return self.http.post("/v1/chat/completions", json=payload)

    def record(self, name: str, ok: bool, status: int | None, detail: Any) -> None:
        line = {"check": name, "ok": bool(ok), "status": status, "detail": detail}
        self.failed += not ok
        print(json.dumps(line), file=self.out, flush=True)
        print(("PASS " if ok else "FAIL ") + name + " " + json.dumps(detail)[:300], file=sys.stderr)

    def run(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # a check that breaks is a failed check; the others still run
            self.record(name, False, None, repr(exc)[:600])

    def worker_mib(self) -> int:
        """The GPU memory every process but the memory hold uses (the TurboMind worker)."""
        return sum(p["used_mib"] for p in gpu_processes() if p["pid"] != self.hold_pid)


def answer(r: httpx.Response) -> tuple[list[str], list[float], int]:
    """The chosen tokens, their logprobs and the prompt's token count of a chat answer."""
    body = r.json()
    content = (body["choices"][0].get("logprobs") or {}).get("content") or []
    return [t["token"] for t in content], [round(t["logprob"], 4) for t in content], body["usage"]["prompt_tokens"]


def image_checks(c: Checks, images: dict[str, str]) -> None:
    r = c.http.get("/v1/models")
    caps = {m["id"]: m.get("capabilities", {}) for m in r.json()["data"]}
    c.record("v1_models_vision_true", caps.get(c.model, {}).get("vision") is True, r.status_code, caps)
    text = c.chat(user(None), logprobs=True)
    a1 = c.chat(user(images["a"]), logprobs=True)
    b = c.chat(user(images["b"]), logprobs=True)
    a2 = c.chat(user(images["a"]), logprobs=True)
    if not all(x.status_code == 200 for x in (text, a1, b, a2)):
        c.record("image_chat_200", False, a1.status_code, [x.text[:300] for x in (text, a1, b, a2)])
        return
    (_, _, t_prompt), (ta, la, pa), (tb, lb, pb), (ta2, la2, _) = map(answer, (text, a1, b, a2))
    detail = {"text_prompt_tokens": t_prompt, "image_prompt_tokens": pa, "image_adds": pa - t_prompt}
    c.record("image_chat_200_prompt_tokens_grow", pa > t_prompt, a1.status_code, detail)
    differ = {"a_tokens": ta, "b_tokens": tb, "a_logprobs": la, "b_logprobs": lb, "b_prompt_tokens": pb}
    c.record("two_images_differ", (ta, la) != (tb, lb), b.status_code, differ)
    c.record("same_image_same_answer", (ta, la) == (ta2, la2), a2.status_code, {"again": ta2, "logprobs": la2})


def api_checks(c: Checks, images: dict[str, str]) -> None:
    content = [{"type": "input_image", "image_url": images["a"]}, {"type": "input_text", "text": QUESTION}]
    body = {"model": c.model, "max_output_tokens": 8, "input": [{"role": "user", "content": content}]}
    r = c.http.post("/v1/responses", json=body)
    usage = r.json().get("usage") if r.status_code == 200 else r.text[:300]
    c.record("responses_input_image", r.status_code == 200 and r.json()["object"] == "response", r.status_code, usage)
    data = images["a"].split(",", 1)[1]
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    messages = [{"role": "user", "content": [block, {"type": "text", "text": QUESTION}]}]
    body = {"model": c.model, "max_tokens": 8, "messages": messages}
    r = c.http.post("/v1/messages", headers={"anthropic-version": "2023-06-01"}, json=body)
    usage = r.json().get("usage") if r.status_code == 200 else r.text[:300]
    c.record("messages_image_block", r.status_code == 200 and r.json()["type"] == "message", r.status_code, usage)


def stream_one(c: Checks, messages: list[dict[str, Any]]) -> dict[str, Any]:
    t0 = time.monotonic()
    first = None
    chunks = 0
    payload = {"model": c.model, "messages": messages, "max_tokens": 48, "stream": True, "ignore_eos": True}
    with c.http.stream("POST", "/v1/chat/completions", json=payload) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                chunks += 1
                first = first if first is not None else time.monotonic() - t0
    return {"status": r.status_code, "chunks": chunks, "ttft_s": first, "end_s": round(time.monotonic() - t0, 3)}


def batching_check(c: Checks, images: dict[str, str]) -> None:
    """Six image and six text requests at once, streamed: all answer, and they overlap in time."""
    jobs = [user(images["a" if i % 2 else "b"]) for i in range(6)] + [user(None, f"Count to {i}.") for i in range(6)]
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda m: stream_one(c, m), jobs))
    wall = round(time.monotonic() - t0, 3)
    ok = all(r["status"] == 200 and r["chunks"] > 0 for r in results)
    serial = sum(r["end_s"] for r in results)
    detail = {"wall_s": wall, "sum_of_request_s": round(serial, 3), "image": results[:6], "text": results[6:]}
    c.record("images_batched_with_text", ok and wall < serial, 200 if ok else None, detail)


def memory_checks(c: Checks, images: dict[str, str], estimate: dict[str, Any]) -> None:
    """The worker's memory at rest and after the largest images, against the plan's per-GPU estimate."""
    rest = c.worker_mib()
    readings: dict[str, Any] = {"at_rest_mib": rest, "estimate_gpu_mib": estimate.get("gpu_mib"),
                                "estimate_terms_gib": estimate.get("terms_gib")}  # fmt: skip
    for name in ("big", "max"):
        r = c.chat(user(images[name]), max_tokens=2)
        readings[f"{name}_status"] = r.status_code
        readings[f"{name}_prompt_tokens"] = r.json()["usage"]["prompt_tokens"] if r.status_code == 200 else r.text[:300]
        readings[f"after_{name}_mib"] = c.worker_mib()
    readings["processes"] = gpu_processes()
    fits = estimate.get("gpu_mib") is not None and readings["after_max_mib"] <= estimate["gpu_mib"]
    ok = readings["big_status"] == 200 and readings["max_status"] == 200 and fits
    c.record("memory_estimated_vs_measured", ok, readings["max_status"], readings)


def plan_estimate(c: Checks) -> dict[str, Any]:
    for d in c.http.get("/v1/placement").json().get("decisions", []):
        if d.get("model") == c.model and d.get("estimate"):
            est = d["estimate"]
            gpu = sum(est.get("gpu_bytes", {}).values())
            return {"gpu_mib": round(gpu / 2**20), "terms_gib": est.get("terms_gib"), "notes": d.get("notes")}
    return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="vlm")
    parser.add_argument("--out", type=argparse.FileType("w"), default=sys.stdout)
    parser.add_argument("--hold-pid", type=int, default=None, help="the memory hold's pid (left out of readings)")
    args = parser.parse_args()
    c = Checks(args.base_url, args.model, args.out, args.hold_pid)
    images = {"a": image_uri("gradient", 224), "b": image_uri("checker", 224),
              "big": image_uri("rings", 1792, "JPEG"), "max": image_uri("gradient", 3584, "JPEG")}  # fmt: skip
    estimate = plan_estimate(c)
    c.record("plan_estimate", bool(estimate), 200, estimate)
    c.run("images", lambda: image_checks(c, images))
    c.run("apis", lambda: api_checks(c, images))
    c.run("batching", lambda: batching_check(c, images))
    c.run("memory", lambda: memory_checks(c, images, estimate))
    sys.exit(c.failed)


if __name__ == "__main__":
    main()
