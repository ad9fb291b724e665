"""`python -m s3r.bench ffn ...` (same as `s3r bench ffn ...`)."""

import sys

from s3r.bench.cli import main

sys.exit(main())
