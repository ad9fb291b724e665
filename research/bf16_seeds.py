"""Does the `bf16` recipe through `s3r.nn.quantize` train Flax's NNX miniGPT like the unmodified model?

Seeds of short runs of the miniGPT test fixture (tests/nn/minigpt.py: the model as Flax's miniGPT
tutorial writes it, 64-token vocabulary, 16-token context), character-level on Tiny Shakespeare: the
63 most frequent characters get their own ids, every other character one shared id. Both arms of a
seed start from the same parameters (`nnx.Rngs(seed)`) and see the same batches (random 17-character
windows of the first 90% of the text, drawn from `numpy.random.default_rng(seed)`), with Adam at one
learning rate; one arm is the model as written ("plain"), the other the same model after
`s3r.nn.quantize(model, "bf16")` (bf16 operands, f32 accumulation in every projection). Validation
loss: the mean over fixed windows of the last 10% of the text.

The test, fixed before the runs: the per-seed difference of the final validation loss (bf16 minus
plain) has mean zero (paired t, two-sided, alpha 0.05, with its 95% confidence interval, and the
sign count); a recipe that trains worse by the 0.64 nats once seen on one run of the tutorial's
model would be far outside that interval.

`python -m research.bf16_seeds --seeds 16 --out research/results/bf16_seeds` writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import time
from typing import Any

import numpy as np

from labtools.results import markdown_table, metadata_markdown, run_metadata, write_json
from research import stats

ARMS = ("plain", "bf16")
TEXT = pathlib.Path("shakespeare") / "input.txt"


def encode(text: str, vocab: int) -> np.ndarray:
  """Character ids: the vocab-1 most frequent characters by rank (ties by character), the rest vocab-1."""
  ranked = sorted(collections.Counter(text).items(), key=lambda kv: (-kv[1], kv[0]))
  ids = {c: i for i, (c, _) in enumerate(ranked[: vocab - 1])}
  return np.asarray([ids.get(c, vocab - 1) for c in text], np.int32)


def windows(tokens: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
  return tokens[starts[:, None] + np.arange(length)[None, :]]


def train(arm: str, seed: int, data: dict, *, steps: int, batch: int, lr: float, eval_every: int) -> dict:
  """One run: train losses averaged over `eval_every` steps and validation losses every `eval_every` steps."""
  import optax
  from flax import nnx

  import s3r
  from tests.nn import minigpt

  with nnx.use_eager_sharding(False):
    model = minigpt.MiniGPT(rngs=nnx.Rngs(seed))
    if arm == "bf16":
      s3r.nn.quantize(model, "bf16")
    optimizer = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)
  step, evaluate = _programs()
  rng = np.random.default_rng(seed)
  train_tokens, span = data["train"], minigpt.MAXLEN + 1
  curve, val, window = [], [], []
  for i in range(1, steps + 1):
    tokens = windows(train_tokens, rng.integers(0, len(train_tokens) - span, batch), span)
    window.append(float(step(model, optimizer, tokens[:, :-1], tokens[:, 1:])))
    if i % eval_every == 0 or i == steps:
      curve.append(float(np.mean(window)))
      window = []
      val.append(float(evaluate(model, data["val_inputs"], data["val_targets"])))
  return {"train": curve, "val": val}


_PROGRAMS: dict = {}


def _programs():
  """The jitted train step and evaluation, built once (nnx.jit reuses the compilation across models)."""
  if not _PROGRAMS:
    from flax import nnx

    from tests.nn import minigpt

    @nnx.jit
    def step(model, optimizer, inputs, targets):
      loss, grads = nnx.value_and_grad(minigpt.loss_fn)(model, inputs, targets)
      optimizer.update(model, grads)
      return loss

    _PROGRAMS.update(step=step, evaluate=nnx.jit(minigpt.loss_fn))
  return _PROGRAMS["step"], _PROGRAMS["evaluate"]


def load(data_root: pathlib.Path, vocab: int, span: int, val_windows: int) -> dict:
  tokens = encode((data_root / TEXT).read_text(), vocab)
  cut = int(0.9 * len(tokens))
  val_tokens = tokens[cut:]
  starts = np.linspace(0, len(val_tokens) - span - 1, val_windows).astype(np.int64)
  val = windows(val_tokens, starts, span)
  return {"train": tokens[:cut], "val_inputs": val[:, :-1], "val_targets": val[:, 1:]}


def summarize(runs: dict) -> dict:
  """The paired comparison of the final validation losses: bf16 minus plain, per seed."""
  final = {arm: {int(s): r["val"][-1] for s, r in runs[arm].items()} for arm in ARMS}
  diff = stats.paired(final["bf16"], final["plain"])
  out: dict[str, Any] = {"final": {arm: stats.mean_sd(list(final[arm].values())) for arm in ARMS}, "paired": diff}
  if diff and diff["sd"] is not None:
    from scipy import stats as sps

    n = len(diff["seeds"])
    half = float(sps.t.ppf(0.975, n - 1)) * diff["sd"] / np.sqrt(n)
    d = [final["bf16"][s] - final["plain"][s] for s in diff["seeds"]]
    out.update(ci95=[diff["mean"] - half, diff["mean"] + half], bf16_worse=int(np.sum(np.asarray(d) > 0)), n=n)
  return out


def report(doc: dict) -> str:
  head = metadata_markdown("bf16 recipe against the unmodified NNX miniGPT, over seeds", doc["meta"], doc["settings"])
  runs, summary = doc["runs"], doc["summary"]
  seeds = sorted({int(s) for s in runs["plain"]} & {int(s) for s in runs["bf16"]})
  rows = [
    [s, stats.fmt(runs["plain"][str(s)]["val"][-1]), stats.fmt(runs["bf16"][str(s)]["val"][-1])]
    + [stats.fmt(runs["bf16"][str(s)]["val"][-1] - runs["plain"][str(s)]["val"][-1], 4)]
    for s in seeds
  ]
  body = markdown_table(["seed", "plain val loss", "bf16 val loss", "bf16 - plain"], rows)
  lines = [
    f"- final validation loss, plain: {stats.fmt(summary['final']['plain'][0])} ± "
    f"{stats.fmt(summary['final']['plain'][1])}; bf16: {stats.fmt(summary['final']['bf16'][0])} ± "
    f"{stats.fmt(summary['final']['bf16'][1])} (mean ± sd over seeds)"
  ]
  if "ci95" in summary:
    lo, hi = summary["ci95"]
    lines.append(
      f"- paired difference bf16 - plain: {stats.paired_cell(summary['paired'])}; 95% CI "
      f"[{lo:+.4f}, {hi:+.4f}]; bf16 worse on {summary['bf16_worse']} of {summary['n']} seeds"
    )
  return head + "\n" + body + "\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(prog="python -m research.bf16_seeds", description=__doc__.split("\n")[0])
  p.add_argument("--seeds", type=int, default=16)
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--eval-every", type=int, default=25)
  p.add_argument("--val-windows", type=int, default=512)
  p.add_argument(
    "--data", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
  )
  p.add_argument("--out", type=pathlib.Path, default="runs/results/bf16_seeds")
  args = p.parse_args(argv)
  from tests.nn import minigpt

  settings = {k: getattr(args, k) for k in ("seeds", "steps", "batch", "lr", "eval_every", "val_windows")}
  settings.update(vocab=minigpt.VOCAB, context=minigpt.MAXLEN, embed=minigpt.EMBED, blocks=minigpt.BLOCKS)
  data = load(args.data, minigpt.VOCAB, minigpt.MAXLEN + 1, args.val_windows)
  doc = {"meta": run_metadata(argv), "settings": settings, "runs": {arm: {} for arm in ARMS}}
  kw = dict(steps=args.steps, batch=args.batch, lr=args.lr, eval_every=args.eval_every)
  for seed in range(args.seeds):
    for arm in ARMS:
      start = time.time()
      doc["runs"][arm][str(seed)] = train(arm, seed, data, **kw)
      print(f"seed {seed} {arm}: val {doc['runs'][arm][str(seed)]['val'][-1]:.4f} ({time.time() - start:.0f} s)")
  doc["summary"] = summarize(doc["runs"])
  args.out.parent.mkdir(parents=True, exist_ok=True)
  write_json(args.out.with_suffix(".json"), doc)
  args.out.with_suffix(".md").write_text(report(doc))
  return doc


if __name__ == "__main__":
  main()
