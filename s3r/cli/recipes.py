"""`s3r recipes`: the registered quantization recipes, then the gradient and forward formats."""

from __future__ import annotations


def register(subparsers) -> None:
  p = subparsers.add_parser(
    "recipes",
    help="list the quantization recipes and gradient formats",
    description="One line per registered recipe (name and description), then the gradient formats: "
    "NAME@FORMAT is recipe NAME with its backward's gradient codes in FORMAT, NAME+fwd_FORMAT with its forward's "
    "codes in FORMAT.",
  )
  p.set_defaults(func=run_recipes)


def run_recipes(args) -> int:
  from s3r.quant import RECIPES
  from s3r.quant.formats import FORMATS, FORWARD_FORMATS

  width = max(map(len, RECIPES))
  for name, r in RECIPES.items():
    print(f"{name:<{width}}  {r.description}")
  print(
    f"gradient formats (NAME@FORMAT, every recipe but bf16 and int8_exact_bwd): {', '.join(FORMATS)} (default int8)"
  )
  print(
    f"forward formats (NAME+fwd_FORMAT or NAME@FORMAT+fwd_FORMAT, every recipe but bf16): "
    f"{', '.join(FORWARD_FORMATS)} (default int8; e.g. the all-FP8 s3r_ec_dx@e5m2+fwd_e4m3)"
  )
  return 0
