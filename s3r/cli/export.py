"""`s3r export RUN --out DIR`: a run's checkpoint as a Hugging Face checkpoint folder (s3r.train.export)."""

from __future__ import annotations


def register(subparsers) -> None:
  from s3r.cli.common import EXIT_HELP, HelpFormatter, guarded, paragraphs

  p = subparsers.add_parser(
    "export",
    help="write a checkpoint as a Hugging Face checkpoint folder",
    formatter_class=HelpFormatter,
    description=paragraphs(
      "Write the newest readable checkpoint of a run (or that of --step) as a Hugging Face checkpoint folder "
      "that transformers.AutoModelForCausalLM.from_pretrained loads: config.json, the weights as safetensors in "
      "the family's Hub layout (sharded above 5 GB, with model.safetensors.index.json) and the run's tokenizer "
      "(the --init-from checkpoint's files, else the run's own as tokenizer.json). The folder is written under a "
      "temporary name beside --out and renamed at the end: a failed export leaves nothing."
    ),
    epilog=paragraphs(EXIT_HELP + "."),
  )
  p.add_argument("run", metavar="RUN", help="a run directory, its checkpoints/ folder, or one checkpoint's folder")
  p.add_argument("--out", required=True, metavar="DIR", help="the folder to write (new, or empty)")
  p.add_argument(
    "--dtype",
    choices=("bf16", "f32"),
    default="bf16",
    help="stored dtype: bf16 rounds the float32 master weights to nearest even, f32 is exact",
  )
  p.add_argument("--step", type=int, default=None, help="the step whose checkpoint to export (default: the newest)")
  p.set_defaults(func=lambda args: guarded(run, args))


def run(args) -> int:
  from s3r.train.config import ConfigError
  from s3r.train.export import export_run

  if args.step is not None and args.step < 0:
    raise ConfigError(f"--step must be an integer >= 0, got {args.step}")
  export_run(args.run, args.out, step=args.step, dtype=args.dtype)
  return 0
