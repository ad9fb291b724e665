"""`python -m research NAME ...`: the paper's experiments, run from a checkout (never installed).

  sweep     a resumable grid of `s3r train` runs and its Table I report (`research/sweep.py`)
  diagnose  gradient errors per recipe on a trained run (Table II; `research/diagnose.py`)

The other experiments are modules with their own `main` (`python -m research.NAME --help`):

  research.dose             the dose-response study: lockstep runs at coarser gradient grids
  research.dose_trajectory  the dose a recipe applies along one run's checkpoints
  research.gate_dose        per-projection dX errors at every grid of the dose study
  research.lockstep         paired training of several recipes in lockstep (the paper-scale run)
  research.compile_probe    the XLA flags the lockstep run compiles fastest under
  research.mechanism        Proposition 1's mechanism per projection
  research.section3         Section III's statements on synthetic layers
  research.same_rate        contrasts at one learning rate, pooled from several sweeps
  research.evalsize         how well the fixed validation batches estimate the shard's loss
  research.bf16_seeds       the `bf16` recipe through `s3r.nn.quantize` against the plain NNX model
  research.snapshot         a finished run recorded as a results file (the quickstart's)
  research.provenance       which revision and library changes each committed run had

They import the `s3r` library and `labtools` (results files, the paper's numbers); neither imports them.
Their committed results are in research/results/, their configs in research/configs/.
"""

import argparse
import sys

from s3r.cli.common import EXIT_CODES, Parser

COMMANDS = ("sweep", "diagnose")


def build_parser() -> Parser:
  import importlib

  head, rest = __doc__.split("\n\n", 1)
  parser = Parser(
    prog="python -m research",
    description=head.strip("`"),
    epilog=rest,  # every command, the modules with their own `main` included
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
  sub.required = True
  for name in COMMANDS:
    importlib.import_module(f"research.{name}").register(sub)
  return parser


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = build_parser().parse_args(argv)
  try:
    return args.func(args) or 0
  except KeyboardInterrupt:
    return EXIT_CODES["interrupted"]


if __name__ == "__main__":
  sys.exit(main())
