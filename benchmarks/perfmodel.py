"""The performance model: a program's time on an H100, an H200 or a TPU v5p, predicted from its optimized HLO.

The rules (results/perfmodel/PREREGISTRATION.md, fixed before any fit): kernels run one after the other;
a GEMM takes max(c0 + FLOPs / (e_type · peak_type), bytes / (e_mem · HBM)) + launch; cuDNN attention the
same at the bf16 rate; every other kernel max(bytes / (e_mem · HBM), Σ vector ops / vector rate) + launch;
a collective bytes / link + launch. Peaks are published (benchmarks/targets/peaks.toml), vector rates come
from XLA's description of the GPU (benchmarks/targets/*.txtpb) or the paper's TPU measurement, and five
constants are fitted on measurements (`fit`): e_bf16 (bf16 and TF32 tensor cores, each against its own
peak; also FP8, an assumption), e_s8, c0, e_mem, launch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
import re
import tomllib
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from benchmarks.perfmodel_hlo import Kernel

TARGETS_DIR = pathlib.Path(__file__).parent / "targets"
# XLA's PrimitiveType numbers in the target description's rate_infos
PRIMITIVE = {2: "s8", 4: "s32", 6: "u8", 8: "u32", 10: "f16", 11: "f32", 12: "f64", 16: "bf16"}
CONSTANTS = ("e_bf16", "e_s8", "c0", "e_mem", "launch")
LOWER = np.array([0.05, 0.05, 0.0, 0.05, 0.0])
UPPER = np.array([1.0, 1.0, 1e-3, 1.0, 1e-3])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
  """One chip's published peaks: GEMM FLOP/s per operand type, HBM and link bytes/s, vector ops/s per type."""

  name: str
  title: str
  gemm: dict[str, float]
  hbm: float
  link: float
  vector: dict[str, float]
  tpu: bool = False

  def gemm_peak(self, dtype: str) -> float:
    if dtype in self.gemm:
      return self.gemm[dtype]
    return min(self.gemm.values())  # mixed operand types run at the slower one's rate

  def vector_rate(self, dtype: str) -> float:
    return self.vector.get(dtype, self.vector.get("s32", min(self.vector.values())))


@functools.cache
def target(name: str) -> Target:
  """The published peaks of `name` (h100, h200, v5p) from peaks.toml, and the GPU's vector rates from XLA's
  description of it."""
  peaks = tomllib.loads((TARGETS_DIR / "peaks.toml").read_text())
  if name not in peaks:
    raise SystemExit(f"--target {name}: not one of {', '.join(peaks)}")
  p = peaks[name]
  vector = {"s32": float(p["vector"])} if "vector" in p else _vector_rates((TARGETS_DIR / p["txtpb"]).read_text())
  return Target(name=name, title=p["name"], gemm={k: float(v) for k, v in p["gemm"].items()}, hbm=float(p["hbm"]),
                link=float(p["link"]), vector=vector, tpu="txtpb" not in p)  # fmt: skip


def _vector_rates(txtpb: str) -> dict[str, float]:
  """Ops/s per element type of the GPU's scalar units: cores x units per core x ops per clock x clock."""
  cores = int(_field(r"core_count:\s*(\d+)", txtpb))
  scalar = txtpb[txtpb.index("scalar_unit_description") : txtpb.index("matrix_unit_description")]
  rates = {}
  for block in re.findall(r"rate_infos\s*\{(.*?)\n    \}", scalar, re.S):
    key = int(_field(r"key:\s*(\d+)", block))
    clock = float(_field(r"clock_rate_ghz:\s*([\d.]+)", block))
    units = int(_field(r"units_per_core:\s*(\d+)", block))
    per_clock = int(_field(r"ops_per_clock:\s*(\d+)", block))
    if key in PRIMITIVE:
      rates[PRIMITIVE[key]] = cores * units * per_clock * clock * 1e9
  return rates


def _field(pattern: str, text: str) -> str:
  """The first group of `pattern` in a target description; a clear error where the description lacks it."""
  m = re.search(pattern, text)
  if m is None:
    raise ValueError(f"target description: no match for {pattern!r}")
  return m.group(1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Constants:
  """The fitted efficiencies and overheads of one target family (see the module docstring)."""

  e_bf16: float
  e_s8: float
  c0: float  # seconds per GEMM
  e_mem: float
  launch: float  # seconds per kernel

  def vector(self) -> np.ndarray:
    return np.array([getattr(self, k) for k in CONSTANTS])

  @classmethod
  def of(cls, v: Sequence[float]) -> Constants:
    return cls(**{k: float(x) for k, x in zip(CONSTANTS, v, strict=True)})


def kernel_seconds(k: Kernel, t: Target, c: Constants) -> float:
  """One execution of kernel `k` on target `t` with constants `c`."""
  memory = k.bytes / (c.e_mem * t.hbm)
  if k.kind in ("gemm", "attention"):
    dtype = k.dtype if k.kind == "gemm" else "bf16"
    eff = c.e_s8 if dtype == "s8" else c.e_bf16
    compute = c.c0 + k.flops / (eff * t.gemm_peak(dtype))
    return max(compute, memory) + c.launch
  if k.kind == "collective":
    return k.bytes / t.link + c.launch
  vector = sum(n / t.vector_rate(dt) for dt, n in k.vector_ops.items())
  return max(memory, vector) + c.launch


def program_seconds(kernels: Sequence[Kernel], t: Target, c: Constants) -> float:
  """Σ count x `kernel_seconds`, vectorized over the kernels (the fit evaluates it thousands of times)."""
  a = _arrays(kernels, t)
  eff = np.where(a["s8"], c.e_s8, c.e_bf16)
  compute = np.where(a["gemm"], c.c0 + a["flops"] / (eff * a["peak"]), 0.0)
  memory = a["bytes"] / (c.e_mem * t.hbm)
  seconds = np.where(a["collective"], a["link"], np.maximum(np.maximum(compute, memory), a["vector"])) + c.launch
  return float(a["count"] @ seconds)


_ARRAYS: dict[tuple[int, str], tuple[Sequence[Kernel], dict[str, np.ndarray]]] = {}


def _arrays(kernels: Sequence[Kernel], t: Target) -> dict[str, np.ndarray]:
  """The constant-free parts of `kernel_seconds` per kernel, cached per kernel list and target."""
  key = (id(kernels), t.name)
  if key in _ARRAYS and _ARRAYS[key][0] is kernels:
    return _ARRAYS[key][1]
  gemm = [k.kind in ("gemm", "attention") for k in kernels]
  dtype = [(k.dtype if k.kind == "gemm" else "bf16") for k in kernels]
  a = {
    "count": np.array([k.count for k in kernels], float),
    "bytes": np.array([k.bytes for k in kernels], float),
    "flops": np.array([k.flops for k in kernels], float),
    "gemm": np.array(gemm, bool),
    "s8": np.array([g and d == "s8" for g, d in zip(gemm, dtype, strict=True)], bool),
    "peak": np.array([t.gemm_peak(d) for d in dtype], float),
    "collective": np.array([k.kind == "collective" for k in kernels], bool),
    "link": np.array([k.bytes / t.link for k in kernels], float),
    "vector": np.array(
      [
        0.0 if g else sum(n / t.vector_rate(dt) for dt, n in k.vector_ops.items())
        for g, k in zip(gemm, kernels, strict=True)
      ],
      float,
    ),  # fmt: skip
  }
  _ARRAYS[key] = (kernels, a)
  return a


def breakdown(kernels: Sequence[Kernel], t: Target, c: Constants) -> dict[str, float]:
  """Predicted seconds per kernel group (GEMMs by type, quantizers and thresholds, error correction, ...)."""
  out: dict[str, float] = defaultdict(float)
  for k in kernels:
    out[k.group] += k.count * kernel_seconds(k, t, c)
  return dict(out)


# --- fitting ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fit:
  constants: Constants
  covariance: np.ndarray  # of the constants, in CONSTANTS order
  residuals: np.ndarray  # log(predicted / measured) of the fitted points
  points: int

  def draws(self, n: int = 2000, seed: int = 0) -> list[Constants]:
    """Constants drawn from the fit's normal approximation, clipped to the bounds."""
    rng = np.random.default_rng(seed)
    v = rng.multivariate_normal(self.constants.vector(), self.covariance, size=n, method="svd")
    return [Constants.of(np.clip(x, LOWER, UPPER)) for x in v]

  def as_dict(self) -> dict:
    sd = np.sqrt(np.clip(np.diag(self.covariance), 0, None))
    return {
      "constants": dataclasses.asdict(self.constants),
      "standard_errors": dict(zip(CONSTANTS, sd.tolist(), strict=True)),
      "covariance": self.covariance.tolist(),
      "rms_log_residual": float(np.sqrt(np.mean(self.residuals**2))),
      "points": self.points,
    }


def fit(residual_fn: Callable[[Constants], np.ndarray], start: Constants | None = None) -> Fit:
  """Least squares of `residual_fn(constants)` (log ratios) within the bounds; covariance from the Jacobian."""
  from scipy.optimize import least_squares

  x0 = (start or Constants(e_bf16=0.6, e_s8=0.4, c0=2e-5, e_mem=0.7, launch=5e-6)).vector()
  scale = np.array([1.0, 1.0, 1e-5, 1.0, 1e-6])
  res = least_squares(
    lambda z: residual_fn(Constants.of(z * scale)), x0 / scale, bounds=(LOWER / scale, UPPER / scale), x_scale="jac"
  )
  r = res.fun
  dof = max(len(r) - len(x0), 1)
  s2 = float(r @ r) / dof
  jtj = res.jac.T @ res.jac
  cov_scaled = np.linalg.pinv(jtj) * s2
  cov = cov_scaled * np.outer(scale, scale)
  return Fit(constants=Constants.of(res.x * scale), covariance=cov, residuals=r, points=len(r))


def band(fit_: Fit, predict: Callable[[Constants], float], lo: float = 5, hi: float = 95) -> tuple[float, float]:
  """The `lo`-`hi` percentile range of `predict` over the fit's draws."""
  values = [predict(c) for c in fit_.draws()]
  values = [v for v in values if math.isfinite(v)]
  return float(np.percentile(values, lo)), float(np.percentile(values, hi))
