"""A llama-cpp-python without libmtmd (the GPU recipe's build): the worker's modules import, a projector refuses.

Issue 34's GPU run found the worker dying at import there (bench/results/2026-12-05-gpu-regress-partial). The
missing library is simulated by blocking `llama_cpp.mtmd_cpp` in a fresh interpreter (the ImportError path; a
missing .so raises FileNotFoundError, caught alike); the rest is real. It checks the import and the refusal,
not a text request served by such a worker: that is the GPU run's to show.
"""

import subprocess
import sys

SCRIPT = """
import sys
from pathlib import Path
sys.modules["llama_cpp.mtmd_cpp"] = None  # import of it raises ImportError, as a missing libmtmd does
import backends.llamacpp.worker.cli  # the worker's entry point imports
from backends.llamacpp.worker import vision
assert vision.mtmd is None and "libmtmd" in vision.MTMD_MISSING
try:
    vision.VisionProjector.load(Path("mmproj.gguf"), None)
except vision.VisionError as e:
    print("refused:", e)
"""


def test_worker_imports_and_projector_refuses_without_mtmd() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "refused: this llama-cpp-python has no multimodal library (libmtmd)" in done.stdout
