"""`python -m benchmarks ffn ...`: see `benchmarks/cli.py`."""

import sys

from benchmarks.cli import main

sys.exit(main())
