"""The performance model checked against the accelerator numbers that exist (results/perfmodel/PREREGISTRATION.md).

- h200: fit on the measured `bf16` and `int8_rtne` FFN blocks (results/bench_ffn_gpu.json), predict the four other
  recipes' speedups and the quantizer programs (results/bench_quantizer_gpu.json), from the programs of the
  revision that was measured compiled for the `h200` target.
- v5p: fit on the paper's Table III at W3 and W9, predict the other seven shapes, from this revision's FFN block
  compiled for the `v5p` target.
Kernel lists (`python -m benchmarks perfmodel kernels`) are read from results/perfmodel/kernels/.
"""

from __future__ import annotations

import gzip
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks import perfmodel as pm
from benchmarks.perfmodel_hlo import Kernel
from labtools.paper import FFN_SHAPES, PAPER_TABLE_III

SHAPES = tuple(FFN_SHAPES)
FFN_RECIPES = ("bf16", "int8_rtne", "int8_sr", "s3r", "s3r_ec", "s3r_ec_dx")
FITTED_H200 = ("bf16", "int8_rtne")
TIE = 0.03  # measured medians closer than this are ties in the order check
PASS = {"median": 0.07, "worst": 0.15, "quantizer_median": 0.25}
PAPER_W9_GEMM_RATIO = 90.29 / 47.6  # bf16 GEMM time over INT8 GEMM time, one FFN block at W9 (paper, §IV-D)


def load_kernels(path: pathlib.Path) -> tuple[dict, dict[str, list[Kernel]]]:
  """(metadata, {program name: kernels}) of a kernels file."""
  data = json.loads(gzip.decompress(path.read_bytes()))
  return data["meta"], {name: [Kernel(**k) for k in ks] for name, ks in data["programs"].items()}


def _rel(pred: float, meas: float) -> float:
  return pred / meas - 1.0


def _order_misses(pred: dict[str, float], meas: dict[str, float]) -> list[str]:
  """Pairs whose measured times differ by more than TIE and whose predicted order is the other way."""
  out, names = [], sorted(meas)
  for i, a in enumerate(names):
    for b in names[i + 1 :]:
      if abs(meas[a] / meas[b] - 1) > TIE and (pred[a] - pred[b]) * (meas[a] - meas[b]) < 0:
        out.append(f"{a}/{b}")
  return out


def _group_extra(ks: Sequence[Kernel], ref: Sequence[Kernel], t: pm.Target, c: pm.Constants) -> dict[str, float]:
  """Predicted seconds per kernel group of `ks` minus those of `ref`: where a recipe's extra time goes."""
  a, b = pm.breakdown(ks, t, c), pm.breakdown(ref, t, c)
  return {g: a.get(g, 0.0) - b.get(g, 0.0) for g in sorted(set(a) | set(b)) if abs(a.get(g, 0) - b.get(g, 0)) > 1e-7}


def _summary(errors: list[float]) -> dict:
  e = np.abs(np.array(errors))
  return {"median_abs": float(np.median(e)), "worst_abs": float(e.max()), "points": len(errors)}


def h200(
  kernels_file: pathlib.Path, ffn_json: pathlib.Path, quantizer_json: pathlib.Path | None, bands: bool = True
) -> dict:
  """The H200 validation (see the module docstring); `bands`: the 90% band of each held-out ratio (2,000 draws)."""
  meta, programs = load_kernels(kernels_file)
  t = pm.target("h200")
  ffn = json.loads(ffn_json.read_text())
  tokens = ffn["results"][0]["tokens"]
  measured = {(r["shape"], name): v["timing"]["median_s"] for r in ffn["results"] for name, v in r["recipes"].items()}
  ks = lambda shape, recipe: programs[f"h200_ffn_{shape}_T{tokens}_{recipe}"]
  fitted = [(s, r) for s in SHAPES for r in FITTED_H200]

  def residuals(c: pm.Constants) -> np.ndarray:
    return np.array([math.log(pm.program_seconds(ks(s, r), t, c) / measured[(s, r)]) for s, r in fitted])

  fit = pm.fit(residuals)
  c = fit.constants
  rows, errors, misses = [], [], {}
  for s in SHAPES:
    pred = {r: pm.program_seconds(ks(s, r), t, c) for r in FFN_RECIPES}
    meas = {r: measured[(s, r)] for r in FFN_RECIPES}
    misses[s] = _order_misses(pred, meas)
    for r in FFN_RECIPES:
      row: dict[str, Any] = {
        "shape": s,
        "recipe": r,
        "fitted": r in FITTED_H200,
        "measured_s": meas[r],
        "predicted_s": pred[r],
      }
      row["measured_speedup"] = meas["bf16"] / meas[r]
      row["predicted_speedup"] = pred["bf16"] / pred[r]
      row["error"] = _rel(row["predicted_speedup"], row["measured_speedup"])
      if r not in FITTED_H200:
        errors.append(row["error"])
        row["band"] = (
          None
          if not bands
          else pm.band(
            fit, lambda c_, s=s, r=r: pm.program_seconds(ks(s, "bf16"), t, c_) / pm.program_seconds(ks(s, r), t, c_)
          )
        )
        row["extra_vs_int8_rtne"] = {
          "measured_s": meas[r] - meas["int8_rtne"],
          "predicted_s": pred[r] - pred["int8_rtne"],
          "by_group_s": _group_extra(ks(s, r), ks(s, "int8_rtne"), t, c),
        }
      rows.append(row)
  out = {"target": "h200", "kernels": meta, "fit": fit.as_dict(), "rows": rows, "summary": _summary(errors)}
  out["order_misses"] = misses
  out["passed"] = _passed(out["summary"], misses)
  if quantizer_json is not None:
    out["quantizer"] = _quantizers(programs, quantizer_json, t, c)
  return out


def _passed(summary: dict, misses: dict) -> dict:
  return {
    "median": summary["median_abs"] <= PASS["median"],
    "worst": summary["worst_abs"] <= PASS["worst"],
    "order": not any(misses.values()),
  }


def _quantizers(programs: dict, path: pathlib.Path, t: pm.Target, c: pm.Constants) -> dict:
  data = json.loads(path.read_text())
  rows, errors = [], []
  for r in data["results"]:
    for name, v in r["configs"].items():
      key = f"h200_quantizer_{r['shape']}_T{r['tokens']}_{name}"
      if key not in programs:
        continue
      pred, meas = pm.program_seconds(programs[key], t, c), v["timing"]["median_s"]
      rows.append(
        {"shape": r["shape"], "program": name, "measured_s": meas, "predicted_s": pred, "error": _rel(pred, meas)}
      )
      errors.append(_rel(pred, meas))
  summary = _summary(errors) if errors else {}
  return {
    "rows": rows,
    "summary": summary,
    "passed": bool(errors) and summary["median_abs"] <= PASS["quantizer_median"],
  }


# --- TPU v5p ------------------------------------------------------------------------------------

V5P_FIT_SHAPES = ("W3", "W9")
V5P_SPEEDUPS = ("int8_rtne", "int8_sr", "s3r")
V5P_OVERHEADS = ("s3r_ec", "s3r_ec_dx")


def _gemm_seconds(ks: Sequence[Kernel], t: pm.Target, c: pm.Constants) -> float:
  return sum(k.count * pm.kernel_seconds(k, t, c) for k in ks if k.kind == "gemm")


def v5p(kernels_file: pathlib.Path, bands: bool = True) -> dict:
  """The TPU v5p validation against the paper's Table III (see the module docstring)."""
  meta, programs = load_kernels(kernels_file)
  t = pm.target("v5p")
  tokens = meta.get("tokens", 16384)
  ks = lambda shape, recipe: programs[f"v5p_ffn_{shape}_T{tokens}_{recipe}"]

  def predicted(s: str, c: pm.Constants) -> dict[str, float]:
    times = {r: pm.program_seconds(ks(s, r), t, c) for r in FFN_RECIPES}
    out = {r: times["bf16"] / times[r] for r in V5P_SPEEDUPS}
    out |= {f"{r}_pct": 100 * (times[r] / times["s3r"] - 1) for r in V5P_OVERHEADS}
    return out

  def residuals(c: pm.Constants) -> np.ndarray:
    res = []
    for s in V5P_FIT_SHAPES:
      p, paper = predicted(s, c), PAPER_TABLE_III[s]
      res += [math.log(p[r] / paper[r]) for r in V5P_SPEEDUPS]
      res += [math.log((1 + p[f"{r}_pct"] / 100) / (1 + paper[f"{r}_pct"] / 100)) for r in V5P_OVERHEADS]
    ratio = _gemm_seconds(ks("W9", "bf16"), t, c) / _gemm_seconds(ks("W9", "int8_rtne"), t, c)
    res.append(math.log(ratio / PAPER_W9_GEMM_RATIO))
    return np.array(res)

  fit = pm.fit(residuals)
  c = fit.constants
  rows, errors, misses = [], [], {}
  for s in SHAPES:
    p, paper = predicted(s, c), PAPER_TABLE_III[s]
    held_out = s not in V5P_FIT_SHAPES
    for r in V5P_SPEEDUPS:
      row: dict[str, Any] = {
        "shape": s,
        "recipe": r,
        "fitted": not held_out,
        "paper_speedup": paper[r],
        "predicted_speedup": p[r],
      }
      row["error"] = _rel(p[r], paper[r])
      row["band"] = pm.band(fit, lambda c_, s=s, r=r: predicted(s, c_)[r]) if bands else None
      rows.append(row)
      if held_out:
        errors.append(row["error"])
    for r in V5P_OVERHEADS:
      rows.append({"shape": s, "recipe": r, "fitted": not held_out, "paper_overhead_pct": paper[f"{r}_pct"],
                   "predicted_overhead_pct": p[f"{r}_pct"]})  # fmt: skip
    meas = {"bf16": 1.0, **{r: 1.0 / paper[r] for r in V5P_SPEEDUPS}}
    pred = {"bf16": 1.0, **{r: 1.0 / p[r] for r in V5P_SPEEDUPS}}
    misses[s] = _order_misses(pred, meas) if held_out else []
  out = {"target": "v5p", "kernels": meta, "fit": fit.as_dict(), "rows": rows, "summary": _summary(errors)}
  out["order_misses"] = misses
  out["passed"] = _passed(out["summary"], misses)
  return out
