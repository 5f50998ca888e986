"""`make test-unit` (tests/unit) never loads llama.cpp's native library: every module there imports in a
process that ends without `llama_cpp` imported. A unit test that needs the library belongs in tests/integration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

UNIT = Path(__file__).parents[1] / "unit"
REPO = UNIT.parents[1]

_PROBE = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
    if "llama_cpp" in sys.modules:
        print(name)
        break
"""


def test_no_unit_test_module_imports_llama_cpp() -> None:
    modules = sorted(f"tests.unit.{p.stem}" for p in UNIT.glob("test_*.py"))
    assert len(modules) > 40
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *modules], cwd=REPO, capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.strip() == "", f"{done.stdout.strip()} loads llama.cpp: move it to tests/integration"


def test_the_probe_sees_a_module_that_loads_llama_cpp() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, "json", "backends.llamacpp.worker.native"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "backends.llamacpp.worker.native"
