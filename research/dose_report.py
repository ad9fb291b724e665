"""The dose-response study's summary (`dose.json`), report (`dose.md`) and plot (`dose.png`).

`summarize` turns the finished arms (one lockstep summary per gradient grid and seed) into paired
differences of final validation loss to the baseline (`int8_sr` at the same grid and seed) and the
measured *excess*: e²(recipe) − e²(baseline) of the relative dW error of block 0, both errors
measured on the baseline model's final parameters of that arm (`dose_same_params`), so that the
difference is the excess variance the recipe's rounding adds on one set of parameters. The plot
puts every recipe x grid x seed at (excess, gap), with reference points of the paper and of this
repository's 400-step sweep.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np

from labtools import paper
from labtools import results as provenance
from research.dose_paired import BASELINE, METRIC, long_arm_points, mean_sd
from research.dose_paired import fmt as _fmt
from s3r.quant import formats

SLOPE_BAND = (0.47, 0.76)  # the hypothesis: loss per unit excess (research/results/dose/PREDICTIONS.md)
SLOPE_RECIPES = ("s3r", "s3r_ec_dx")  # stochastic recipes, whose excess is a variance (RTNE's error is a bias)
MARKERS = {"int8_rtne": "s", "s3r": "o", "s3r_ec_dx": "^"}
GRID_COLOURS = {
  "int8": "tab:blue",
  "int6": "tab:orange",
  "int4": "tab:red",
  "nvfp4": "tab:purple",
  "mxfp4": "tab:green",
  "e4m3": "tab:brown",
  "e5m2": "tab:olive",
}
REFERENCE_GRID = "int8"  # equal-bits comparisons: each recipe at another grid against itself at int8


def base_name(recipe: str) -> str:
  """`s3r@int6` -> `s3r`."""
  return recipe.partition("@")[0]


def grid_label(grid: str) -> str:
  """`int6` -> `int6 (Q = 31)`; FP4 grids name their block scale, FP8 grids their dtype."""
  f = formats.get_format(grid)
  if f.grid == "uniform":
    return f"{grid} (Q = {f.qmax})"
  if isinstance(f, formats.FloatFormat):
    return f"{grid} ({f.code_dtype.name}, largest value {f.qmax})"
  assert isinstance(f, formats.E2M1Format)
  return f"{grid} (E2M1, {f.block_scale.upper()} scales per {f.block} x {f.block} block)"


# --- one arm ---------------------------------------------------------------------------------------


def _final(curve: list) -> float | None:
  return curve[-1] if curve else None


def _diff(a: float | None, b: float | None) -> float | None:
  return None if a is None or b is None else a - b


def arm_result(grid: str, seed: int, summary: dict, baseline: str = BASELINE) -> dict:
  """One arm's final losses, paired differences to the baseline and excess, by base recipe name."""
  recipes = {base_name(r): r for r in summary["config"]["recipes"]}
  curves = summary["curves"]
  val = {b: _final(curves["val"][r]) for b, r in recipes.items()}
  c4 = {b: _final(curves["val_c4"][r]) for b, r in recipes.items()} if "val_c4" in curves else None
  same = (summary.get("dose_same_params") or {}).get("errors") or {}
  own = summary.get("dose") or {}
  e2 = {b: same[r][METRIC] ** 2 for b, r in recipes.items() if r in same}
  e2_own = {b: own[r][METRIC] ** 2 for b, r in recipes.items() if r in own}
  meta = summary.get("meta", {})
  return {
    "grid": grid,
    "seed": seed,
    "recipes": recipes,
    "steps_done": summary["steps_done"],
    "val": val,
    "c4": c4,
    "gap": {b: _diff(v, val[baseline]) for b, v in val.items() if b != baseline},
    "errors_same_params": {b: same[r] for b, r in recipes.items() if r in same},
    "params_of": (summary.get("dose_same_params") or {}).get("params_of"),
    "errors_own_params": {b: own[r] for b, r in recipes.items() if r in own},
    "e2_baseline": e2.get(baseline),
    "excess": {b: e2[b] - e2[baseline] for b in e2 if b != baseline} if baseline in e2 else {},
    "excess_own_params": {b: e2_own[b] - e2_own[baseline] for b in e2_own if b != baseline}
    if baseline in e2_own
    else {},
    "iteration_s_median": summary.get("iteration_s_median"),
    "meta": {
      "revision": (meta.get("git") or {}).get("revision"),
      "dirty_paths": (meta.get("git") or {}).get("dirty_paths"),
      **{k: meta.get(k) for k in ("jax_version", "cpu_model", "loadavg_before", "loadavg_after", "date_utc")},
    },
  }


# --- over arms -------------------------------------------------------------------------------------


def by_grid(arms: list[dict], baseline: str = BASELINE) -> dict:
  """{grid: {recipe: per-seed gaps and excesses with their mean and sd}}."""
  out: dict = {}
  for arm in arms:
    for recipe in arm["gap"]:
      row = out.setdefault(arm["grid"], {}).setdefault(recipe, {"seeds": [], "gap": [], "excess": []})
      row["seeds"].append(arm["seed"])
      row["gap"].append(arm["gap"][recipe])
      row["excess"].append(arm["excess"].get(recipe))
  for rows in out.values():
    for row in rows.values():
      row["gap_mean"], row["gap_sd"] = mean_sd(row["gap"])
      row["excess_mean"], row["excess_sd"] = mean_sd(row["excess"])
  return out


def against_grid(arms: list[dict], reference: str = REFERENCE_GRID) -> dict:
  """{grid: {recipe: per-seed and mean ± sd of final validation loss at `grid` minus the same recipe's
  at `reference`}}, seed by seed over the seeds with an arm at both grids (same initialization, batches
  and quantizer keys; only the gradient grid differs). Empty without arms of `reference`."""
  ref = {a["seed"]: a for a in arms if a["grid"] == reference}
  out: dict = {}
  for arm in arms:
    base = ref.get(arm["seed"])
    if arm["grid"] == reference or base is None:
      continue
    for recipe, v in arm["val"].items():
      if base["val"].get(recipe) is None or v is None:
        continue
      row = out.setdefault(arm["grid"], {}).setdefault(recipe, {"seeds": [], "diff": []})
      row["seeds"].append(arm["seed"])
      row["diff"].append(v - base["val"][recipe])
  for rows in out.values():
    for row in rows.values():
      row["diff_mean"], row["diff_sd"] = mean_sd(row["diff"])
  return out


def points(arms: list[dict]) -> list[dict]:
  """Every (recipe, grid, seed) with both a gap and an excess: the plot's points."""
  return [
    {"recipe": r, "grid": a["grid"], "seed": a["seed"], "excess": a["excess"][r], "gap": a["gap"][r]}
    for a in arms
    for r in a["gap"]
    if a["gap"][r] is not None and a["excess"].get(r) is not None
  ]


def _standard_error(se: float | None) -> str:
  return "" if se is None else f", standard error {se:.2f}"


def slope_through_origin(pts: list[dict], recipes: tuple[str, ...] = SLOPE_RECIPES) -> dict | None:
  """Least-squares gap = k x excess over the stochastic recipes' points (None without any), with
  its standard error from the residuals (None from a single point): points whose excesses sit near
  zero leave k undetermined, and the error says so."""
  used = [p for p in pts if p["recipe"] in recipes]
  sxx = sum(p["excess"] ** 2 for p in used)
  if not used or sxx == 0:
    return None
  k = sum(p["excess"] * p["gap"] for p in used) / sxx
  n = len(used)
  se = None if n < 2 else math.sqrt(sum((p["gap"] - k * p["excess"]) ** 2 for p in used) / (n - 1) / sxx)
  recipes_used = list(dict.fromkeys(p["recipe"] for p in used))
  return {"k": k, "se": se, "n": n, "recipes": recipes_used, "hypothesis": SLOPE_BAND}


def reference_points(results_root: pathlib.Path = provenance.REPO_ROOT / "research" / "results") -> list[dict]:
  """(excess, gap to int8_sr) points from elsewhere: the paper's Table I gaps with its Table II dW
  errors (labtools/paper.py), and this repository's 400-step sweep (research/results/table1.json) with its
  Table II on the step-400 checkpoint (research/results/table2.json); those files absent, their points too."""

  def point(recipe, source, dw, dw_base, gap):
    return {"recipe": recipe, "source": source, "excess": dw**2 - dw_base**2, "gap": gap}

  dw = {r: v[2] for r, v in paper.PAPER_TABLE2.items()}
  out = [
    point(r, "paper (Tables I and II)", dw[r], dw[BASELINE], paper.paper_diff(r, BASELINE))
    for r in ("s3r", "s3r_ec_bcast")
  ]
  t1, t2 = results_root / "table1.json", results_root / "table2.json"
  if t1.is_file() and t2.is_file():
    rows = json.loads(t1.read_text())["rows"]
    errors = json.loads(t2.read_text())["relative_error"]
    for r in ("s3r_bcast", "s3r_ec_dx_bcast"):
      if r in rows and r in errors and BASELINE in rows and BASELINE in errors:
        gap = rows[r]["val_mean"] - rows[BASELINE]["val_mean"]
        out.append(
          point(
            r,
            "400-step sweep (research/results/table1.json, table2.json)",
            errors[r][METRIC],
            errors[BASELINE][METRIC],
            gap,
          )
        )
  return out


def summarize(config: dict, arms: list[dict], *, missing: list[str], meta: dict, baseline: str = BASELINE) -> dict:
  """The study's summary: every finished arm, the per-grid table, the plot's points and references."""
  pts = points(arms)
  return {
    "meta": meta,
    "config": config,
    "baseline": baseline,
    "metric": METRIC,
    "excess_definition": f"e²(recipe) − e²({baseline}) of the {METRIC} relative error, both on the final "
    f"parameters of the arm's {baseline} model",
    "arms": arms,
    "missing_arms": missing,
    "grids": by_grid(arms, baseline),
    "against_grid": {"reference": REFERENCE_GRID, "grids": against_grid(arms)},
    "points": pts,
    "slope": slope_through_origin(pts),
    "reference_points": reference_points() + long_arm_points(),
  }


# --- report ----------------------------------------------------------------------------------------


def _mean_cell(row: dict, key: str, spec: str) -> str:
  mean, sd = row[f"{key}_mean"], row[f"{key}_sd"]
  return _fmt(mean, spec) + ("" if sd is None else f" ± {sd:.3f}")


def grid_table(grid: str, rows: dict, arms: list[dict], baseline: str) -> list[str]:
  """One grid's table: per seed and the mean ± sd, each recipe's gap to the baseline beside its excess."""
  recipes = [r for r in ("s3r", "s3r_ec_dx", "int8_rtne") if r in rows] + [
    r for r in rows if r not in ("s3r", "s3r_ec_dx", "int8_rtne")
  ]
  head = " | ".join(f"`{r}` − `{baseline}` | excess" for r in recipes)
  lines = [f"### {grid_label(grid)}", "", f"| seed | {head} | e²(`{baseline}`) |"]
  lines.append("| --- |" + " --: | --: |" * len(recipes) + " --: |")
  e2_base = {a["seed"]: a["e2_baseline"] for a in arms if a["grid"] == grid}
  for i, seed in enumerate(rows[recipes[0]]["seeds"]):
    cells = [f"{_fmt(rows[r]['gap'][i])} | {_fmt(rows[r]['excess'][i], '+.4f')}" for r in recipes]
    lines.append(f"| {seed} | " + " | ".join(cells) + f" | {_fmt(e2_base.get(seed), '.4f')} |")
  means = [f"{_mean_cell(rows[r], 'gap', '+.3f')} | {_mean_cell(rows[r], 'excess', '+.4f')}" for r in recipes]
  return lines + ["| mean ± sd | " + " | ".join(means) + " | |", ""]


def against_grid_table(summary: dict) -> list[str]:
  """Each recipe at each grid against itself at the reference grid, seed by seed and mean ± sd."""
  cross = summary.get("against_grid") or {}
  if not cross.get("grids"):
    return []
  ref = cross["reference"]
  lines = [
    f"## Against `{ref}`, recipe by recipe",
    "",
    f"Final validation loss at each grid minus the same recipe's at `{ref}`, in the `{ref}` arm of the same "
    "seed (same initialization, batches and quantizer keys; only the gradient grid differs). The arms may "
    "come from different revisions (table of arms).",
    "",
  ]
  for grid, rows in cross["grids"].items():
    recipes = list(rows)
    seeds = sorted({s for r in rows.values() for s in r["seeds"]})
    lines += [f"| `{grid}` − `{ref}` | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± sd |"]
    lines.append("| --- |" + " --: |" * (len(seeds) + 1))
    for r in recipes:
      by_seed = dict(zip(rows[r]["seeds"], rows[r]["diff"]))
      cells = " | ".join(_fmt(by_seed.get(s)) for s in seeds)
      lines.append(f"| `{r}` | {cells} | {_mean_cell(rows[r], 'diff', '+.3f')} |")
    lines.append("")
  return lines


def arms_table(arms: list[dict]) -> list[str]:
  """Every finished arm: final validation losses, iteration time and provenance."""
  recipes = list(dict.fromkeys(r for a in arms for r in a["val"]))
  lines = [
    "| arm | steps | "
    + " | ".join(f"`{r}`" for r in recipes)
    + " | s/iteration | revision | date (UTC) | load before → after |"
  ]
  lines.append("| --- | --: |" + " --: |" * len(recipes) + " --: | --- | --- | --- |")
  for a in arms:
    m = a["meta"]
    rev = (m["revision"] or "unknown")[:8] + (
      " (dirty: " + ", ".join(m["dirty_paths"]) + ")" if m["dirty_paths"] else ""
    )
    vals = " | ".join(_fmt(a["val"].get(r), ".4f") for r in recipes)
    load = f"{m['loadavg_before']} → {m['loadavg_after']}"
    lines.append(
      f"| {a['grid']}-s{a['seed']} | {a['steps_done']} | {vals} | {_fmt(a['iteration_s_median'], '.2f')} | "
      f"`{rev}` | {m['date_utc']} | {load} |"
    )
  return lines + [""]


def markdown(summary: dict) -> str:
  """The report: settings, one table per grid (gap beside excess), the arms, the references and the slope."""
  cfg, baseline = summary["config"], summary["baseline"]
  lines = [
    "# Dose response: loss gap to `int8_sr` against excess gradient variance, by gradient grid",
    "",
    provenance.metadata_lines(summary["meta"], {}),
    f"- lockstep runs of {', '.join(f'`{r}`' for r in cfg['recipes'])} at each grid, on `{cfg['preset']}`: "
    f"{cfg['steps']} steps (warm-up {cfg['warmup']}), lr {cfg['lr']}, batch {cfg['batch']} x seq {cfg['seq']}, "
    f"validation every {cfg['eval_every']} steps on {cfg['eval_batches']} fixed batches; "
    f"{cfg['seeds']} seed(s) per grid",
    f"- gap: final validation loss minus `{baseline}`'s in the same arm (same initialization, batches and "
    f"quantizer keys); excess: {summary['excess_definition']}, over {cfg['dose_keys']} keys on "
    f"{cfg['dose_batch']} validation sequences",
    "",
  ]
  if summary["missing_arms"]:
    lines += [f"Not finished yet: {', '.join(summary['missing_arms'])}.", ""]
  if summary["grids"]:
    lines += ["## Gap and excess by grid", ""]
    for grid, rows in summary["grids"].items():
      lines += grid_table(grid, rows, summary["arms"], baseline)
    lines += against_grid_table(summary)
    lines += ["## Arms", "", *arms_table(summary["arms"])]
  slope = summary["slope"]
  if slope:
    lines += [
      f"Least-squares slope through the origin over the {slope['n']} points of "
      f"{', '.join(f'`{r}`' for r in slope['recipes'])}: {slope['k']:.2f} loss per unit excess"
      f"{_standard_error(slope.get('se'))} (hypothesis {slope['hypothesis'][0]}-{slope['hypothesis'][1]}).",
      "",
    ]
  if summary["reference_points"]:
    lines += ["## Reference points (plotted in grey)", "", "| recipe | source | excess | gap to `int8_sr` |"]
    lines += ["| --- | --- | --: | --: |"]
    for p in summary["reference_points"]:
      lines.append(f"| `{p['recipe']}` | {p['source']} | {p['excess']:.3f} | {p['gap']:+.3f} |")
    lines.append("")
  return "\n".join(lines)


ZOOM = (-0.15, 0.7)  # the right panel's excess range: INT8, int6, NVFP4 and the references


def _draw(ax, summary: dict, *, annotate: bool, legend: bool) -> None:
  """One panel: the points (marker by recipe, colour by grid), the references in grey, the band of
  the hypothesis and the fitted slope."""
  seen = set()
  for p in summary["points"]:
    label = f"{p['recipe']} @ {p['grid']}" if legend and (p["recipe"], p["grid"]) not in seen else None
    seen.add((p["recipe"], p["grid"]))
    colour = GRID_COLOURS.get(p["grid"], "k")
    ax.scatter(p["excess"], p["gap"], marker=MARKERS.get(p["recipe"], "x"), color=colour, label=label, zorder=3)
  for i, p in enumerate(summary["reference_points"]):
    ax.scatter(p["excess"], p["gap"], marker="*", s=120, color="0.55", zorder=2)
    if annotate:
      ax.annotate(f"{p['recipe']} ({p['source'].split(' (')[0]})", (p["excess"], p["gap"]), fontsize=7,
                  color="0.4", xytext=(6, 8 - 14 * (i % 3)), textcoords="offset points")  # fmt: skip
  xs = [p["excess"] for p in summary["points"] + summary["reference_points"]] or [1.0]
  x = np.linspace(min(0.0, min(xs)), max(max(xs), 1e-3) * 1.05, 200)
  lo, hi = SLOPE_BAND
  band = f"hypothesis: gap = {lo}-{hi} x excess" if legend else None
  ax.fill_between(x, lo * x, hi * x, color="0.85", alpha=0.6, label=band, zorder=1)
  if summary["slope"]:  # drawn over the measured excesses only, not extrapolated to the references
    fitted = [p["excess"] for p in summary["points"] if p["recipe"] in summary["slope"]["recipes"]]
    xf = np.linspace(min(0.0, min(fitted)), max(fitted), 200)
    fit = f"fit through 0: {summary['slope']['k']:.2f} x excess{_standard_error(summary['slope'].get('se'))}"
    fit = fit if legend else None
    ax.plot(xf, summary["slope"]["k"] * xf, "k--", lw=1, label=fit)
  ax.axhline(0, color="0.3", lw=0.6)
  ax.axvline(0, color="0.3", lw=0.6)
  ax.set_xlabel(f"excess e²(recipe) − e²({summary['baseline']}), dW block 0, same parameters")


def plot(summary: dict, path: pathlib.Path) -> bool:
  """The figure: gap against excess over every point (left) and over the small excesses of INT8, int6,
  NVFP4 and the references (right, `ZOOM`), which the int4 points would otherwise squeeze into a corner.
  False (and nothing written) without matplotlib."""
  try:
    import matplotlib
  except ImportError:
    return False
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax_all, ax_zoom) = plt.subplots(1, 2, figsize=(15, 5.5))
  _draw(ax_all, summary, annotate=False, legend=True)
  _draw(ax_zoom, summary, annotate=True, legend=False)
  ax_all.set_ylabel(f"final validation loss − {summary['baseline']} (same seed)")
  ax_all.set_title("every point (references: grey stars)", fontsize=9)
  fig.legend(fontsize=7, loc="center right")  # beside the panels: inside, it would hide points
  inside = [p["gap"] for p in summary["points"] + summary["reference_points"] if ZOOM[0] <= p["excess"] <= ZOOM[1]]
  ax_zoom.set_xlim(*ZOOM)
  ax_zoom.set_ylim(min([-0.1, *inside]) - 0.03, max([0.3, *inside]) + 0.05)
  ax_zoom.set_title(f"excess in [{ZOOM[0]}, {ZOOM[1]}]", fontsize=9)
  fig.suptitle("Dose response: loss gap against excess gradient variance")
  fig.tight_layout(rect=(0, 0, 0.86, 1))
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def write(results_dir: str | pathlib.Path, summary: dict, log=print) -> dict[str, pathlib.Path]:
  """Writes `<results_dir>/dose.json`, `dose.md` and (with matplotlib) `dose.png`."""
  out = pathlib.Path(results_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = {"json": provenance.write_json(out / "dose.json", summary), "md": out / "dose.md"}
  paths["md"].write_text(markdown(summary))
  if plot(summary, out / "dose.png"):
    paths["png"] = out / "dose.png"
  else:
    log("dose.png skipped: matplotlib is not installed (pip install -e '.[research]')")
  return paths
