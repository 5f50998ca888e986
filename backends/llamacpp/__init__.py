"""llama.cpp (llama-cpp-python) GGUF engine: the adapter, and our own continuous-batching worker process."""

from backends.llamacpp.adapter import LlamaCppAdapter

__all__ = ["LlamaCppAdapter"]
