"""Joins results files of one benchmark that cover different shapes into one file.

A run that has to stop part-way (a device lease, a session ending) leaves a file with the
shapes it finished (`"complete": false`); a second run of the remaining shapes leaves another.
`python -m benchmarks merge A.json B.json --out results/bench_ffn_gpu` writes one JSON/Markdown/PNG with
every shape, keeping each part's own metadata (command, git revision, date, machine) under
`merged_from`. It refuses files of different benchmarks, platforms or settings, and shapes that
appear twice, so a merged table never mixes measurements taken under different conditions.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib

from labtools import paper
from labtools.results import log, metadata_lines, repo_relative

MERGEABLE = ("ffn", "quantizer")  # benches whose results are one entry per shape


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("parts", nargs="+", help="results JSON files of one bench (ffn or quantizer), in any order")
  p.add_argument("--out", required=True, help="output stem: writes <out>.json, <out>.md and <out>.png")
  p.add_argument("--no-chart", action="store_true", help="skip the PNG bar chart")


def merge_docs(docs: list[dict], files: list[str]) -> dict:
  """The merged document; raises SystemExit with the offending file when parts disagree."""
  first = docs[0]
  if first.get("bench") not in MERGEABLE:
    raise SystemExit(f"{files[0]}: bench {first.get('bench')!r} cannot be merged (only {', '.join(MERGEABLE)})")
  same = lambda d: {k: v for k, v in d["settings"].items() if k != "shapes"}
  results, seen, requested = [], {}, []
  for doc, f in zip(docs, files):
    for key, got, want in (
      ("bench", doc.get("bench"), first["bench"]),
      ("platform", doc["meta"].get("platform"), first["meta"].get("platform")),
    ):
      if got != want:
        raise SystemExit(f"{f}: {key} {got!r} differs from {files[0]}'s {want!r}")
    if same(doc) != same(first):
      raise SystemExit(f"{f}: settings {same(doc)} differ from {files[0]}'s {same(first)}")
    requested += [s for s in str(doc["settings"].get("shapes", "")).split(",") if s and s not in requested]
    for r in doc["results"]:
      if r["shape"] in seen:
        raise SystemExit(f"shape {r['shape']} is in both {seen[r['shape']]} and {f}")
      seen[r["shape"]] = f
      results.append(r)
  order = {s: i for i, s in enumerate(paper.FFN_SHAPES)}
  results.sort(key=lambda r: order.get(r["shape"], len(order)))
  parts = [
    {"file": repo_relative(f), "complete": d.get("complete", True), "meta": d["meta"], "settings": d["settings"]}
    for d, f in zip(docs, files)
  ]
  settings = {**first["settings"], "shapes": ",".join(r["shape"] for r in results)}
  return {
    "bench": first["bench"],
    "complete": all(s in seen for s in requested),
    "merged_from": parts,
    "settings": settings,
    "results": results,
  }


def _names(doc: dict) -> list[str]:
  recipes = doc["settings"]["recipes"].split(",")
  if doc["bench"] == "quantizer":
    from benchmarks.quantizer import config_names

    return config_names(recipes)
  return recipes


def run(args: argparse.Namespace) -> dict:
  docs = []
  for f in args.parts:
    try:
      docs.append(json.loads(pathlib.Path(f).read_text()))
    except (OSError, ValueError) as e:
      raise SystemExit(f"{f}: cannot read a results JSON ({e})") from None
  doc = merge_docs(docs, list(args.parts))
  mod = importlib.import_module(f"benchmarks.{doc['bench']}")  # its markdown() and chart()
  names = _names(doc)
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  paths = {"json": out.with_suffix(".json"), "md": out.with_suffix(".md")}
  paths["json"].write_text(json.dumps(doc, indent=1) + "\n")
  heads = [f"Merged by `python -m benchmarks merge` from {len(docs)} runs of the same settings (shapes aside):", ""]
  for p in doc["merged_from"]:
    heads += [
      f"## part: {p['file']}" + ("" if p["complete"] else " (stopped before its last shape)"),
      "",
      metadata_lines(p["meta"], p["settings"]),
    ]
  paths["md"].write_text(
    f"# python -m benchmarks {doc['bench']} (merged)\n\n"
    + "\n".join(heads)
    + "\n"
    + mod.markdown(doc["results"], names)
  )
  if not args.no_chart:
    paths["png"] = out.with_suffix(".png")
    mod.chart(doc["results"], names, paths["png"])
  log(f"[merge] {len(doc['results'])} shapes -> {', '.join(str(p) for p in paths.values())}")
  return {"doc": doc, "paths": paths}
