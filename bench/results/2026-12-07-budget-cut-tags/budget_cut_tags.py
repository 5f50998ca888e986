"""The real worker (the embedded SmolLM2 re-templated as DeepSeek-R1-Distill), greedy, thinking budget 3/5/8,
96 tokens with ignore_eos, three questions: each answer's `reasoning_content`, `content` and how many raw
reasoning tags the content shows. Run from a checkout's root: python budget_cut_tags.py SMOLLM2_GGUF."""

import json
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, ".")
from tests.fixtures.gguf_templates import retemplated_gguf, template_text

try:  # the harness moved after d17e868
    from tests.worker_process import MODEL, start_worker, stop, wait_ready
except ImportError:
    from tests.integration.test_llamacpp_worker import MODEL, start_worker, stop
    from tests.integration.test_tool_families import _wait_ready as wait_ready

tmp = Path(tempfile.mkdtemp())
model = retemplated_gguf(Path(sys.argv[1]), tmp / "r1.gguf", template_text("deepseek_r1_distill"))
process, url = start_worker(model, tmp / "w.log", "--ctx", "2048", "--slots", "2", "--n-threads", "1")
try:
    wait_ready(url, process, tmp / "w.log")
    total = 0
    for question in ["What is 2 + 2?", "Say hello", "Name a color."]:
        for budget in (3, 5, 8):
            body = {"model": MODEL, "messages": [{"role": "user", "content": question}], "temperature": 0,
                    "max_tokens": 96, "thinking_budget_tokens": budget, "ignore_eos": True}  # fmt: skip
            message = httpx.post(url + "/v1/chat/completions", json=body, timeout=300).json()["choices"][0]["message"]
            tags = sum(message["content"].count(tag) for tag in ("<think>", "</think>"))
            total += tags
            row = {"question": question, "budget": budget, "tags_in_content": tags, **message}
            print(json.dumps(row))
    print(json.dumps({"tags_in_all_contents": total}))
finally:
    stop(process)
