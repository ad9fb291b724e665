"""Tables, checks, depth extrapolation and chart of `python -m benchmarks step`, beside the paper's Table IV.

A configuration is one preset at one depth L (number of blocks). Depth extrapolation: every block
of a preset has the same shapes (Gemma 3: every group of `global_every` blocks), so a step's
time is T(L) = T0 + L * t_layer, where T0 is the depth-independent part (embedding, logits,
loss, their optimizer update) and t_layer the time of one block's forward, recomputation,
backward and update. Two or more depths of one preset give T0 and t_layer (least squares) and
the full-depth estimate T(L_full). The check of the line: T0's share of the step at the smallest
depth is compared with the share of the depth-independent FLOPs in XLA's cost analysis of the
same programs (a superlinear time, e.g. from memory pressure at the larger depth, drives the
time intercept below the FLOP one); with three or more depths the residuals of the fit are
reported as well.
"""

from __future__ import annotations

import numpy as np

from labtools.paper import PAPER_TABLE_IV_FAMILY, PAPER_TABLE_IV_MODELS, PAPER_TABLE_IV_MS
from labtools.results import bar_chart, fmt_ms, fmt_ratio, markdown_table

MIB = 2**20
INT8_RECIPES = ("int8_rtne", "int8_sr", "s3r", "s3r_ec", "s3r_ec_dx")


def _label(c: dict) -> str:
  return f"{c['model']['preset']} L{c['model']['n_layers']}"


def _timed(results: dict) -> list[dict]:
  return [c for c in results["configs"] if "skipped" not in c]


def _median(c: dict, r: str) -> float:
  """The median step time of recipe `r` in configuration `c` (which has it)."""
  return c["recipes"][r]["timing"]["median_s"]


def _fit(depths: list[int], values: list[float]) -> tuple[float, float]:
  slope, intercept = np.polyfit(np.asarray(depths, float), np.asarray(values, float), 1)
  return float(intercept), float(slope)


def extrapolate(results: dict) -> dict:
  """Per preset measured at two or more depths: per recipe T0, t_layer and T(L_full), the speedups at
  full depth and per layer, and the linearity check (see the module docstring)."""
  out = {}
  by_preset: dict[str, list[dict]] = {}
  for c in _timed(results):
    by_preset.setdefault(c["model"]["preset"], []).append(c)
  for preset, cs in by_preset.items():
    depths = sorted({c["model"]["n_layers"] for c in cs})
    if len(depths) < 2:
      continue
    cs = sorted(cs, key=lambda c: c["model"]["n_layers"])
    full = cs[0]["model"]["full_n_layers"]
    recipes = [r for r in cs[0]["recipes"] if all(r in c["recipes"] for c in cs)]
    per = {}
    for r in recipes:
      times = [_median(c, r) for c in cs]
      t0, t_layer = _fit(depths, times)
      fit = [t0 + t_layer * d for d in depths]
      entry = {
        "fixed_s": t0,
        "per_layer_s": t_layer,
        "full_depth_s": t0 + t_layer * full,
        "max_residual": max(abs(f / t - 1) for f, t in zip(fit, times)) if len(depths) > 2 else None,
        "fixed_share_time": t0 / times[0],
      }
      fl = [c["recipes"][r].get("flops") for c in cs]
      if all(fl):
        f0, _ = _fit(depths, fl)
        entry["fixed_share_flops"] = f0 / fl[0]
      per[r] = entry
    for e in per.values():
      for ref in ("bf16", "int8_sr"):
        if ref in per:
          e[f"full_speedup_vs_{ref}"] = per[ref]["full_depth_s"] / e["full_depth_s"]
          e[f"per_layer_speedup_vs_{ref}"] = per[ref]["per_layer_s"] / e["per_layer_s"]
    out[preset] = {"depths": depths, "full_n_layers": full, "recipes": per}
  return out


def checks(c: dict) -> dict:
  """The targets of one configuration: s3r_ec_dx vs bf16 and int8_sr, s3r vs int8_rtne, INT8 memory vs bf16."""
  rec, out = c["recipes"], {}
  if "s3r_ec_dx" in rec:
    out["s3r_ec_dx_vs_bf16"] = rec["s3r_ec_dx"].get("speedup_vs_bf16")
    out["s3r_ec_dx_vs_int8_sr"] = rec["s3r_ec_dx"].get("speedup_vs_int8_sr")
    out["s3r_ec_dx_vs_int8_sr_paired"] = rec["s3r_ec_dx"].get("speedup_vs_int8_sr_paired")
  if "s3r" in rec and "int8_rtne" in rec:
    out["s3r_over_int8_rtne"] = _median(c, "s3r") / _median(c, "int8_rtne")
  bf16_mem = rec.get("bf16", {}).get("memory", {}).get("total")
  mems = {r: rec[r]["memory"]["total"] for r in INT8_RECIPES if r in rec and rec[r].get("memory")}
  if bf16_mem and mems:
    worst = max(mems, key=lambda r: mems[r])
    out["max_int8_memory_over_bf16"] = mems[worst] / bf16_mem
    out["max_int8_memory_recipe"] = worst
  return out


def summarize(results: dict) -> None:
  """Adds `checks` to every timed configuration and `extrapolation` to `results` (in place)."""
  for c in _timed(results):
    c["checks"] = checks(c)
  results["extrapolation"] = extrapolate(results)


def _config_table(c: dict) -> str:
  rows = []
  for r, row in c["recipes"].items():
    t, m = row["timing"], row.get("memory", {})
    rows.append(
      [
        r,
        fmt_ms(t["median_s"]),
        fmt_ms(t["iqr_s"]),
        f"{row['tokens_per_s']:,.0f}",
        fmt_ratio(row.get("speedup_vs_bf16")),
        fmt_ratio(row.get("speedup_vs_int8_sr")),
        *(f"{m[k] / MIB:,.1f}" if k in m else "n/a" for k in ("temp", "argument", "output", "total")),
        f"{row['compile_s']:.1f}",
      ]
    )
  head = [
    "recipe",
    "median ms",
    "IQR ms",
    "tokens/s",
    "vs bf16",
    "vs int8_sr",
    "temp MiB",
    "args MiB",
    "out MiB",
    "total MiB",
    "compile s",
  ]
  return markdown_table(head, rows)


def _table_iv(results: dict) -> str:
  cs = _timed(results)
  recipes = list(dict.fromkeys(r for c in cs for r in c["recipes"]))
  rows = []
  for r in recipes:
    cells = []
    for c in cs:
      t = _median(c, r) if r in c["recipes"] else None
      s = c["recipes"].get(r, {}).get("speedup_vs_bf16")
      cells.append("n/a" if t is None else f"{fmt_ms(t)} ({fmt_ratio(s, 3)}x)" if r != "bf16" else fmt_ms(t))
    rows.append([r, *cells])
  for r in ("s3r", "s3r_ec", "s3r_ec_dx"):
    if r in recipes and "int8_sr" in recipes:
      rows.append([f"{r} over int8_sr", *(fmt_ratio(c["recipes"][r].get("speedup_vs_int8_sr"), 3) + "x" for c in cs)])
  return markdown_table(["recipe (ms, x bf16)", *map(_label, cs)], rows)


def _paper_table_iv(models: list[str]) -> str:
  t = PAPER_TABLE_IV_MS
  rows = [
    [r, *(f"{t[r][m]:.0f}" + ("" if r == "bf16" else f" ({t['bf16'][m] / t[r][m]:.3f}x)") for m in models)] for r in t
  ]
  rows += [
    [f"{r} over int8_sr", *(f"{t['int8_sr'][m] / t[r][m]:.3f}x" for m in models)]
    for r in ("s3r", "s3r_ec", "s3r_ec_dx")
  ]
  return markdown_table(["recipe (ms, x bf16)", *models], rows)


def _checks_table(results: dict) -> str:
  rows = []
  for c in _timed(results):
    k = c.get("checks", {})
    mem = k.get("max_int8_memory_over_bf16")
    rows.append(
      [
        _label(c),
        fmt_ratio(k.get("s3r_ec_dx_vs_bf16"), 3),
        fmt_ratio(k.get("s3r_ec_dx_vs_int8_sr"), 3),
        fmt_ratio(k.get("s3r_ec_dx_vs_int8_sr_paired"), 3),
        fmt_ratio(k.get("s3r_over_int8_rtne"), 3),
        "n/a" if mem is None else f"{mem:.3f} ({k['max_int8_memory_recipe']})",
      ]
    )
  head = [
    "configuration",
    "s3r_ec_dx vs bf16",
    "s3r_ec_dx vs int8_sr",
    "(paired)",
    "s3r / int8_rtne time",
    "max INT8 memory / bf16",
  ]
  return markdown_table(head, rows)


def _extrapolation_table(results: dict) -> str:
  out = []
  for preset, e in results.get("extrapolation", {}).items():
    rows = []
    for r, x in e["recipes"].items():
      rows.append(
        [
          r,
          fmt_ms(x["fixed_s"]),
          fmt_ms(x["per_layer_s"]),
          fmt_ms(x["full_depth_s"]),
          fmt_ratio(x.get("full_speedup_vs_bf16"), 3),
          fmt_ratio(x.get("full_speedup_vs_int8_sr"), 3),
          fmt_ratio(x.get("per_layer_speedup_vs_bf16"), 3),
          f"{x['fixed_share_time']:.3f}",
          fmt_ratio(x.get("fixed_share_flops"), 3),
          "n/a" if x["max_residual"] is None else f"{x['max_residual']:.3f}",
        ]
      )
    out += [
      f"### `{preset}`: depths {e['depths']} extrapolated to {e['full_n_layers']} layers",
      "",
      markdown_table(
        [
          "recipe",
          "T0 ms",
          "per layer ms",
          f"T({e['full_n_layers']}) ms",
          "vs bf16",
          "vs int8_sr",
          "per layer vs bf16",
          "T0 share (time)",
          "T0 share (FLOPs)",
          "max residual",
        ],
        rows,
      ),
    ]
  return "\n".join(out)


def markdown(results: dict) -> str:
  cs = results["configs"]
  mesh = ",".join(f"{k}={v}" for k, v in results["mesh"].items())
  att = sorted({c["model"].get("attention_impl") for c in cs if c["model"].get("attention_impl")})
  out = [
    f"## Full training step per recipe: B={results['batch']}, S={results['seq']}"
    + (f" in {results['grad_accum']} microbatches" if results.get("grad_accum", 1) > 1 else "")
    + f", remat={results['remat']}, "
    f"mesh {mesh}, attention {'/'.join(att) or 'n/a'}",
    "",
    "Median step time after warm-up, recipes interleaved; speedups from the same run. Memory: XLA's "
    "compile-time estimate per device (`compiled.memory_analysis()`); total = arguments + outputs - donated "
    "aliases + temporaries.",
    "",
  ]
  if _timed(results):
    out += ["### Step time (Table IV layout)", "", _table_iv(results), "### Targets", "", _checks_table(results)]
  models = list(dict.fromkeys(PAPER_TABLE_IV_FAMILY[c["model"]["family"]] for c in _timed(results)))
  models = [m for m in PAPER_TABLE_IV_MODELS if m in models]
  if models:
    out += [
      "### The paper's Table IV (TPU v5p, 4 x 4096 tokens per chip, full remat, flash attention; ms)",
      "",
      _paper_table_iv(models),
    ]
  if results.get("extrapolation"):
    out += ["## Depth extrapolation", "", _extrapolation_table(results)]
  for c in cs:
    m = c["model"]
    if "skipped" in c:
      out += [f"## `{m['preset']}`, {m.get('n_layers')} layers: skipped ({c['skipped']})", ""]
      continue
    out += [
      f"## `{m['preset']}` ({m['family']}), {m['n_layers']} of {m['full_n_layers']} layers, "
      f"{m['params']:,} parameters ({m['active_params']:,} active), d_model {m['d_model']}, vocab "
      f"{m['vocab_size']}, attention {m['attention_impl']}"
      + (f" ({m['attention_note']})" if m.get("attention_note") else ""),
      "",
      _config_table(c),
    ]
  return "\n".join(out) + "\n"


def chart(results: dict, path) -> None:
  """Speedup vs bf16 per configuration and recipe, and the paper's Table IV for the same families."""
  cs = _timed(results)
  recipes = list(dict.fromkeys(r for c in cs for r in c["recipes"]))
  models = [m for m in PAPER_TABLE_IV_MODELS if m in {PAPER_TABLE_IV_FAMILY[c["model"]["family"]] for c in cs}]
  groups = [*map(_label, cs), *(f"paper {m}" for m in models)]
  t = PAPER_TABLE_IV_MS
  series = {
    r: [c["recipes"].get(r, {}).get("speedup_vs_bf16") for c in cs]
    + [t["bf16"][m] / t[r][m] if r in t else None for m in models]
    for r in recipes
  }
  bar_chart(
    path,
    groups,
    series,
    ylabel="step speedup vs bf16",
    hline=1.0,
    title=f"Training step, B={results['batch']}, S={results['seq']}, remat={results['remat']}",
  )
