"""Contrasts at one learning rate, pooled from several finished sweeps.

A sweep picks each recipe's rate on short runs; when a longer run favours another rate, a
contrast between two recipes at different rates mixes the recipe with the rate. This reads the
Table I JSON of several sweeps (for example `table1_long` and its control `table1_long_ratecheck`),
groups every (recipe, rate) row by rate, and for each rate compares every pair of recipes on the
seeds both finished: the per-seed difference (same initialization and data order), its paired
t-test, and Welch's test. Output: `<out>.json` and `<out>.md`.

  python -m research.same_rate research/results/table1_long.json research/results/table1_long_ratecheck.json \
      --out research/results/table1_long_same_rate
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib

from labtools.paper import paper_diff
from labtools.results import markdown_table, metadata_markdown, run_metadata, write_json
from research import stats

# a - b takes a before b in this order: the recipe the paper expects to be worse comes first.
_ORDER = ("int8_rtne", "s3r", "int8_sr", "s3r_ec_dx", "s3r_ec", "bf16")


def load_rows(paths: list[pathlib.Path]) -> dict[float, dict[str, dict[int, float]]]:
  """{rate: {recipe: {seed: final validation loss}}} from each sweep's rows; a (recipe, rate)
  found in two sweeps is an error, since it would be unclear which runs to pair."""
  by_rate: dict[float, dict[str, dict[int, float]]] = {}
  for path in paths:
    if not path.exists():
      raise SystemExit(
        f"same_rate: {path} does not exist (run `python -m research sweep --report-only` for that sweep first)"
      )
    rows = json.loads(path.read_text())["rows"]
    for recipe, row in rows.items():
      if row.get("best_lr") is None or not row.get("val_by_seed"):
        continue
      cell = by_rate.setdefault(float(row["best_lr"]), {})
      if recipe in cell:
        raise SystemExit(f"same_rate: {recipe} at lr {row['best_lr']} appears in more than one sweep ({path})")
      cell[recipe] = {int(s): float(v) for s, v in row["val_by_seed"].items()}
  return by_rate


def _contrast(a: str, lr_a: float, va: dict, b: str, lr_b: float, vb: dict) -> dict:
  """Fields as in `table1.build_contrasts`; the paper's difference only between two recipes."""
  return {
    "a": a,
    "lr_a": lr_a,
    "b": b,
    "lr_b": lr_b,
    "seeds_a": sorted(va),
    "seeds_b": sorted(vb),
    "mean_diff": sum(va.values()) / len(va) - sum(vb.values()) / len(vb),
    "welch": stats.welch(list(va.values()), list(vb.values())),
    "paired": stats.paired(va, vb),
    "paper_diff": None if a == b else paper_diff(a, b),
  }


def contrasts(by_rate: dict) -> list[dict]:
  """Every pair of recipes that share a rate (a before b in `_ORDER`), then every recipe that
  ran at several rates against itself (lower rate - higher rate)."""
  rank = {r: i for i, r in enumerate(_ORDER)}

  def in_order(recipes):
    return sorted(recipes, key=lambda r: (rank.get(r, len(rank)), r))

  out = []
  for lr in sorted(by_rate):
    recipes = in_order(by_rate[lr])
    for a, b in itertools.combinations(recipes, 2):
      out.append(_contrast(a, lr, by_rate[lr][a], b, lr, by_rate[lr][b]))
  for recipe in in_order({r for cell in by_rate.values() for r in cell}):
    rates = sorted(lr for lr in by_rate if recipe in by_rate[lr])
    for lo, hi in itertools.combinations(rates, 2):
      out.append(_contrast(recipe, lo, by_rate[lo][recipe], recipe, hi, by_rate[hi][recipe]))
  return out


def _markdown(meta: dict, sources: list[str], rows: list[dict]) -> str:
  head = metadata_markdown("s3r same-rate contrasts", meta, {})
  lines = [
    head,
    (
      f"Sources: {', '.join(f'`{s}`' for s in sources)}. Final validation loss on enwiki shard 9; "
      "a - b over the seeds both recipes finished (paired: mean ± sd of the per-seed difference and "
      "the paired t (p)); Welch's t (p) over each recipe's seeds; the paper's difference of its gaps "
      "to BF16.\n"
    ),
    markdown_table(
      ["a - b", "seeds", "difference of means", "Welch t (p)", "paired", "paper"],
      [
        [
          f"`{r['a']}` at {r['lr_a']:g} - `{r['b']}` at {r['lr_b']:g}",
          ",".join(map(str, (r["paired"] or {}).get("seeds", []))) or "–",
          f"{r['mean_diff']:+.3f}",
          stats.welch_cell(r["welch"]),
          stats.paired_cell(r["paired"]),
          "–" if r["paper_diff"] is None else f"{r['paper_diff']:+.3f}",
        ]
        for r in rows
      ],
      ["l", "l", "r", "r", "r", "r"],
    ),
  ]
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument(
    "tables", nargs="+", type=pathlib.Path, help="Table I JSON files written by `python -m research sweep`"
  )
  p.add_argument("--out", type=pathlib.Path, required=True, help="output stem: writes <out>.json and <out>.md")
  args = p.parse_args(argv)
  rows = contrasts(load_rows(args.tables))
  meta = run_metadata()
  doc = {"meta": meta, "sources": [str(t) for t in args.tables], "contrasts": rows}
  args.out.parent.mkdir(parents=True, exist_ok=True)
  write_json(args.out.with_suffix(".json"), doc)
  args.out.with_suffix(".md").write_text(_markdown(meta, doc["sources"], rows))
  print(f"wrote {args.out}.json and {args.out}.md ({len(rows)} contrasts)")
  return doc


if __name__ == "__main__":
  main()
