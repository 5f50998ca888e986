"""`python -m backends.llamacpp.worker`: see `backends.llamacpp.worker.cli`."""

import sys

from backends.llamacpp.worker.cli import main

sys.exit(main())
