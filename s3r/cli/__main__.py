"""`python -m s3r.cli ...` (same as `s3r ...`)."""

import sys

from s3r.cli import main

sys.exit(main())
