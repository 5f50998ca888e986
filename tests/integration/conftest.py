"""Everything under tests/integration is an integration test: it starts real processes or loads llama.cpp's
native library (the pure-logic suites that import it sit here too, so `make test-unit` never loads it)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)
