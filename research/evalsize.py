"""How well the 16 fixed validation batches estimate the loss on the whole validation shard.

Training runs evaluate `eval_batches` = 16 batches of 8 x 256 tokens (32,768 tokens), evenly spaced
over enwiki shard 9 (s3r.data.eval_batches). For saved checkpoints this evaluates every batch of the
shard, and reports the full-shard loss, the 16-batch loss, their difference, and the standard error
of a 16-batch mean implied by the batch-to-batch spread (with the finite-population correction).

Dimension letters: B batch, S sequence.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import jax
import numpy as np

from labtools import results as provenance
from s3r import data as s3r_data
from s3r.train.evaluate import restore_run
from s3r.train.run import checkpoint


def shard9_tokens(tok: s3r_data.Tokenizer) -> np.ndarray:
  """Every document of the last enwiki shard, each followed by end-of-text (as s3r.data.prepare does)."""
  root = s3r_data.default_data_root()
  assert root is not None, "no data root: the enwiki shards are needed"
  shard = sorted((root / "enwiki").glob("*.jsonl.gz"))[-1]
  docs = list(s3r_data.read_documents(str(shard)))
  return np.concatenate([np.asarray(ids + [tok.eot_id], np.int32) for ids in tok.encode_batch(docs)])


def subset_stats(per_batch: np.ndarray, chosen: np.ndarray) -> dict:
  """Full mean, subset mean, difference and the standard error of a mean of len(chosen) batches."""
  n, k = len(per_batch), len(chosen)
  sd = float(np.std(per_batch, ddof=1))
  se = sd / np.sqrt(k) * np.sqrt((n - k) / (n - 1))
  full, sub = float(np.mean(per_batch)), float(np.mean(per_batch[chosen]))
  return {
    "n_batches": n,
    "subset_batches": k,
    "full": full,
    "subset": sub,
    "difference": sub - full,
    "batch_sd": sd,
    "subset_se": float(se),
    "z": float((sub - full) / se) if se > 0 else None,
  }


def paired_checkpoints(checkpoints: list[dict], eval_batches: int = 16) -> list[dict]:
  """subset_stats of the per-batch loss difference of consecutive checkpoints of the same run."""
  out = []
  for a, b in zip(checkpoints, checkpoints[1:]):
    if a["run"] != b["run"] or a["n_batches"] != b["n_batches"]:
      continue
    la, lb = np.asarray(a["per_batch"]), np.asarray(b["per_batch"])
    n = len(la)
    chosen = np.unique(np.linspace(0, n - 1, eval_batches).round().astype(np.int64))
    out.append(
      {
        "run": a["run"],
        "steps": f"{b['step']} - {a['step']}",
        **subset_stats(lb - la, chosen),
        "correlation": float(np.corrcoef(la, lb)[0, 1]),
      }
    )
  return out


def evaluate_checkpoint_full(path: str, step: int | None = None, *, eval_batches: int = 16, log=print) -> dict:
  cfg, setup, step, state, _, tok, _ = restore_run(path, step=step, log=log)
  tokens = shard9_tokens(tok)
  batches = list(s3r_data.eval_batches(tokens, batch_size=cfg.batch, seq_len=cfg.seq_len))
  n = len(batches)
  chosen = np.unique(np.linspace(0, n - 1, eval_batches).round().astype(np.int64))  # as eval_batches picks them
  t0 = time.time()
  losses = np.asarray(
    jax.device_get([setup.eval_step(state.params, b, setup.keys["eval"]) for b in batches]), np.float64
  )
  log(f"{path}@{step}: {n} batches in {time.time() - t0:.0f}s")
  return {
    "run": pathlib.Path(path).name,
    "step": step,
    "recipe": cfg.recipe.name,
    "tokens": int(len(tokens)),
    "batch": cfg.batch,
    "seq": cfg.seq,
    **subset_stats(losses, chosen),
    "per_batch": losses.tolist(),
  }


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(prog="python -m research.evalsize", description=__doc__.split("\n")[0])
  p.add_argument("runs", nargs="+", help="run folders (their checkpoints are read, never written)")
  p.add_argument("--out", default="runs/results/evalsize")
  p.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json")
  args = p.parse_args(argv)
  out = pathlib.Path(args.out)
  path = out.with_suffix(".json")
  import json

  results = json.loads(path.read_text()) if path.is_file() else {"checkpoints": []}
  if not args.report_only:
    results["meta"] = provenance.run_metadata(argv)
  done = {(c["run"], c["step"]) for c in results["checkpoints"]}
  for run in [] if args.report_only else args.runs:
    ckpt = checkpoint.Checkpointer(checkpoint.find_checkpoint_dir(run), create=False)
    steps = ckpt.all_steps()
    ckpt.close()
    for step in steps:
      if (pathlib.Path(run).name, step) in done:
        continue
      try:
        results["checkpoints"].append(evaluate_checkpoint_full(run, step))
      except (FileNotFoundError, ValueError) as e:  # a running sweep may have rotated the checkpoint away
        print(f"skipped {run}@{step}: {e}")
        continue
      provenance.write_json(path, results)
  lines = [
    "# Validation size: 16 fixed batches against the whole of enwiki shard 9",
    "",
    provenance.metadata_lines(results["meta"], {}),
    "| run | step | batches | full-shard loss | 16-batch loss | difference | SE of a 16-batch mean | z |",
    "| --- | --: | --: | --: | --: | --: | --: | --: |",
  ]
  for c in results["checkpoints"]:
    lines.append(
      f"| {c['run']} | {c['step']} | {c['n_batches']} | {c['full']:.4f} | {c['subset']:.4f} | "
      f"{c['difference']:+.4f} | {c['subset_se']:.4f} | {c['z']:+.2f} |"
    )
  pairs = paired_checkpoints(results["checkpoints"])
  if pairs:
    lines += [
      "",
      "Paired: the difference of two checkpoints' losses over the same batches (what a comparison of two "
      "models on the fixed 16 batches sees).",
      "",
      "| run | steps | full-shard difference | 16-batch difference | deviation | SE of a paired 16-batch "
      "difference | batch correlation |",
      "| --- | --- | --: | --: | --: | --: | --: |",
    ]
    for q in pairs:
      lines.append(
        f"| {q['run']} | {q['steps']} | {q['full']:+.4f} | {q['subset']:+.4f} | {q['difference']:+.4f} | "
        f"{q['subset_se']:.4f} | {q['correlation']:.3f} |"
      )
  results["paired"] = pairs
  provenance.write_json(path, results)
  out.with_suffix(".md").write_text("\n".join(lines) + "\n")
  print(out.with_suffix(".md").read_text())
  return results


if __name__ == "__main__":
  main()
