"""`python -m benchmarks perfmodel`: predicted step times on an H100, an H200 or a TPU v5p, from optimized HLO.

No accelerator is needed: programs are compiled deviceless (`python -m benchmarks aot --save-hlo DIR`, or
`perfmodel compile` for the FFN block and the quantizer of any revision), read into kernel lists, and timed
by the model of benchmarks/perfmodel.py, whose five constants are fitted on accelerator measurements
(results/perfmodel/PREREGISTRATION.md says which, and which are held out). Actions:

  compile   FFN-block or quantizer programs of the s3r at --s3r-root, compiled for --target (extra gpu-aot or
            tpu-aot), their HLO written to --hlo-dir
  kernels   the kernels of every *.hlo.gz in --hlo-dir, written to --out (gzip JSON; what the other actions read)
  validate  fit and held-out errors for --target h200 (results/bench_ffn_gpu.json, bench_quantizer_gpu.json) or
            v5p (the paper's Table III), with the kernels of --kernels
  predict   predicted step times of the train steps in --kernels per recipe, against `bf16` (and FP8), with the
            band from the fit of --fit (a validate results file), a per-group breakdown and a stacked-bar figure

Results go to --out-dir (default runs/results), never over the committed files unless told so.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import re
from typing import Any

from benchmarks import perfmodel_hlo
from labtools.results import RESULTS_DIR, Run, log

ACTIONS = ("compile", "kernels", "validate", "predict")


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("action", choices=ACTIONS, help="what to do (see above)")
  p.add_argument("--target", default="h200", help="h100, h200 or v5p (default %(default)s)")
  p.add_argument("--hlo-dir", default="runs/perfmodel/hlo", help="compile: where HLO goes; kernels: where it is read")
  p.add_argument("--kernels", default=None, help="validate / predict: a kernels file (gzip JSON)")
  p.add_argument("--out", default=None, help="kernels: the kernels file to write")
  p.add_argument("--fit", default=None, help="predict: the validate results file whose fit is used")
  p.add_argument("--s3r-root", default=None, help="compile: a checkout whose s3r is compiled (default: this one)")
  p.add_argument("--program", default="ffn", choices=("ffn", "quantizer"), help="compile: which program")
  p.add_argument("--recipes", default="bf16,int8_rtne,int8_sr,s3r,s3r_ec,s3r_ec_dx", help="compile: recipes")
  p.add_argument("--shapes", default="W1,W2,W3,W4,W5,W6,W7,W8,W9", help="compile: FFN shapes")
  p.add_argument("--tokens", type=int, default=16384, help="compile: tokens T (default %(default)s)")
  p.add_argument("--baseline", default="bf16", help="predict: the recipe the ratios are against (default %(default)s)")
  p.add_argument("--tag", default=None, help="results go to bench_perfmodel_<action>_<target>[_<tag>]_cpu.*")
  p.add_argument("--out-dir", default=str(RESULTS_DIR), help="where results files go (default %(default)s)")


def run(args: argparse.Namespace) -> dict:
  if args.action == "compile":
    from benchmarks import perfmodel_programs

    perfmodel_programs.run_compile(args)
    return {}
  if args.action == "kernels":
    return {
      "path": write_kernels(pathlib.Path(args.hlo_dir), pathlib.Path(args.out or "runs/perfmodel/kernels.json.gz"))
    }
  if not args.kernels:
    raise SystemExit(f"perfmodel {args.action}: --kernels FILE is required")
  if args.action == "validate":
    return _validate(args)
  return _predict(args)


def write_kernels(hlo_dir: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
  """The kernels of every HLO file of `hlo_dir`, by program name, with what made them."""
  from labtools.results import run_metadata

  files = sorted(hlo_dir.glob("*.hlo.gz"))
  if not files:
    raise SystemExit(f"--hlo-dir {hlo_dir}: no *.hlo.gz files (write them with `benchmarks aot --save-hlo` or compile)")
  programs = {}
  for f in files:
    name = f.name.removesuffix(".hlo.gz")
    tpu = name.startswith("v5p")
    programs[name] = [k.as_dict() for k in perfmodel_hlo.kernels(gzip.decompress(f.read_bytes()).decode(), tpu)]
    log(f"[perfmodel] {name}: {len(programs[name])} kernels")
  tokens = {int(m.group(1)) for n in programs if (m := re.search(r"_T(\d+)_", n))}
  meta: dict[str, Any] = {
    "made_by": run_metadata(),
    "programs": len(programs),
    "tokens": tokens.pop() if len(tokens) == 1 else None,
  }
  if (hlo_dir / "manifest.json").is_file():  # what `perfmodel compile` recorded: the revision of s3r compiled
    meta["compiled"] = [
      {k: v for k, v in e.items() if k != "programs"} for e in json.loads((hlo_dir / "manifest.json").read_text())
    ]
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_bytes(gzip.compress(json.dumps({"meta": meta, "programs": programs}).encode(), mtime=0))
  log(f"[perfmodel] wrote {out}")
  return out


def _validate(args: argparse.Namespace) -> dict:
  from benchmarks import perfmodel_report, perfmodel_validate

  kernels = pathlib.Path(args.kernels)
  if args.target == "h200":
    result = perfmodel_validate.h200(
      kernels, pathlib.Path("results/bench_ffn_gpu.json"), pathlib.Path("results/bench_quantizer_gpu.json")
    )
  elif args.target == "v5p":
    result = perfmodel_validate.v5p(kernels)
  else:
    raise SystemExit(f"perfmodel validate --target {args.target}: the measurements exist for h200 and v5p")
  name = f"perfmodel_validate_{args.target}" + (f"_{args.tag}" if args.tag else "")
  run_ = Run(name, args.out_dir, title=f"python -m benchmarks perfmodel validate --target {args.target}",
             target=args.target, kernels=str(kernels))  # fmt: skip
  paths = run_.write(result, perfmodel_report.validation_markdown(result))
  log(f"[perfmodel] {perfmodel_report.validation_line(result)}; wrote {', '.join(map(str, paths.values()))}")
  return result


def _predict(args: argparse.Namespace) -> dict:
  from benchmarks import perfmodel_report

  if not args.fit:
    raise SystemExit("perfmodel predict: --fit FILE (a `perfmodel validate` results file) is required")
  result = perfmodel_report.predict(pathlib.Path(args.kernels), pathlib.Path(args.fit), args.target, args.baseline)
  name = f"perfmodel_predict_{args.target}" + (f"_{args.tag}" if args.tag else "")
  run_ = Run(name, args.out_dir, title=f"python -m benchmarks perfmodel predict --target {args.target}",
             target=args.target, kernels=args.kernels, fit=args.fit, baseline=args.baseline)  # fmt: skip
  paths = run_.write(
    result, perfmodel_report.predict_markdown(result), chart=lambda p: perfmodel_report.chart(result, p)
  )
  log(f"[perfmodel] wrote {', '.join(map(str, paths.values()))}")
  return result
