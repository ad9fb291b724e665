"""`s3r generate RUN_OR_HF_DIR --prompt TEXT [--prompt TEXT ...]`: text continuing each prompt.

The model is a run's newest readable checkpoint with the run's tokenizer, or a Hugging Face
checkpoint folder (`s3r.model.load_hf`, its tokenizer.json). A prompt starts as the documents the
model trained on start: after BOS where the family starts a text with it (Llama 3, Gemma 3,
DeepSeek-V2; from its tokenizer config), after <|endoftext|> for a run with a tokenizer trained here
(and its export); generation stops at EOS (<|endoftext|>). All prompts are generated together
(left-padded) with s3r.model.generate: greedy, or sampled with --temperature and --top-k from --seed.
Activations are float32 unless --dtype says bfloat16; the projections use the run's recipe (a Hugging
Face checkpoint: `bf16`) or --recipe.
Bad input (a missing folder, an empty prompt, --max-new-tokens <= 0, a prompt too long for the
model) is one line on stderr and exit code 2.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from s3r.quant import Recipe

HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")  # what makes a folder a Hugging Face checkpoint


def register(subparsers) -> None:
  from s3r.cli.common import EXIT_HELP, HelpFormatter, guarded, paragraphs, recipe_name
  from s3r.model.config import ACT_DTYPES

  p = subparsers.add_parser(
    "generate",
    help="continue prompts with a run's model or a Hugging Face checkpoint (KV-cached decoding)",
    formatter_class=HelpFormatter,
    description=paragraphs(__doc__.split("\n\n")[1].replace("\n", " ")),
    epilog=paragraphs(EXIT_HELP + "."),
  )
  p.add_argument("model_dir", metavar="RUN_OR_HF_DIR", help="a run directory, or a Hugging Face checkpoint folder")
  p.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several, generated together)")
  p.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate per prompt")
  p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0: greedy")
  p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens only (default: all)")
  p.add_argument("--seed", type=int, default=0, help="seed of the sampling key")
  p.add_argument("--dtype", choices=ACT_DTYPES, default="float32", help="activation dtype")
  p.add_argument(
    "--recipe", type=recipe_name, default=None, help="recipe of the projections (default: the run's; HF: bf16)"
  )
  p.add_argument("--json", action="store_true", help="print one JSON object per prompt (prompt, tokens, text)")
  p.set_defaults(func=lambda args: guarded(run_generate, args))


def run_generate(args) -> int:
  import jax

  from s3r.model import generate
  from s3r.train.config import ConfigError

  if any(not p for p in args.prompt):
    raise ConfigError("--prompt is empty")
  if args.max_new_tokens <= 0:
    raise ConfigError(f"--max-new-tokens must be an integer >= 1, got {args.max_new_tokens}")
  if args.temperature < 0:
    raise ConfigError(f"--temperature must be >= 0, got {args.temperature}")
  if args.top_k is not None and args.top_k < 1:
    raise ConfigError(f"--top-k must be an integer >= 1, got {args.top_k}")
  folder = pathlib.Path(args.model_dir)
  if not folder.is_dir():
    raise ConfigError(f"{args.model_dir}: no such folder")
  cfg, params, encode, decode, stop = _load(folder, args.recipe)
  cfg = dataclasses.replace(cfg, act_dtype=args.dtype)
  prompts = [encode(p) for p in args.prompt]
  try:
    out = generate(
      cfg,
      params,
      prompts,
      max_new_tokens=args.max_new_tokens,
      temperature=args.temperature,
      top_k=args.top_k,
      key=jax.random.key(args.seed),
    )
  except ValueError as e:
    raise ConfigError(str(e)) from None
  for text, row in zip(args.prompt, out.tolist()):
    tokens = row[: row.index(stop) + 1] if stop in row else row
    shown = decode([t for t in tokens if t != stop])
    print(json.dumps({"prompt": text, "tokens": tokens, "text": shown}) if args.json else text + shown + "\n")
  return 0


def _load(folder: pathlib.Path, recipe: Recipe | None):
  """(model config, params, encode, decode, stop token) of a Hugging Face folder or a run."""
  if any((folder / name).is_file() for name in HF_WEIGHTS):
    from s3r.model import load_hf, load_hf_tokenizer

    tok = load_hf_tokenizer(folder)  # an HFError is one line, exit 2 (s3r.cli.common.guarded)
    cfg, params = load_hf(folder, recipe=recipe or "bf16")
    return cfg, params, tok.prompt, tok.decode, tok.eos_id
  from s3r.train.evaluate import restore_run

  run = restore_run(str(folder), log=lambda *_: None)
  cfg = run.setup.model_cfg if recipe is None else dataclasses.replace(run.setup.model_cfg, recipe=recipe)
  tok = run.tokenizer
  return cfg, run.state.params, tok.prompt, tok.decode, tok.eot_id
