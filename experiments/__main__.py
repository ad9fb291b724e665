"""`python -m experiments NAME ...`: the paper's experiments that are commands, run from a checkout.

  sweep     a resumable grid of `s3r train` runs and its Table I report (`experiments/sweep.py`)
  diagnose  gradient errors per recipe on a trained run (Table II; `experiments/diagnose.py`)

The other experiments are modules with their own `main`: `python -m experiments.lockstep`,
`experiments.mechanism`, `experiments.section3`, `experiments.same_rate`, `experiments.evalsize`,
`experiments.snapshot`, `experiments.dose`, `experiments.dose_trajectory`, `experiments.gate_dose`,
`experiments.compile_probe`, `experiments.bf16_seeds` and `experiments.provenance`. They import the `s3r`
library; the library never imports them.
"""

import sys

from s3r.cli.common import EXIT_CODES, Parser

COMMANDS = ("sweep", "diagnose")


def build_parser() -> Parser:
  import importlib

  parser = Parser(prog="python -m experiments", description=__doc__.split("\n\n")[0].strip("`"))
  sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
  sub.required = True
  for name in COMMANDS:
    importlib.import_module(f"experiments.{name}").register(sub)
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
