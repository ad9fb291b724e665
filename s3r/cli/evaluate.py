"""`s3r eval`: validation loss and perplexity of a run's checkpoint or of a Hugging Face checkpoint
(s3r.train.evaluate)."""

from __future__ import annotations

import os

from s3r.cli.common import EXIT_HELP, HelpFormatter, guarded, paragraphs


def register(subparsers) -> None:
  from s3r.model.config import ACT_DTYPES

  p = subparsers.add_parser(
    "eval",
    help="validation loss and perplexity of a checkpoint",
    formatter_class=HelpFormatter,
    description=paragraphs(
      "Validation loss and perplexity of the newest readable checkpoint of a run (a "
      "damaged newest checkpoint is reported and the one before it used), or of the checkpoint of one "
      "step: `s3r eval RUN/checkpoints/25` or `s3r eval RUN --step 25`. `s3r eval --init-from HF_DIR --data "
      "PATH` evaluates a Hugging Face checkpoint on the validation documents `s3r train --init-from HF_DIR "
      "--data PATH` holds out (with the same --batch, --seq and --eval-batches: that run's step-0 numbers). "
      "Activations are bfloat16, as training evaluates (so the numbers are the run's own); --dtype float32 "
      "evaluates them in full precision."
    ),
    epilog=paragraphs(EXIT_HELP + "."),
  )
  p.add_argument(
    "checkpoint_dir",
    metavar="CHECKPOINT_DIR",
    nargs="?",
    help="a run directory, its checkpoints/ folder, or one checkpoint's folder (RUN/checkpoints/25)",
  )
  g = p.add_argument_group("a Hugging Face checkpoint instead of a run")
  g.add_argument("--init-from", metavar="HF_DIR", help="the checkpoint folder (config.json, safetensors, tokenizer)")
  g.add_argument("--init-layers", type=int, metavar="N", help="keep only the first N decoder layers")
  g.add_argument("--batch", type=int, help="sequences per batch (default: as s3r train)")
  g.add_argument("--seq", type=int, help="tokens per sequence (default: as s3r train)")
  p.add_argument(
    "--step",
    type=int,
    default=None,
    help="the step whose checkpoint to evaluate (default: the newest readable); a missing step is an error "
    "that lists the steps there are",
  )
  p.add_argument(
    "--data",
    default=None,
    help="corpus to evaluate on, named as for `s3r train --data` (default: the run's validation sets); "
    "another corpus is read whole and encoded with the run's tokenizer, with a warning when it "
    "holds training documents of the run",
  )
  p.add_argument("--eval-batches", type=int, default=None, help="batches per validation set (default: the run's)")
  p.add_argument(
    "--cache-dir",
    default=None,
    help="tokenizer and token cache, as for `s3r train --cache-dir` (default: the run's; .cache/s3r with --init-from)",
  )
  p.add_argument(
    "--dtype",
    choices=ACT_DTYPES,
    default="bfloat16",
    help="activation dtype; bfloat16 as training evaluates (the run's own numbers), float32 for full precision",
  )
  p.set_defaults(func=lambda args: guarded(run_eval, args))


def run_eval(args) -> int:
  import math

  from s3r.train.config import ConfigError
  from s3r.train.evaluate import evaluate_checkpoint, evaluate_pretrained

  if args.eval_batches is not None and args.eval_batches < 1:
    raise ConfigError(f"--eval-batches must be an integer >= 1, got {args.eval_batches}")
  if args.step is not None and args.step < 0:
    raise ConfigError(f"--step must be an integer >= 0, got {args.step}")
  if (args.checkpoint_dir is None) == (args.init_from is None):
    raise ConfigError("give a run (CHECKPOINT_DIR) or --init-from HF_DIR, not both")
  if args.cache_dir is not None and os.path.exists(args.cache_dir) and not os.path.isdir(args.cache_dir):
    raise ConfigError(f"--cache-dir {args.cache_dir} is an existing file, not a directory")
  if args.init_from is None:
    given = [f"--{k.replace('_', '-')}" for k in ("init_layers", "batch", "seq") if getattr(args, k) is not None]
    if given:
      raise ConfigError(f"{', '.join(given)}: only with --init-from (a run evaluates with its own)")
    losses = evaluate_checkpoint(
      args.checkpoint_dir,
      step=args.step,
      data=args.data,
      max_batches=args.eval_batches,
      act_dtype=args.dtype,
      cache_dir=args.cache_dir,
    )
  else:
    if args.step is not None:
      raise ConfigError("--step: only with a run (CHECKPOINT_DIR)")
    fields = {
      "init_layers": args.init_layers,
      "batch": args.batch,
      "seq": args.seq,
      "eval_batches": args.eval_batches,
      "cache_dir": args.cache_dir,
    }
    given = {k: v for k, v in fields.items() if v is not None}
    losses = evaluate_pretrained(args.init_from, data=args.data, act_dtype=args.dtype, **given)
  for name, loss in losses.items():
    print(f"{name}: loss {loss:.4f}, perplexity {math.exp(loss):.2f}")
  return 0
