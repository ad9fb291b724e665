"""Shared benchmark machinery: timing harness, run metadata, results files, tables, charts.

Timing on a shared, noisy CPU: every configuration of one run is compiled and warmed up
first, then the repeats are interleaved (every round times each configuration once, the
orders of the rounds forming a carryover-balanced design: see `balanced_orders`), so that slow
phases of the machine, and whatever one configuration leaves behind for the next, hit every
configuration alike.
Each configuration reports the median and the inter-quartile range of its repeats, and
ratios are only ever formed between configurations of the same run.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import platform as _platform
import random
import re
import subprocess
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

RESULTS_DIR = pathlib.Path("results")


# --- timing ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Timing:
  """Seconds per call of one configuration: all samples and their summary statistics."""

  name: str
  samples: list[float]
  compile_s: float = float("nan")

  @property
  def median(self) -> float:
    return float(np.median(self.samples)) if self.samples else float("nan")

  @property
  def q25(self) -> float:
    return float(np.percentile(self.samples, 25)) if self.samples else float("nan")

  @property
  def q75(self) -> float:
    return float(np.percentile(self.samples, 75)) if self.samples else float("nan")

  @property
  def iqr(self) -> float:
    return self.q75 - self.q25

  @property
  def min(self) -> float:
    return float(np.min(self.samples)) if self.samples else float("nan")

  def as_dict(self) -> dict[str, Any]:
    return {"median_s": self.median, "iqr_s": self.iqr, "q25_s": self.q25, "q75_s": self.q75,
            "min_s": self.min, "repeats": len(self.samples), "samples_s": self.samples,
            "compile_s": self.compile_s}


def block(tree):
  """Waits for every array in `tree` (jax.block_until_ready without importing jax here)."""
  import jax
  return jax.block_until_ready(tree)


def balanced_orders(n: int) -> list[list[int]]:
  """Orders of 0..n-1, one per round, in which every i comes right before every j != i
  equally often (a Williams design: n rounds for even n, 2n for odd n).

  Row 0 is 0, 1, n-1, 2, n-2, ...; row r adds r to every entry mod n; for odd n the reversed
  rows follow.
  """
  if n < 1:
    return [[]]
  first, lo, hi = [0], 1, n - 1
  while len(first) < n:
    first.append(lo)
    lo += 1
    if len(first) < n:
      first.append(hi)
      hi -= 1
  rows = [[(x + r) % n for x in first] for r in range(n)]
  return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def time_interleaved(configs: Mapping[str, tuple[Callable, tuple]], *, repeats: int = 5,
                     warmup: int = 1, number: int = 1, prime: int = 1, seed: int = 0,
                     log: Callable[[str], None] | None = None) -> dict[str, Timing]:
  """Times `fn(*args)` for every (fn, args) in `configs`, interleaving the repeats.

  Each fn should already be jitted. The first call (compile + run) is timed separately as
  `compile_s`; then `warmup` more untimed calls; then `repeats` rounds, each round calling
  every configuration once (each sample is the mean of `number` back-to-back calls), in the
  orders of `balanced_orders`, cycled.

  Each sample is preceded by `prime` untimed calls of the same configuration, and the balanced
  orders spread what remains: a configuration pays for what the one before it did to memory
  (after int8_sr, hundreds of MiB of temporaries freed, the next configuration's calls run
  slower on XLA:CPU, and not only the first). A rotation of a fixed order put the same
  configuration (`s3r`) after int8_sr in most rounds, and it measured slower than
  `int8_rtne` only in runs that included int8_sr; random orders leave the counts uneven too
  (with 6 configurations and 11 rounds, one configuration followed int8_sr in 4 rounds and
  another in none). `seed` shuffles which configuration gets which position in the design.
  """
  names = list(configs)
  out = {n: Timing(n, []) for n in names}  # results in the caller's order
  for n in names:
    fn, args = configs[n]
    t0 = time.perf_counter()
    block(fn(*args))
    out[n].compile_s = time.perf_counter() - t0
    for _ in range(warmup):
      block(fn(*args))
    if log:
      log(f"  compiled+warm {n}: first call {out[n].compile_s:.2f}s")
  slots = random.Random(seed).sample(names, len(names))  # which config takes which place in the design
  orders = balanced_orders(len(slots))
  for i in range(repeats):
    for n in (slots[j] for j in orders[i % len(orders)]):
      fn, args = configs[n]
      for _ in range(prime):
        block(fn(*args))
      t0 = time.perf_counter()
      for _ in range(number):
        res = fn(*args)
      block(res)
      out[n].samples.append((time.perf_counter() - t0) / number)
  return out


# --- run metadata ----------------------------------------------------------------------------


def _git(*args: str) -> str | None:
  try:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=20,
                          cwd=pathlib.Path(__file__).resolve().parent).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None


def git_info() -> dict[str, Any]:
  """HEAD revision, whether tracked files differ from it, and which (None outside a git checkout).

  In a shared checkout the dirty paths tell whether someone's uncommitted change to the code
  under test (e.g. s3r/quant) may be in a measurement.
  """
  rev = _git("rev-parse", "HEAD")
  status = _git("status", "--porcelain", "--untracked-files=no")
  paths = [line.split(None, 1)[1] for line in status.splitlines() if line.strip()] if status else []
  return {"revision": rev, "dirty": (bool(status) if status is not None else None), "dirty_paths": paths}


def cpu_model() -> str:
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.lower().startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return _platform.processor() or _platform.machine()


def loadavg() -> list[float] | None:
  try:
    return [round(v, 2) for v in os.getloadavg()]
  except OSError:
    return None


def platform_name() -> str:
  """The default JAX backend: 'cpu', 'gpu' or 'tpu' (used in results file names)."""
  import jax
  return jax.default_backend()


def command_line() -> str:
  """How this process was started: `s3r bench ...`, `python -m s3r.bench ...` or `script.py ...`."""
  if not sys.argv:
    return ""
  prog = pathlib.Path(sys.argv[0]).name
  if prog == "__main__.py":
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = spec.name.removesuffix(".__main__") if spec is not None else "?"
    prog = f"python -m {name}"
  return " ".join([prog, *sys.argv[1:]])


def run_metadata() -> dict[str, Any]:
  """Everything needed to interpret (and re-run) a results file, except the after-run load."""
  import jax
  import jaxlib
  devices = jax.devices()
  try:
    affinity = len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    affinity = None
  return {
      "command": command_line(),
      "argv": list(sys.argv),
      "git": git_info(),
      "jax_version": jax.__version__,
      "jaxlib_version": jaxlib.__version__,
      "python": _platform.python_version(),
      "platform": jax.default_backend(),
      "device_kind": devices[0].device_kind if devices else None,
      "device_count": len(devices),
      "cpu_model": cpu_model(),
      "cpu_count": os.cpu_count(),
      "cpu_affinity": affinity,
      "hostname": _platform.node(),
      "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
      "loadavg_before": loadavg(),
  }


class Run:
  """Collects metadata at the start of a benchmark run and writes its results files at the end."""

  def __init__(self, bench: str, out_dir: str | os.PathLike | None = None, **settings):
    self.bench = bench
    self.out_dir = pathlib.Path(out_dir) if out_dir is not None else RESULTS_DIR
    self.settings = settings
    self.meta = run_metadata()

  def stem(self) -> pathlib.Path:
    return self.out_dir / f"bench_{self.bench}_{self.meta['platform']}"

  def write(self, results: Any, markdown_body: str, *, chart: Callable[[pathlib.Path], None] | None = None,
            complete: bool = True) -> dict[str, pathlib.Path]:
    """Writes <stem>.json (metadata + settings + results), <stem>.md and optionally <stem>.png.

    `complete=False` marks a progress write (in the JSON and in a line of the Markdown), so a run that
    is stopped part-way leaves the shapes it finished and says that it is partial.
    """
    self.meta["loadavg_after"] = loadavg()
    self.out_dir.mkdir(parents=True, exist_ok=True)
    stem = self.stem()
    paths = {"json": stem.with_suffix(".json"), "md": stem.with_suffix(".md")}
    doc = {"bench": self.bench, "complete": complete, "meta": self.meta, "settings": self.settings,
           "results": results}
    paths["json"].write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
    partial = "" if complete else "\n**Partial: the run stopped before its last shape.**\n"
    paths["md"].write_text(metadata_markdown(self.bench, self.meta, self.settings) + partial + "\n" + markdown_body)
    if chart is not None:
      paths["png"] = stem.with_suffix(".png")
      chart(paths["png"])
    return paths


def _json_default(o):
  if isinstance(o, (np.integer,)):
    return int(o)
  if isinstance(o, (np.floating,)):
    return float(o)
  if isinstance(o, np.ndarray):
    return o.tolist()
  if isinstance(o, pathlib.Path):
    return str(o)
  raise TypeError(f"not JSON serializable: {type(o).__name__}")


def metadata_markdown(bench: str, meta: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
  g = meta.get("git") or {}
  rev = g.get("revision") or "unknown"
  dirty = (f" (uncommitted changes: {', '.join(g.get('dirty_paths') or []) or 'yes'})" if g.get("dirty") else "")
  lines = [
      f"# s3r bench {bench}",
      "",
      f"- command: `{meta.get('command')}`",
      f"- git: `{rev}`{dirty}",
      f"- date (UTC): {meta.get('date_utc')}",
      f"- jax {meta.get('jax_version')}, jaxlib {meta.get('jaxlib_version')}, python {meta.get('python')}",
      f"- platform: {meta.get('platform')} ({meta.get('device_kind')}, {meta.get('device_count')} device(s))",
      f"- CPU: {meta.get('cpu_model')}, {meta.get('cpu_count')} cores ({meta.get('cpu_affinity')} usable)",
      f"- load average (1/5/15 min) before: {meta.get('loadavg_before')}, after: {meta.get('loadavg_after')}",
      *([f"- settings: {', '.join(f'{k}={v}' for k, v in settings.items())}"] if settings else []),
      "",
  ]
  return "\n".join(lines)


# --- tables and charts -----------------------------------------------------------------------


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: Sequence[str] | None = None) -> str:
  """A GitHub Markdown table; `align` per column is 'l' or 'r' (default: first l, rest r)."""
  align = align or ["l"] + ["r"] * (len(headers) - 1)
  sep = ["---" if a == "l" else "--:" for a in align]
  cell = lambda v: "" if v is None else str(v).replace("|", "\\|")
  out = ["| " + " | ".join(cell(h) for h in headers) + " |", "| " + " | ".join(sep) + " |"]
  out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
  return "\n".join(out) + "\n"


def fmt_ms(seconds: float) -> str:
  return "n/a" if seconds is None or not np.isfinite(seconds) else f"{seconds * 1e3:.1f}"


def fmt_ratio(x: float | None, digits: int = 2) -> str:
  return "n/a" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def bar_chart(path: str | os.PathLike, groups: Sequence[str], series: Mapping[str, Sequence[float]], *,
              ylabel: str, title: str, hline: float | None = None) -> None:
  """Grouped bar chart (one group per x label, one bar per series) written as a PNG (Agg)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = list(series)
  n = max(len(names), 1)
  x = np.arange(len(groups))
  width = 0.8 / n
  fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) + 3), 4.0))
  for i, name in enumerate(names):
    vals = np.asarray([np.nan if v is None else v for v in series[name]], dtype=float)
    ax.bar(x + (i - (n - 1) / 2) * width, vals, width, label=name)
  if hline is not None:
    ax.axhline(hline, color="black", linewidth=0.8, linestyle="--")
  ax.set_xticks(x)
  ax.set_xticklabels(groups)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def parse_list(value: str | None, valid: Sequence[str], what: str) -> list[str]:
  """Comma-separated names checked against `valid` (None or 'all' -> all of `valid`)."""
  if value is None or value == "all":
    return list(valid)
  names = [v.strip() for v in value.split(",") if v.strip()]
  bad = [v for v in names if v not in valid]
  if bad:
    raise SystemExit(f"unknown {what}: {', '.join(bad)}; valid: {', '.join(valid)}")
  return names


def log(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


# --- the paper's FFN shapes (ALGORITHM.md §3, Table III) ------------------------------------

SHAPES: dict[str, tuple[int, int]] = {
    "W1": (512, 2048), "W2": (1024, 4096), "W3": (2048, 8192), "W4": (3072, 12288),
    "W5": (3840, 15360), "W6": (4096, 12288), "W7": (4096, 14336), "W8": (5120, 17920),
    "W9": (8192, 28672),
}

# Tokens per shape when --tokens is not given: the per-token cost of both the GEMMs (∝ H·D)
# and the quantizer (∝ D) is linear in T, so the ratios hardly depend on T once the GEMMs are
# efficient; fewer tokens keep the large shapes within a few seconds per call on a small CPU.
DEFAULT_TOKENS: dict[str, int] = {
    "W1": 2048, "W2": 2048, "W3": 2048, "W4": 1024, "W5": 1024, "W6": 1024,
    "W7": 512, "W8": 512, "W9": 256,
}

# Table III of the paper (one SwiGLU FFN block fwd+bwd on TPU v5p): speed vs BF16 for
# INT8 RTNE, independent SR and S3R, and the S3R-EC overheads in % of the S3R time.
PAPER_TABLE_III: dict[str, dict[str, float]] = {
    "W1": {"int8_rtne": 1.12, "int8_sr": 0.58, "s3r": 1.08, "s3r_ec_pct": 13.0, "s3r_ec_dx_pct": 14.8},
    "W2": {"int8_rtne": 1.45, "int8_sr": 0.91, "s3r": 1.44, "s3r_ec_pct": 7.3, "s3r_ec_dx_pct": 9.6},
    "W3": {"int8_rtne": 1.73, "int8_sr": 1.29, "s3r": 1.73, "s3r_ec_pct": -0.6, "s3r_ec_dx_pct": 1.7},
    "W4": {"int8_rtne": 1.92, "int8_sr": 1.54, "s3r": 1.92, "s3r_ec_pct": 4.8, "s3r_ec_dx_pct": 4.1},
    "W5": {"int8_rtne": 1.84, "int8_sr": 1.53, "s3r": 1.83, "s3r_ec_pct": 2.8, "s3r_ec_dx_pct": 3.3},
    "W6": {"int8_rtne": 1.89, "int8_sr": 1.60, "s3r": 1.90, "s3r_ec_pct": 2.7, "s3r_ec_dx_pct": 3.1},
    "W7": {"int8_rtne": 1.87, "int8_sr": 1.56, "s3r": 1.87, "s3r_ec_pct": 3.4, "s3r_ec_dx_pct": 3.1},
    "W8": {"int8_rtne": 1.82, "int8_sr": 1.58, "s3r": 1.81, "s3r_ec_pct": 0.7, "s3r_ec_dx_pct": 2.7},
    "W9": {"int8_rtne": 1.81, "int8_sr": 1.66, "s3r": 1.81, "s3r_ec_pct": 3.8, "s3r_ec_dx_pct": 2.2},
}

BENCH_RECIPES = ("bf16", "int8_rtne", "int8_sr", "s3r", "s3r_ec", "s3r_ec_dx")


def parse_shapes(value: str | None) -> dict[str, tuple[int, int]]:
  """Shape label -> (H, D_ffn) from 'W1,W3', 'all', or custom 'HxD' entries such as '256x1024'."""
  if value is None or value == "all":
    return dict(SHAPES)
  out = {}
  for item in (v.strip() for v in value.split(",") if v.strip()):
    if item in SHAPES:
      out[item] = SHAPES[item]
      continue
    m = re.fullmatch(r"(\d+)x(\d+)", item)
    if not m:
      raise SystemExit(f"unknown shape {item!r}: use W1..W9, 'all' or HxD (e.g. 256x1024)")
    out[item] = (int(m.group(1)), int(m.group(2)))
  return out


def tokens_for(shape: str, tokens: int | None) -> int:
  """--tokens if given, else the per-shape default (2048 for custom HxD shapes)."""
  return int(tokens) if tokens else DEFAULT_TOKENS.get(shape, 2048)


def paired_ratio(num: Timing, den: Timing) -> float:
  """Median over rounds of num/den for samples taken in the same round (drift-robust)."""
  n = min(len(num.samples), len(den.samples))
  if n == 0:
    return float("nan")
  return float(np.median(np.asarray(num.samples[:n]) / np.asarray(den.samples[:n])))
