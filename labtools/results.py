"""Results files (shared by `benchmarks/` and `research/`): run metadata, JSON/Markdown writer, tables, charts.

Every results file records how to re-run it and on what: the command (relative to the repository
root, never an absolute script path), the git revision and any uncommitted tracked paths, the JAX
version, the machine and the date. `Run` writes one benchmark's `<stem>.json`, `<stem>.md` (a
heading, the metadata, then the body) and optionally `<stem>.png`.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform as _platform
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

# Where every command writes by default: a folder of the user's, never the committed results.
# The committed results (the benchmarks' in results/, the experiments' in research/results/) are
# rewritten only when a command is pointed there explicitly (`--out-dir results`,
# `--results-dir research/results`, ...).
RESULTS_DIR = pathlib.Path("runs/results")
REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent  # the checkout holding the s3r package

# --- run metadata ----------------------------------------------------------------------------


def _git(*args: str) -> str | None:
  try:
    return subprocess.run(
      ["git", *args], capture_output=True, text=True, check=True, timeout=20, cwd=REPO_ROOT
    ).stdout.strip()
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


def repo_relative(arg: str) -> str:
  """`arg` without machine-specific prefixes: an absolute path inside the repository relative to
  its root, one beside it (e.g. `../shared/data`) as `../...`; elsewhere cut to its part from a
  `runs/` folder; anything else unchanged."""
  path = pathlib.Path(arg)
  if not path.is_absolute():
    return arg
  resolved = path.resolve()
  if resolved.is_relative_to(REPO_ROOT):
    return resolved.relative_to(REPO_ROOT).as_posix()
  if resolved.is_relative_to(REPO_ROOT.parent):
    return "../" + resolved.relative_to(REPO_ROOT.parent).as_posix()
  parts = path.parts
  return "/".join(parts[parts.index("runs") :]) if "runs" in parts else arg


def _command_head() -> list[str]:
  """How this process was started: `s3r`, `python -m s3r.x` (or `benchmarks`, `research`) or
  a script path (relative to the repository root; its bare name outside the checkout)."""
  prog = pathlib.Path(sys.argv[0])
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is not None and spec.name.split(".")[0] in ("s3r", "benchmarks", "research", "labtools"):  # `python -m x`
    return ["python", "-m", spec.name.removesuffix(".__main__")]
  if prog.suffix == ".py":
    rel = repo_relative(str(prog.resolve()))
    return [rel if not pathlib.Path(rel).is_absolute() else prog.name]
  return [prog.name]  # a console script such as `s3r`


def command_argv() -> list[str]:
  """This process's command line, with absolute paths made portable (`repo_relative`)."""
  if not sys.argv:
    return []
  return [*_command_head(), *map(repo_relative, sys.argv[1:])]


def command_line() -> str:
  """`command_argv()` as one line."""
  return " ".join(command_argv())


def run_metadata(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Everything needed to interpret (and re-run) a results file, except the after-run load.

  `argv`: the arguments of a `main(argv)` called in-process (the command then names the
  `__main__` module's path as `python -m` would); default: this process's own command line.
  """
  import jax
  import jaxlib

  devices = jax.devices()
  try:
    affinity = len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    affinity = None
  args = command_argv() if argv is None else [*_command_head(), *map(repo_relative, argv)]
  return {
    "command": " ".join(args),
    "argv": args,
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
    "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "xla_flags": os.environ.get("XLA_FLAGS", ""),  # e.g. GEMMs on cuBLAS instead of Triton
    "loadavg_before": loadavg(),
  }


# --- writing ---------------------------------------------------------------------------------


def json_default(o: Any) -> Any:
  """`json.dumps(default=...)` for NumPy scalars and arrays and paths."""
  if isinstance(o, np.integer):
    return int(o)
  if isinstance(o, np.floating):
    return float(o)
  if isinstance(o, np.ndarray):
    return o.tolist()
  if isinstance(o, pathlib.Path):
    return str(o)
  raise TypeError(f"not JSON serializable: {type(o).__name__}")


def write_json(path: str | os.PathLike, doc: Any) -> pathlib.Path:
  """Writes `doc` as indented JSON (NumPy values converted) with a final newline, atomically
  (a reader never sees half a file; a run killed mid-write keeps the previous one)."""
  path = pathlib.Path(path)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(json.dumps(doc, indent=1, default=json_default) + "\n")
  os.replace(tmp, path)
  return path


def metadata_lines(meta: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
  """The metadata of a results file as a Markdown bullet list (ends with an empty line)."""
  g = meta.get("git") or {}
  rev = g.get("revision") or "unknown"
  dirty = f" (uncommitted changes: {', '.join(g.get('dirty_paths') or []) or 'yes'})" if g.get("dirty") else ""
  lines = [
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


def metadata_markdown(title: str, meta: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
  """`# <title>`, an empty line, then `metadata_lines`."""
  return f"# {title}\n\n" + metadata_lines(meta, settings)


class Run:
  """Collects metadata at the start of a benchmark run and writes its results files at the end.

  Files are `<out_dir>/bench_<bench>_<platform>.{json,md,png}`; the Markdown heading is `title`
  (default `python -m benchmarks <bench>`).
  """

  def __init__(
    self, bench: str, out_dir: str | os.PathLike | None = None, *, title: str | None = None, **settings: Any
  ):
    self.bench = bench
    self.title = title or f"python -m benchmarks {bench}"
    self.out_dir = pathlib.Path(out_dir) if out_dir is not None else RESULTS_DIR
    self.settings = settings
    self.meta = run_metadata()

  def stem(self) -> pathlib.Path:
    return self.out_dir / f"bench_{self.bench}_{self.meta['platform']}"

  def write(
    self,
    results: Any,
    markdown_body: str,
    *,
    chart: Callable[[pathlib.Path], None] | None = None,
    complete: bool = True,
  ) -> dict[str, pathlib.Path]:
    """Writes <stem>.json (metadata + settings + results), <stem>.md and optionally <stem>.png.

    `complete=False` marks a progress write (in the JSON and in a line of the Markdown), so a run that
    is stopped part-way leaves the shapes it finished and says that it is partial.
    """
    self.meta["loadavg_after"] = loadavg()
    self.out_dir.mkdir(parents=True, exist_ok=True)
    stem = self.stem()
    suffixed = lambda ext: stem.with_name(stem.name + ext)  # not with_suffix: a tag may hold dots (llama3.1-8b)
    paths = {"json": suffixed(".json"), "md": suffixed(".md")}
    doc = {"bench": self.bench, "complete": complete, "meta": self.meta, "settings": self.settings, "results": results}
    write_json(paths["json"], doc)
    partial = "" if complete else "\n**Partial: the run stopped before its last shape.**\n"
    head = metadata_markdown(self.title, self.meta, self.settings)
    paths["md"].write_text(head + partial + "\n" + markdown_body)
    if chart is not None:
      paths["png"] = suffixed(".png")
      chart(paths["png"])
    return paths


# --- tables, charts, command-line helpers ----------------------------------------------------


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: Sequence[str] | None = None) -> str:
  """A GitHub Markdown table; `align` per column is 'l' or 'r' (default: first l, rest r)."""
  align = align or ["l"] + ["r"] * (len(headers) - 1)
  sep = ["---" if a == "l" else "--:" for a in align]

  def cell(v: Any) -> str:
    return "" if v is None else str(v).replace("|", "\\|")

  out = ["| " + " | ".join(cell(h) for h in headers) + " |", "| " + " | ".join(sep) + " |"]
  out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
  return "\n".join(out) + "\n"


def fmt_ms(seconds: float | None) -> str:
  return "n/a" if seconds is None or not np.isfinite(seconds) else f"{seconds * 1e3:.1f}"


def fmt_ratio(x: float | None, digits: int = 2) -> str:
  return "n/a" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def bar_chart(
  path: str | os.PathLike,
  groups: Sequence[str],
  series: Mapping[str, Sequence[float | None]],
  *,
  ylabel: str,
  title: str,
  hline: float | None = None,
) -> None:
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
  """One progress line on stderr."""
  print(msg, file=sys.stderr, flush=True)
