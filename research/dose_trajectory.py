"""`python -m research.dose_trajectory`: the dose a recipe applies along one run's own training.

The dose of the dose study is measured once, on a run's final parameters. This measures it at every
checkpoint of one run: each recipe's relative gradient errors (`gradients.relative_errors`: dW and dX of
block 0, the last block's dX, the embedding) on that checkpoint's parameters and the run's first
validation batch, and the excess e²(recipe) − e²(`int8_sr`) of each metric. At the last step, with the
same keys and batch, it reproduces the sweep's end-of-run `dose`.

    python -m research.dose_trajectory --checkpoints CKPTS --out runs/results/dose_trajectory

`--checkpoints`: a run directory, or a folder of its checkpoints (`checkpoints/400`, `checkpoints/800`,
...). A run keeps only its last two checkpoints unless it was trained with `s3r train --keep-every N`
(the sweep's `keep_every`), which keeps every N-th; otherwise copy them as they are written.
Resumable: steps already in the output's .json are skipped.
"""

from __future__ import annotations

import argparse
import pathlib

from labtools import results as provenance
from labtools.results import markdown_table, metadata_markdown, write_json
from research import mechanism

BASE = "int8_sr"
RECIPES = ("int8_sr", "s3r", "s3r_ec_dx")


def checkpoint_steps(path: str) -> list[int]:
  """The steps of the checkpoints under `path` (a run directory or a folder of step folders)."""
  from s3r.train.evaluate import checkpoint_location

  directory, _ = checkpoint_location(path)
  return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def excess(errors: dict, base: str = BASE) -> dict:
  """{recipe: {metric: e²(recipe) − e²(base)}} for every recipe but `base`."""
  ref = errors[base]
  return {r: {m: e**2 - ref[m] ** 2 for m, e in errs.items()} for r, errs in errors.items() if r != base}


def measure(path: str, step: int, recipes, n_keys: int, log=print) -> dict:
  from research import gradients
  from research.runs import load_run

  run = load_run(path, step=step, log=lambda _msg: None)
  log(f"step {step} ({n_keys} keys):")
  errors = gradients.relative_errors(run["model_cfg"], run["params"], run["val_batch"], recipes, n_keys=n_keys, log=log)
  return {"step": run["step"], "errors": errors, "excess": excess(errors)}


def _markdown(doc: dict) -> str:
  s = doc["settings"]
  lines = [
    metadata_markdown("python -m research.dose_trajectory", doc["meta"], s),
    f"Relative dW error of block 0 per recipe, and its excess e²(recipe) − e²(`{BASE}`), on the parameters "
    f"of each checkpoint of the run (`{s['run']}`), its first validation batch, {s['keys']} keys per recipe:\n",
  ]
  recipes = [r for r in s["recipes"] if r != BASE]
  rows = []
  for e in sorted(doc["entries"].values(), key=lambda e: e["step"]):
    errs, exc = e["errors"], e["excess"]
    cells = [e["step"]] + [f"{errs[r]['dw_first']:.3f}" for r in s["recipes"]]
    rows.append(cells + [f"{exc[r]['dw_first']:+.4f}" for r in recipes])
  header = ["step"] + [f"`{r}` dW0" for r in s["recipes"]] + [f"excess `{r}`" for r in recipes]
  lines.append(markdown_table(header, rows))
  return "\n".join(lines) + "\n"


def plot(doc: dict, path: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  entries = sorted(doc["entries"].values(), key=lambda e: e["step"])
  steps = [e["step"] for e in entries]
  fig, ax = plt.subplots(figsize=(6.5, 4))
  for r in doc["settings"]["recipes"]:
    if r != BASE:
      ax.plot(steps, [e["excess"][r]["dw_first"] for e in entries], "o-", label=r)
  ax.axhline(0, color="grey", lw=0.8)
  ax.set_xlabel("training step of the checkpoint")
  ax.set_ylabel(f"excess relative variance, dW of block 0 (vs {BASE})")
  ax.set_title(f"Dose along the run {doc['settings']['run']}")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(prog="python -m research.dose_trajectory", description=__doc__.split("\n")[0])
  p.add_argument("--checkpoints", required=True, help="a run directory or a folder of its step folders")
  p.add_argument("--out", required=True, help="output stem (.json, .md, .png)")
  p.add_argument("--run", help="the run's name, for the report (default: the folder's)")
  p.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated; must include {BASE}")
  p.add_argument("--keys", type=int, default=16, help="quantizer keys per recipe and checkpoint")
  p.add_argument("--report-only", action="store_true", help="rewrite the .md and .png from the .json")
  args = p.parse_args(argv)
  recipes = [r for r in args.recipes.split(",") if r]
  if BASE not in recipes:
    raise SystemExit(f"python -m research.dose_trajectory: --recipes must include {BASE}")
  if args.keys < 1:
    raise SystemExit("python -m research.dose_trajectory: --keys must be >= 1")
  out, path, doc = mechanism.open_results(args.out)
  if not args.report_only:
    name = args.run or pathlib.Path(args.checkpoints).absolute().name
    settings = {"run": name, "recipes": recipes, "keys": args.keys}
    if doc["entries"] and doc.get("settings", settings) != settings:
      raise SystemExit(f"python -m research.dose_trajectory: {path} holds another measurement ({doc['settings']})")
    doc.update(meta=provenance.run_metadata(argv), settings=settings)
    steps = checkpoint_steps(args.checkpoints)
    if not steps:
      raise SystemExit(f"python -m research.dose_trajectory: no checkpoints under {args.checkpoints}")
    for i, step in enumerate(steps):
      if str(step) in doc["entries"]:
        continue
      print(f"[{i + 1}/{len(steps)}] ", end="", flush=True)
      doc["entries"][str(step)] = measure(args.checkpoints, step, recipes, args.keys)
      write_json(path, doc)
  if not doc["entries"]:
    raise SystemExit(f"python -m research.dose_trajectory: nothing measured in {path}")
  out.with_suffix(".md").write_text(_markdown(doc))
  plot(doc, out.with_suffix(".png"))
  return doc


if __name__ == "__main__":
  main()
