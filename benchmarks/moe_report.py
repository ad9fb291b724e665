"""The report of `python -m benchmarks moe`: ratios of medians with paired intervals, the targets' verdicts, the
Markdown tables and the chart."""

from __future__ import annotations

from benchmarks import options, timing
from labtools import paper
from labtools.results import bar_chart, fmt_ms, fmt_ratio, markdown_table

# The block's CPU targets (stated for the qwen3-30b-a3b shape): (recipe, ratio, bound, kind)
TARGETS = (
  ("s3r", "time_vs_int8_rtne", 1.05, "at most"),  # s3r within 5% of int8_rtne's time
  ("s3r_ec_dx", "speedup_vs_int8_sr", 1.2, "at least"),  # s3r_ec_dx at least 1.2x faster than int8_sr
)


def _ratio(timings, a, b, name: str) -> dict:
  """{name: t(a) / t(b) as a ratio of medians, name_paired: the median of same-round ratios,
  name_paired_ci95: its 95% interval (`timing.paired_ratio_interval`)}, all None without a or b."""
  if a not in timings or b not in timings:
    return {name: None, f"{name}_paired": None, f"{name}_paired_ci95": None}
  ta, tb = timings[a], timings[b]
  return {
    name: ta.median / tb.median,
    f"{name}_paired": timing.paired_ratio(ta, tb),
    f"{name}_paired_ci95": timing.paired_ratio_interval(ta, tb),
  }


def summarize_block(name, shape, tokens, timings) -> dict:
  rows = {}
  for r, t in timings.items():
    rows[r] = {"timing": t.as_dict()}
    for ref in ("bf16", "int8_sr"):
      rows[r] |= _ratio(timings, ref, r, f"speedup_vs_{ref}")
    rows[r] |= _ratio(timings, r, "int8_rtne", "time_vs_int8_rtne")
  return {"shape": name, **shape, "tokens": tokens, "rows": tokens * shape["top_k"], "recipes": rows}


def target_verdict(ci, bound: float, kind: str) -> str:
  """ "met" or "missed" when the whole 95% interval lies on one side of the bound, else
  "not resolved" (or "too few rounds" without an interval)."""
  if ci is None:
    return "too few rounds"
  lo, hi = ci
  inside = (hi <= bound) if kind == "at most" else (lo >= bound)
  outside = (lo > bound) if kind == "at most" else (hi < bound)
  return "met" if inside else "missed" if outside else "not resolved"


def _targets_markdown(block: list[dict]) -> list[str]:
  rows = []
  for res in block:
    for recipe, ratio, bound, kind in TARGETS:
      row = res["recipes"].get(recipe)
      if row is None or row[ratio] is None:
        continue
      ci = row[f"{ratio}_paired_ci95"]
      interval = "–" if ci is None else f"{ci[0]:.3f}-{ci[1]:.3f}"
      rows.append(
        [
          res["shape"],
          f"{recipe} {ratio.replace('_', ' ')}",
          f"{kind} {bound}",
          fmt_ratio(row[ratio]),
          f"{row[f'{ratio}_paired']:.3f}",
          interval,
          target_verdict(ci, bound, kind),
        ]
      )
  if not rows:
    return []
  head = ["shape", "ratio", "target", "ratio of medians", "paired median", "95% interval", "verdict"]
  return [
    "## Targets",
    "",
    markdown_table(head, rows),
    "The paired median is the median over rounds of the same-round ratio; its 95% interval is the "
    "distribution-free order-statistic (sign-test) interval, treating rounds as independent. A target is met "
    "or missed when the whole interval lies on one side of it.",
    "",
  ]


def summarize_gemm(name, shape, rows, timings) -> dict:
  out = {}
  for f, t in timings.items():
    out[f] = {"timing": t.as_dict()} | _ratio(timings, "ragged", f, "speedup_vs_ragged")
  flops = 3 * 2 * rows * shape["hidden"] * shape["expert_width"]
  return {
    "shape": name,
    "experts": shape["experts"],
    "rows": rows,
    "K": shape["hidden"],
    "N": shape["expert_width"],
    "routed_int8_ops": flops,
    "forms": out,
  }


def markdown(results: dict, recipes: list[str], forms: list[str]) -> str:
  out = []
  if results["block"]:
    out += ["## MoE feed-forward block, forward + backward (median ms; ratios from the same run)", ""]
    head = [
      "shape",
      "T",
      "rows R",
      "recipe",
      "median ms",
      "IQR ms",
      "speedup vs bf16",
      "speedup vs int8_sr",
      "time / int8_rtne",
    ]
    rows = []
    for res in results["block"]:
      for r in recipes:
        row, t = res["recipes"][r], res["recipes"][r]["timing"]
        rows.append(
          [
            res["shape"],
            res["tokens"],
            res["rows"],
            r,
            fmt_ms(t["median_s"]),
            fmt_ms(t["iqr_s"]),
            fmt_ratio(row["speedup_vs_bf16"]),
            fmt_ratio(row["speedup_vs_int8_sr"]),
            fmt_ratio(row["time_vs_int8_rtne"]),
          ]
        )
    out += [
      markdown_table(head, rows),
      "Ratios are ratios of medians; the JSON also has paired (per-round) medians and their 95% intervals.",
      "",
    ]
    out += _targets_markdown(results["block"])
    ref = [res["shape"] for res in results["block"] if res["shape"] in paper.PAPER_TABLE_IV_MOE_MS]
    if ref:
      out += ["Reference, paper Table IV (full training steps on TPU v5p): speedup vs int8_sr", ""]
      rows = [
        [s]
        + [
          fmt_ratio(paper.PAPER_TABLE_IV_MOE_MS[s]["int8_sr"] / paper.PAPER_TABLE_IV_MOE_MS[s][r])
          for r in options.BENCH_RECIPES
        ]
        for s in ref
      ]
      out += [markdown_table(["shape", *options.BENCH_RECIPES], rows), ""]
  if results["gemm"]:
    out += [
      "## Grouped GEMM alone: forward + dX + dW int8 GEMMs of one grouped_qmatmul (median ms)",
      "",
      "R rows in E equal groups, K = hidden, N = expert width. `dense` pads every expert to C = the largest "
      "group (and would drop rows past it). `pallas`: the Pallas kernels (compiled on GPU, interpret mode elsewhere).",
      "",
    ]
    rows = []
    for res in results["gemm"]:
      for f in (f for f in forms if f in res["forms"]):
        row, t = res["forms"][f], res["forms"][f]["timing"]
        gops = res["routed_int8_ops"] / t["median_s"] / 1e9
        rows.append(
          [
            res["shape"],
            res["experts"],
            res["rows"],
            f"{res['K']}x{res['N']}",
            f,
            fmt_ms(t["median_s"]),
            fmt_ms(t["iqr_s"]),
            f"{gops:.1f}",
            fmt_ratio(row["speedup_vs_ragged"]),
          ]
        )
    out.append(
      markdown_table(
        ["shape", "E", "R", "K x N", "formulation", "median ms", "IQR ms", "routed GOP/s", "speedup vs ragged_dot"],
        rows,
      )
    )
  return "\n".join(out)


def chart_reference(recipes: list[str]) -> str | None:
  """The recipe the chart's speedups are relative to: bf16, else int8_sr, else None (no chart)."""
  return next((r for r in ("bf16", "int8_sr") if r in recipes), None)


def chart(results: dict, recipes: list[str], path) -> None:
  ref = chart_reference(recipes)
  groups = [f"{r['shape']}\nT={r['tokens']}" for r in results["block"]]
  series = {rc: [r["recipes"][rc][f"speedup_vs_{ref}"] for r in results["block"]] for rc in recipes}
  bar_chart(
    path,
    groups,
    series,
    ylabel=f"speedup vs {ref} (t_{ref} / t)",
    hline=1.0,
    title=f"MoE feed-forward block fwd+bwd: speed vs {ref} (same run)",
  )
