"""`python -m benchmarks hf_load`: loading a Hugging Face checkpoint streams (time and peak host memory).

Writes a synthetic bf16 checkpoint in the Hub layout of `--preset` (default llama3.1-8b at its real
widths: hidden 4096, intermediate 14336, 32 heads / 8 KV heads, vocab 128256) cut to `--layers`
decoder layers (default 2), then measures, each in a fresh subprocess so that peaks do not mix:

- `plain read`: every tensor memory-mapped and copied into a numpy array in its stored dtype, all
  kept (what a loader that materializes the file's tensors holds: the checkpoint's size);
- `load_hf bf16` / `load_hf f32`: `s3r.model.load_hf(dtype=...)`, the parameters on the default device;
- `load_hf bf16 + save_hf`: the same load, then `s3r.model.save_hf` of the parameters (export).

Peak memory is reported twice: the peak resident set (VmHWM, which also counts the file pages the
memory maps touched, page cache the kernel may drop) and the peak anonymous memory (RssAnon sampled
every 5 ms: the process's own copies), both against the checkpoint's size. The files are read from the
page cache (they were just written). Writes bench_hf_load_<platform>.{json,md} into --out-dir.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from labtools.results import REPO_ROOT, RESULTS_DIR, Run, loadavg, log, markdown_table

KINDS = ("plain read", "load_hf bf16", "load_hf f32", "load_hf bf16 + save_hf")
GIB = 2**30
_BLOCK = 1 << 20  # random values tiled into every tensor (generating gigabytes of normals would dominate the run)


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--preset", default="llama3.1-8b", help="model preset whose layout and widths the checkpoint has")
  p.add_argument("--layers", type=int, default=2, help="decoder layers of the synthetic checkpoint")
  p.add_argument("--repeats", type=int, default=3, help="measurements of each kind (fresh subprocesses, interleaved)")
  p.add_argument("--work-dir", default=None, help="where the checkpoint is written (default: a temporary folder)")
  p.add_argument(
    "--out-dir", default=str(RESULTS_DIR), help="where bench_hf_load_<platform>.{json,md} go (default %(default)s)"
  )


def write_checkpoint(folder: pathlib.Path, preset: str, layers: int) -> int:
  """A bf16 checkpoint of `preset` with `layers` layers in `folder` (config.json + model.safetensors); its bytes."""
  import jax.numpy as jnp
  import numpy as np

  from s3r import model as M
  from s3r.model.hf.hub_config import hub_config
  from s3r.model.hf.load import param_shapes
  from s3r.model.hf.safetensors import SafetensorsWriter
  from s3r.model.hf.tensors import tensor_map

  cfg = M.preset(preset, layers=layers)
  shapes = param_shapes(cfg)
  tensors = {
    name: tuple(shape)
    for entry in tensor_map(cfg, set())
    for name, shape in zip(entry.hub, entry.layout.hub_shapes(shapes[entry.path]))
  }
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "config.json").write_text(json.dumps(hub_config(cfg, dtype="bfloat16")))
  block = (np.random.default_rng(0).standard_normal(_BLOCK, np.float32) * 0.02).astype(jnp.bfloat16)
  writer = SafetensorsWriter(folder / "model.safetensors", {n: (s, np.dtype(jnp.bfloat16)) for n, s in tensors.items()})
  try:
    for i, (name, shape) in enumerate(tensors.items()):
      writer.write(name, np.resize(np.roll(block, i), shape))
    writer.finish()
  finally:
    writer.close()
  return (folder / "model.safetensors").stat().st_size


class _AnonPeak:
  """The peak of RssAnon (/proc/self/status), sampled in a thread while the block runs."""

  def __enter__(self):
    self.peak, self._stop = _status("RssAnon"), threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)
    self._thread.start()
    return self

  def _sample(self):
    while not self._stop.wait(0.005):
      self.peak = max(self.peak, _status("RssAnon"))

  def __exit__(self, *_):
    self._stop.set()
    self._thread.join()
    self.peak = max(self.peak, _status("RssAnon"))


def _status(field: str) -> int:
  """A field of /proc/self/status in bytes."""
  for line in pathlib.Path("/proc/self/status").read_text().splitlines():
    if line.startswith(field + ":"):
      return int(line.split()[1]) * 1024
  raise RuntimeError(f"/proc/self/status has no {field}")


def measure(kind: str, folder: pathlib.Path) -> dict:
  """One measurement of `kind` on the checkpoint `folder`, in this process (run it in a fresh one)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from s3r import model as M
  from s3r.model.hf.safetensors import SafetensorsFile

  jax.devices()  # the backend's own memory is not the load's
  base_anon, export_s = _status("RssAnon"), None
  with _AnonPeak() as anon:
    t0 = time.perf_counter()
    if kind == "plain read":
      f = SafetensorsFile(folder / "model.safetensors")
      kept = [np.array(f.read(name)) for name in f.names]
      load_s = time.perf_counter() - t0
      del kept
    else:
      _, params = M.load_hf(folder, dtype=jnp.float32 if kind == "load_hf f32" else jnp.bfloat16)
      jax.block_until_ready(params)
      load_s = time.perf_counter() - t0
      if kind.endswith("save_hf"):
        t1 = time.perf_counter()
        M.save_hf(folder.parent / "export", M.hf_config(folder), params, dtype=jnp.bfloat16)
        export_s = time.perf_counter() - t1
  return {
    "kind": kind,
    "load_s": load_s,
    "export_s": export_s,
    "peak_rss_bytes": _status("VmHWM"),
    "peak_anon_bytes": anon.peak - base_anon,
  }


def _subprocess(kind: str, folder: pathlib.Path) -> dict:
  proc = subprocess.run(
    [sys.executable, "-m", "benchmarks.hf_load", kind, str(folder)],
    capture_output=True,
    text=True,
    cwd=REPO_ROOT,
    check=False,
  )
  if proc.returncode:
    raise SystemExit(f"python -m benchmarks hf_load: the {kind!r} measurement failed:\n{proc.stderr[-2000:]}")
  shutil.rmtree(folder.parent / "export", ignore_errors=True)
  return json.loads(proc.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict:
  if args.layers < 1 or args.repeats < 1:
    raise SystemExit("python -m benchmarks hf_load: --layers and --repeats must be >= 1")
  run_ = Run("hf_load", args.out_dir, preset=args.preset, layers=args.layers, repeats=args.repeats)
  work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="s3r-hf-load-"))
  folder = work / "checkpoint"
  try:
    t0 = time.perf_counter()
    size = write_checkpoint(folder, args.preset, args.layers)
    log(f"[hf_load] wrote {size / GIB:.2f} GiB ({args.preset}, {args.layers} layers), {time.perf_counter() - t0:.0f}s")
    samples: dict[str, list[dict]] = {k: [] for k in KINDS}
    for r in range(args.repeats):
      for kind in KINDS:
        s = _subprocess(kind, folder)
        samples[kind].append(s)
        peak = s["peak_anon_bytes"] / GIB
        log(f"[hf_load] {r + 1}/{args.repeats} {kind}: {s['load_s']:.2f}s, anon peak {peak:.2f} GiB, load {loadavg()}")
  finally:
    if args.work_dir is None:
      shutil.rmtree(work, ignore_errors=True)
  results = {"checkpoint_bytes": size, "kinds": {k: summarize(v, size) for k, v in samples.items()}, "samples": samples}
  paths = run_.write(results, markdown(results, args))
  log(f"wrote {paths['md']}")
  return results


def summarize(samples: list[dict], size: int) -> dict:
  median = lambda key: statistics.median(s[key] for s in samples) if samples[0][key] is not None else None
  return {
    "load_s": median("load_s"),
    "export_s": median("export_s"),
    "peak_rss_bytes": max(s["peak_rss_bytes"] for s in samples),
    "peak_anon_bytes": max(s["peak_anon_bytes"] for s in samples),
    "peak_anon_x_checkpoint": max(s["peak_anon_bytes"] for s in samples) / size,
    "peak_rss_x_checkpoint": max(s["peak_rss_bytes"] for s in samples) / size,
  }


def markdown(results: dict, args: argparse.Namespace) -> str:
  size = results["checkpoint_bytes"]
  rows = [
    [
      k,
      f"{v['load_s']:.2f}",
      "" if v["export_s"] is None else f"{v['export_s']:.2f}",
      f"{v['peak_anon_bytes'] / GIB:.2f} ({v['peak_anon_x_checkpoint']:.2f}x)",
      f"{v['peak_rss_bytes'] / GIB:.2f} ({v['peak_rss_x_checkpoint']:.2f}x)",
    ]
    for k, v in results["kinds"].items()
  ]
  head = ["measurement", "load s (median)", "export s (median)", "peak anon GiB (x ckpt)", "peak RSS GiB (x ckpt)"]
  return (
    f"## {args.preset} layout, {args.layers} layers: {size / GIB:.2f} GiB of bf16 safetensors\n\n"
    + markdown_table(head, rows)
    + "\nPeaks are the largest of the repeats (each a fresh process); anon: the process's own copies "
    "(RssAnon above its value before the load); RSS: VmHWM, which also counts the file pages the memory "
    "maps touched. Parameters of `load_hf` end on the default device (here host memory): bf16 holds 1x the "
    "checkpoint, f32 2x.\n"
  )


if __name__ == "__main__":  # one measurement in a fresh process: python -m benchmarks.hf_load KIND FOLDER
  print(json.dumps(measure(sys.argv[1], pathlib.Path(sys.argv[2]))))
