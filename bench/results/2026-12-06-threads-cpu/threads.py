"""Prefill and decode speed of the embedded SmolLM2-135M at 1 and 2 llama.cpp threads (README.md)."""

import time

from llama_cpp import Llama

from bench.launch import default_model_path

path = default_model_path()
print(path.name)
prompt = " ".join(f"word{i}" for i in range(300))
for _ in range(2):
    for threads in (1, 2):
        llm = Llama(str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
        tokens = llm.tokenize(prompt.encode())
        t0 = time.perf_counter()
        llm.eval(tokens)
        t1 = time.perf_counter()
        for _ in range(64):
            llm.eval([llm.sample(temp=0)])
        t2 = time.perf_counter()
        print(f"threads={threads} prompt {len(tokens)} tokens: prefill {len(tokens) / (t1 - t0):.0f} tok/s, "
              f"decode {64 / (t2 - t1):.1f} tok/s")
        del llm
