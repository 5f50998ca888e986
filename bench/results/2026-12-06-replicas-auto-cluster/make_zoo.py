"""Write the unit tests' model zoo (HF config headers and GGUF headers, no weights) to the directory argv[1]."""

import sys
from pathlib import Path

from tests.unit.placement_models import build_zoo

build_zoo(Path(sys.argv[1]))
