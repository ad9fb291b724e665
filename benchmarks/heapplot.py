"""Draws the layout of a program's temp allocation from an `aot --breakdown` results file: one panel per recipe,
each large buffer a rectangle from its first to its last program step (x) over its bytes in the allocation
(y), coloured by element type; the buffer that ends highest is outlined, the dashed line is the allocation's
size and the dotted one the most bytes live at one step. Where the two lines part, the allocation holds
bytes no step fills (docs/performance-tpu.md).

  python -m benchmarks heapplot results/aot/bench_aot_v5p_ffn_heap_cpu.json --config W3 --out runs/heap.png

Writes only where `--out` says (default under runs/), so committed figures are never overwritten by default.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from labtools.results import log

MIB = 2**20
COLOURS = {"bf16": "#4c72b0", "f32": "#dd8452", "s8": "#55a868", "s32": "#c44e52"}


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("results", help="a results JSON of `python -m benchmarks aot ... --breakdown`")
  p.add_argument("--config", default="", help="keep rows whose shape (or program) contains this text, e.g. W3")
  p.add_argument("--recipes", default="", help="comma-separated recipes (default: every recipe of the rows kept)")
  p.add_argument("--out", default="runs/heap.png", help="PNG to write (default %(default)s)")


def panels(doc: dict, config: str, recipes: list[str]) -> list[tuple[str, dict]]:
  """(title, heap layout of the largest temp allocation) per results row kept, in file order."""
  out = []
  for row in doc["results"]:
    where = str(row.get("shape") or row.get("program", ""))
    heap = (row.get("breakdown") or {}).get("heap") or []
    if config not in where or (recipes and row["recipe"] not in recipes) or not heap:
      continue
    if "blocks" not in heap[0]:
      raise SystemExit(f"{row['recipe']} {where}: the results file has no buffer blocks (rerun aot --breakdown)")
    out.append((f"{row['recipe']} {where}", heap[0]))
  if not out:
    raise SystemExit(f"no row with a heap layout matches --config {config!r} --recipes {','.join(recipes)!r}")
  return out


def draw(found: list[tuple[str, dict]], out: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.patches import Patch, Rectangle

  top_mib = max(h["bytes"] for _, h in found) / MIB * 1.05
  fig, axes = plt.subplots(1, len(found), figsize=(4.2 * len(found), 4.2), squeeze=False, sharey=True)
  for ax, (title, h) in zip(axes[0], found):
    steps = max(b["end"] for b in h["blocks"]) + 1
    for b in h["blocks"]:
      colour = COLOURS.get(b["type"].partition("[")[0], "#8c8c8c")
      is_top = h["top"] and (b["offset"], b["start"]) == (h["top"]["offset"], h["top"]["start"])
      ax.add_patch(
        Rectangle(
          (b["start"], b["offset"] / MIB),
          b["end"] + 1 - b["start"],
          b["bytes"] / MIB,
          facecolor=colour,
          alpha=0.75,
          edgecolor="black" if is_top else "white",
          linewidth=2.0 if is_top else 0.5,
        )
      )
    ax.axhline(h["bytes"] / MIB, color="black", linestyle="--", linewidth=1)
    ax.axhline(h["live_peak_bytes"] / MIB, color="black", linestyle=":", linewidth=1)
    ax.set_xlim(0, steps)
    ax.set_ylim(0, top_mib)
    ax.set_title(f"{title}\nallocated {h['bytes'] / MIB:,.0f} MiB, live at most {h['live_peak_bytes'] / MIB:,.0f}")
    ax.set_xlabel("program step")
  axes[0][0].set_ylabel("offset in the temp allocation (MiB)")
  handles = [Patch(color=c, label=t) for t, c in COLOURS.items()]
  fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
  fig.tight_layout(rect=(0, 0.06, 1, 1))
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out, dpi=110)
  plt.close(fig)


def run(args: argparse.Namespace) -> None:
  doc = json.loads(pathlib.Path(args.results).read_text())
  recipes = [r for r in args.recipes.split(",") if r]
  out = pathlib.Path(args.out)
  draw(panels(doc, args.config, recipes), out)
  log(f"[heapplot] wrote {out}")
