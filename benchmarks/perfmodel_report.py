"""Tables and figures of `python -m benchmarks perfmodel`: the validation against measurements, and the predicted
train steps (per recipe, against the bf16 baseline, with the band of the fitted constants and a breakdown by
kernel group)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from collections import defaultdict

import numpy as np

from benchmarks import perfmodel as pm
from benchmarks import perfmodel_validate as pv
from labtools.paper import PAPER_TABLE_IV_MS
from labtools.results import markdown_table

GROUP_ORDER = ("gemm bf16", "gemm f32", "gemm s8", "gemm f8", "gemm mixed", "attention", "s3r_quantize",
               "s3r_threshold", "s3r_ec", "optimizer", "collectives", "other")  # fmt: skip
GROUP_NAMES = {
  "gemm bf16": "GEMM bf16", "gemm f32": "GEMM f32 (TF32)", "gemm s8": "GEMM int8", "gemm f8": "GEMM FP8",
  "gemm mixed": "GEMM mixed types", "attention": "attention", "s3r_quantize": "quantizers",
  "s3r_threshold": "thresholds", "s3r_ec": "error correction", "optimizer": "optimizer", "collectives": "collectives",
  "other": "other",
}  # fmt: skip
FP8_RECIPE = "s3r_ec_dx@e5m2+fwd_e4m3"


def _ms(seconds: float) -> str:
  """Milliseconds with three significant digits at least (1.23, 45.6, 1,234)."""
  ms = 1e3 * seconds
  return f"{ms:,.2f}" if ms < 10 else f"{ms:,.1f}" if ms < 100 else f"{ms:,.0f}"


def _pct(x: float) -> str:
  return f"{100 * x:+.1f}%"


def validation_line(r: dict) -> str:
  s = r["summary"]
  return (f"{r['target']}: held-out median |error| {100 * s['median_abs']:.1f}%, worst {100 * s['worst_abs']:.1f}% "
          f"over {s['points']} points; passed {r['passed']}")  # fmt: skip


def validation_markdown(r: dict) -> str:
  fit = r["fit"]
  lines = [f"## Fit ({fit['points']} points, RMS log residual {fit['rms_log_residual']:.3f})", ""]
  rows = [[k, f"{v:.4g}", f"{fit['standard_errors'][k]:.2g}"] for k, v in fit["constants"].items()]
  lines += [markdown_table(["constant", "value", "standard error"], rows, ["l", "r", "r"]), ""]
  s, passed = r["summary"], r["passed"]
  lines += [f"## Held-out predictions: {validation_line(r)}", ""]
  lines += [f"- median absolute error of the speedup {100 * s['median_abs']:.1f}% (pass at most "
            f"{100 * pv.PASS['median']:.0f}%: {'pass' if passed['median'] else 'MISS'})",
            f"- worst {100 * s['worst_abs']:.1f}% (pass at most {100 * pv.PASS['worst']:.0f}%: "
            f"{'pass' if passed['worst'] else 'MISS'})",
            "- order of the recipes at each shape (pairs more than 3% apart): "
            + ("pass" if passed["order"] else "MISS: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in
                                                                   r["order_misses"].items() if v)), ""]  # fmt: skip
  if r["target"] == "h200":
    lines += _h200_table(r)
  else:
    lines += _v5p_table(r)
  return "\n".join(lines) + "\n"


def _h200_table(r: dict) -> list[str]:
  rows = []
  for x in r["rows"]:
    band = f"[{x['band'][0]:.2f}, {x['band'][1]:.2f}]" if x.get("band") else ""
    extra = x.get("extra_vs_int8_rtne")
    where = ""
    if extra:
      top = sorted(extra["by_group_s"].items(), key=lambda kv: -abs(kv[1]))[:2]
      where = (
        f"{1e3 * extra['measured_s']:+.2f} / {1e3 * extra['predicted_s']:+.2f} ms ("
        + ", ".join(f"{GROUP_NAMES.get(g, g)} {1e3 * v:+.2f}" for g, v in top)
        + ")"
      )
    rows.append([x["shape"], x["recipe"] + (" (fitted)" if x["fitted"] else ""), f"{1e3 * x['measured_s']:.2f}",
                 f"{1e3 * x['predicted_s']:.2f}", f"{x['measured_speedup']:.2f}", f"{x['predicted_speedup']:.2f}",
                 band, _pct(x["error"]), where])  # fmt: skip
  head = ["shape", "recipe", "measured ms", "predicted ms", "measured x bf16", "predicted x bf16", "90% band",
          "error", "extra over int8_rtne: measured / predicted (largest groups)"]  # fmt: skip
  out = ["## Per shape and recipe (bf16: the measured revision's, backward GEMMs in f32)", "",
         markdown_table(head, rows, ["l", "l"] + ["r"] * 7), ""]  # fmt: skip
  q = r.get("quantizer")
  if q and q["rows"]:
    s = q["summary"]
    out += [
      f"## Quantizer programs (nothing fitted on them): median |error| {100 * s['median_abs']:.1f}%, worst "
      f"{100 * s['worst_abs']:.1f}% over {s['points']} (pass at most 25%: {'pass' if q['passed'] else 'MISS'})",
      "",
    ]
    ms = lambda v: f"{1e3 * v:.3f}"
    rows = [[x["shape"], x["program"], ms(x["measured_s"]), ms(x["predicted_s"]), _pct(x["error"])] for x in q["rows"]]
    out += [
      markdown_table(["shape", "program", "measured ms", "predicted ms", "error"], rows, ["l", "l", "r", "r", "r"])
    ]
  return out


def _v5p_table(r: dict) -> list[str]:
  rows = []
  for x in r["rows"]:
    label = x["recipe"] + (" (fitted)" if x["fitted"] else "")
    if "paper_speedup" in x:
      band = f"[{x['band'][0]:.2f}, {x['band'][1]:.2f}]" if x.get("band") else ""
      rows.append(
        [x["shape"], label, f"{x['paper_speedup']:.2f}", f"{x['predicted_speedup']:.2f}", band, _pct(x["error"])]
      )
    else:
      rows.append([x["shape"], label + " overhead over s3r", f"{x['paper_overhead_pct']:+.1f}%",
                   f"{x['predicted_overhead_pct']:+.1f}%", "", ""])  # fmt: skip
  head = ["shape", "recipe", "paper (Table III)", "predicted", "90% band", "error"]
  return ["## Per shape and recipe (speedup over bf16; S3R-EC rows: time over S3R)", "",
          markdown_table(head, rows, ["l", "l", "r", "r", "r", "r"])]  # fmt: skip


# --- predicted train steps --------------------------------------------------------------------


def _split_name(name: str) -> tuple[str, str]:
  """(model part, recipe) of a saved program name `<target>_<program...>_<recipe>`."""
  from s3r import recipe

  parts = name.split("_")
  for i in range(1, len(parts)):
    candidate = "_".join(parts[i:])
    try:
      recipe(candidate)
    except ValueError:
      continue
    return "_".join(parts[1:i]), candidate
  raise ValueError(f"{name}: no recipe at its end")


def _fit_of(path: pathlib.Path) -> pm.Fit:
  doc = json.loads(path.read_text())["results"]["fit"]
  return pm.Fit(constants=pm.Constants(**doc["constants"]), covariance=np.array(doc["covariance"]),
                residuals=np.zeros(doc["points"]), points=doc["points"])  # fmt: skip


def predict(kernels: pathlib.Path, fit_file: pathlib.Path, target: str, baseline: str) -> dict:
  """Predicted seconds per program and recipe, ratios against `baseline` (and the FP8 recipe) with bands."""
  meta, programs = pv.load_kernels(kernels)
  t, fit = pm.target(target), _fit_of(fit_file)
  c, draws = fit.constants, fit.draws()
  models: dict[str, dict] = defaultdict(dict)
  for name, ks in programs.items():
    model, rec = _split_name(name)
    models[model][rec] = ks
  out = []
  for model, recipes in sorted(models.items()):
    if baseline not in recipes or _deeper(model, models) is not None:
      continue  # a shallow program that a deeper one of the same model extends (see `_depth_pair`)
    pair = _depth_pair(model, models, t, c)
    seconds = (lambda ks, c_: pm.program_seconds(ks, t, c_)) if pair is None else pair[1]
    base = recipes[baseline]
    base_draws = np.array([seconds(base, d) for d in draws])
    for rec, ks in recipes.items():
      if pair is not None and rec not in pair[2]:
        continue
      secs = seconds(ks, c)
      ratio_draws = base_draws / np.array([seconds(ks, d) for d in draws])
      row = {"model": pair[0] if pair else model, "recipe": rec, "seconds": secs, "ratio": seconds(base, c) / secs,
             "band": [float(np.percentile(ratio_draws, 5)), float(np.percentile(ratio_draws, 95))],
             "breakdown_s": pm.breakdown(ks, t, c) if pair is None else pair[3](ks),
             "gemm_types": sorted({k.dtype for k in ks if k.kind == "gemm"})}  # fmt: skip
      if FP8_RECIPE in recipes and rec != FP8_RECIPE:
        row["ratio_vs_fp8"] = seconds(recipes[FP8_RECIPE], c) / secs
      # what if the int8 GEMMs ran as efficiently as the bf16 ones (an autotuned or cuBLASLt int8 GEMM)
      fast_s8 = dataclasses.replace(c, e_s8=c.e_bf16)
      row["ratio_if_s8_at_bf16_efficiency"] = seconds(base, fast_s8) / seconds(ks, fast_s8)
      if pair is not None:
        row["extrapolated_from"] = pair[4]
      out.append(row)
  return {"target": target, "baseline": baseline, "fit": fit_file.name, "kernels": meta, "rows": out}


_DEPTH_RE = re.compile(r"^(step_(?P<preset>[^_]+)_)L(?P<layers>\d+)(?P<rest>_.*)$")


def _deeper(model: str, models: dict) -> str | None:
  """The name of a deeper compiled program of the same preset and settings, if `model` is a shallow one."""
  m = _DEPTH_RE.match(model)
  if not m:
    return None
  for other in models:
    o = _DEPTH_RE.match(other)
    if o and o.group(1) == m.group(1) and o.group("rest") == m.group("rest") and int(o["layers"]) > int(m["layers"]):
      return other
  return None


def _depth_pair(model: str, models: dict, t: pm.Target, c: pm.Constants):
  """A model compiled at two depths l1 < l2 (its scanned blocks too large for one chip at the real depth) gives
  the real depth L by linear extrapolation: t(L) = t(l1) + (L - l1) / (l2 - l1) (t(l2) - t(l1)), kernel group by
  kernel group. Returns (name at depth L, seconds(kernels at l2, constants), recipes at both depths,
  breakdown(kernels at l2), the two depths), or None for a model compiled at one depth."""
  from s3r.model import presets

  m = _DEPTH_RE.match(model)
  shallow = next((o for o in models if o != model and _deeper(o, models) == model), None)
  low_m = _DEPTH_RE.match(shallow) if shallow is not None else None
  if not m or low_m is None or shallow is None:
    return None
  l2, l1 = int(m["layers"]), int(low_m["layers"])
  depth = presets.preset(m["preset"]).n_layers
  if depth == l2:
    return None
  w = (depth - l1) / (l2 - l1)
  low = models[shallow]
  partner = {id(ks): low[rec] for rec, ks in models[model].items() if rec in low}

  def seconds(ks, c_):
    return pm.program_seconds(partner[id(ks)], t, c_) * (1 - w) + pm.program_seconds(ks, t, c_) * w

  def groups(ks):
    a, b = pm.breakdown(partner[id(ks)], t, c), pm.breakdown(ks, t, c)
    return {g: a.get(g, 0.0) * (1 - w) + b.get(g, 0.0) * w for g in set(a) | set(b)}

  name = f"step_{m['preset']}_L{depth}{m['rest']}"
  return name, seconds, set(low) & set(models[model]), groups, [l1, l2]


def _paper_ratio(model: str, rec: str) -> float | None:
  name = next((m for m in PAPER_TABLE_IV_MS["bf16"] if model.startswith(f"step_{m}_")), None)
  if name is None or rec not in PAPER_TABLE_IV_MS:
    return None
  return PAPER_TABLE_IV_MS["bf16"][name] / PAPER_TABLE_IV_MS[rec][name]


def predict_markdown(r: dict) -> str:
  groups = [g for g in GROUP_ORDER if any(g in x["breakdown_s"] for x in r["rows"])]
  head = ["program", "recipe", "predicted ms", f"x {r['baseline']}", "90% band", "x bf16 if int8 GEMMs ran at e_bf16"]
  tpu = r["target"] == "v5p"
  head += ["paper (v5p, MaxText)", "error vs paper"] if tpu else ["x FP8 recipe"]
  head += [GROUP_NAMES.get(g, g) + " ms" for g in groups]
  rows = []
  for x in r["rows"]:
    row = [
      x["model"],
      x["recipe"],
      _ms(x["seconds"]),
      f"{x['ratio']:.2f}",
      f"[{x['band'][0]:.2f}, {x['band'][1]:.2f}]",
      f"{x['ratio_if_s8_at_bf16_efficiency']:.2f}",
    ]
    if tpu:
      paper = _paper_ratio(x["model"], x["recipe"])
      row += ["", ""] if paper is None else [f"{paper:.3f}", _pct(x["ratio"] / paper - 1)]
    else:
      row += ["" if x.get("ratio_vs_fp8") is None else f"{x['ratio_vs_fp8']:.2f}"]
    rows.append(row + [_ms(x["breakdown_s"].get(g, 0.0)) for g in groups])
  title = pm.target(r["target"]).title
  return (f"Predicted by the model (not measured) for {title}, constants fitted in {r['fit']}.\n\n"
          + markdown_table(head, rows, ["l", "l"] + ["r"] * (len(head) - 2)) + "\n")  # fmt: skip


def chart(r: dict, path: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = r["rows"]
  groups = [g for g in GROUP_ORDER if any(g in x["breakdown_s"] for x in rows)]
  fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(rows)), 5))
  bottom = np.zeros(len(rows))
  cmap = plt.get_cmap("tab20")
  for i, g in enumerate(groups):
    v = np.array([1e3 * x["breakdown_s"].get(g, 0.0) for x in rows])
    ax.bar(range(len(rows)), v, bottom=bottom, label=GROUP_NAMES.get(g, g), color=cmap(i))
    bottom += v
  ax.set_xticks(range(len(rows)), [f"{x['model'].split('_')[1]} {x['recipe']}" for x in rows], rotation=75, fontsize=7)
  ax.set_ylabel("predicted ms per call")
  ax.set_title(f"Predicted time on {pm.target(r['target']).title}, by kernel group (a model, not measured)")
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def doc_table_h200(r: dict) -> str:
  """The H200 validation as docs/speed-model.md shows it: measured / predicted speedup over bf16 (f32 backward)."""
  recipes = [x for x in ("int8_rtne", "int8_sr", "s3r", "s3r_ec", "s3r_ec_dx")]
  by = {(x["shape"], x["recipe"]): x for x in r["rows"]}
  rows = []
  for shape in pv.SHAPES:
    cells = []
    for rec in recipes:
      x = by[(shape, rec)]
      mark = " (fit)" if x["fitted"] else f" ({_pct(x['error'])})"
      cells.append(f"{x['measured_speedup']:.2f} / {x['predicted_speedup']:.2f}{mark}")
    rows.append([shape, *cells])
  s, q = r["summary"], r["quantizer"]["summary"]
  table = markdown_table(["shape", *recipes], rows, ["l"] + ["r"] * len(recipes))
  verdict = lambda ok: "pass" if ok else "miss"
  order = verdict(r["passed"]["order"])
  if not r["passed"]["order"]:
    order += " (" + "; ".join(f"{k}: {', '.join(v)}" for k, v in r["order_misses"].items() if v) + ")"
  head = "Measured / predicted speedup over `bf16` (f32 backward), error of the prediction in brackets."
  return (f"{head}\n\n{table}\n\n"
          f"Held out ({s['points']} ratios): median error {100 * s['median_abs']:.1f}% (rule: at most 7%, "
          f"{verdict(r['passed']['median'])}), worst {100 * s['worst_abs']:.1f}% (rule: at most 15%, "
          f"{verdict(r['passed']['worst'])}), order of the recipes {order}. Quantizer programs: median error "
          f"{100 * q['median_abs']:.0f}%, worst {100 * q['worst_abs']:.0f}% (rule: median at most 25%, "
          f"{verdict(r['quantizer']['passed'])}).")  # fmt: skip


def doc_table_v5p(r: dict) -> str:
  """The v5p validation as docs/speed-model.md shows it: the paper's / predicted speedup over bf16, and the
  S3R-EC overheads over S3R."""
  by = {(x["shape"], x["recipe"]): x for x in r["rows"]}
  rows = []
  for shape in pv.SHAPES:
    cells = []
    for rec in pv.V5P_SPEEDUPS:
      x = by[(shape, rec)]
      mark = " (fit)" if x["fitted"] else f" ({_pct(x['error'])})"
      cells.append(f"{x['paper_speedup']:.2f} / {x['predicted_speedup']:.2f}{mark}")
    for rec in pv.V5P_OVERHEADS:
      x = by[(shape, rec)]
      cells.append(f"{x['paper_overhead_pct']:+.1f} / {x['predicted_overhead_pct']:+.1f}")
    rows.append([shape, *cells])
  head = ["shape", *pv.V5P_SPEEDUPS, *(f"{x} over s3r, %" for x in pv.V5P_OVERHEADS)]
  s = r["summary"]
  verdict = lambda ok: "pass" if ok else "miss"
  order = verdict(r["passed"]["order"])
  if not r["passed"]["order"]:
    order += " (" + "; ".join(f"{k}: {', '.join(v)}" for k, v in r["order_misses"].items() if v) + ")"
  return (f"Paper (Table III) / predicted, error of the prediction in brackets; W3 and W9 fitted.\n\n"
          f"{markdown_table(head, rows, ['l'] + ['r'] * (len(head) - 1))}\n\n"
          f"Held out ({s['points']} speedups): median error {100 * s['median_abs']:.1f}% (rule: at most 7%, "
          f"{verdict(r['passed']['median'])}), worst {100 * s['worst_abs']:.1f}% (rule: at most 15%, "
          f"{verdict(r['passed']['worst'])}), order {order}.")  # fmt: skip


def doc_table_steps(results: dict[str, dict]) -> str:
  """Predicted train-step speedups over bf16 per model and recipe on each target (docs/speed-model.md)."""
  targets = list(results)
  by = {(t, x["model"], x["recipe"]): x for t, r in results.items() for x in r["rows"]}
  keys = sorted({(x["model"], x["recipe"]) for r in results.values() for x in r["rows"]},
                key=lambda k: (k[0], GROUP_ORDER.index("other"), k[1]))  # fmt: skip
  head = ["model", "recipe", *(f"{pm.target(t).title.split(' (')[0]}" for t in targets), "paper (v5p, measured)"]
  rows = []
  for model, rec in keys:
    cells = []
    for t in targets:
      x = by.get((t, model, rec))
      cells.append("" if x is None else f"{x['ratio']:.2f} [{x['band'][0]:.2f}, {x['band'][1]:.2f}]")
    paper = _paper_ratio(model, rec)
    name = model.removeprefix("step_").split("_L")[0]
    rows.append([name, rec, *cells, "" if paper is None else f"{paper:.2f}"])
  return (f"Predicted speedup over `bf16` of one train step [90% band of the constants]; not measured.\n\n"
          f"{markdown_table(head, rows, ['l', 'l'] + ['r'] * (len(head) - 2))}")  # fmt: skip


def doc_table_ffn(r: dict, recipe: str = "s3r_ec_dx") -> str:
  """The FFN block's predicted speedup over today's bf16 per shape (docs/speed-model.md and the README)."""
  rows = []
  for x in r["rows"]:
    if x["recipe"] != recipe:
      continue
    shape = x["model"].split("_")[1]
    rows.append([shape, f"{x['ratio']:.2f} [{x['band'][0]:.2f}, {x['band'][1]:.2f}]",
                 f"{x['ratio_if_s8_at_bf16_efficiency']:.2f}"])  # fmt: skip
  head = ["shape", f"`{recipe}` x `bf16` [90% band]", "if the int8 GEMMs ran at e_bf16"]
  return markdown_table(head, rows, ["l", "r", "r"])


def ratio_span(r: dict, recipe: str, key: str = "ratio", models: tuple[str, ...] = ()) -> tuple[float, float]:
  """(min, max) of a predicted ratio of `recipe` over the rows (of `models`, when given)."""
  values = [x[key] for x in r["rows"] if x["recipe"] == recipe and (not models or any(m in x["model"] for m in models))]
  return min(values), max(values)
