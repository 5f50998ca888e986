"""The llama.cpp worker process (`python -m backends.llamacpp.worker`): everything here runs in the worker, never
in the gateway (which only imports `backends.llamacpp.adapter`, `cpu_features` and `selftest`).

    cli            argv -> WorkerSpec | EmbedSpec, uvicorn with a stop signal that ends in-flight requests
    httpkit        what both HTTP surfaces share: WorkerError (the shared ErrorCode), body parsing with
                   parameter paths, the one disconnect watcher, the SSE response, WorkerApp
    chat_server    /v1/chat/completions and /v1/completions over the scheduler
    embed_server   /v1/embeddings and /v1/rerank over the embedding engine
    native         llama.cpp's C API (ctypes, via llama-cpp-python's library): model, context, batch, sampler
    scheduler ...  continuous batching (slots, tickets, waiting, picking, sampling, logprobs)
    prompts, text, tools, output, choices, replies, wire   prompt building, tool formats, reply rendering
"""
