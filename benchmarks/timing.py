"""Timing harness for benchmarks: interleaved repeats in a carryover-balanced (Williams) order.

Timing on a shared, noisy CPU: every configuration of one run is compiled and warmed up
first, then the repeats are interleaved (every round times each configuration once, the
orders of the rounds forming a carryover-balanced design: see `balanced_orders`), so that slow
phases of the machine, and whatever one configuration leaves behind for the next, hit every
configuration alike.
Each configuration reports the median and the inter-quartile range of its repeats, and
ratios are only ever formed between configurations of the same run (`paired_ratio`).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


@dataclasses.dataclass
class Timing:
  """Seconds per call of one configuration: all samples and their summary statistics."""

  name: str
  samples: list[float]
  compile_s: float = float("nan")
  cpu_samples: list[float] = dataclasses.field(default_factory=list)  # process CPU seconds per call, all threads

  def cpu(self) -> Timing:
    """The CPU seconds of the same calls as a Timing (for the statistics and ratios below): under load from
    other processes a call's CPU time varies less than its wall-clock time."""
    return Timing(f"{self.name} (CPU)", self.cpu_samples, self.compile_s)

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
    return {
      "median_s": self.median,
      "iqr_s": self.iqr,
      "q25_s": self.q25,
      "q75_s": self.q75,
      "min_s": self.min,
      "repeats": len(self.samples),
      "samples_s": self.samples,
      "compile_s": self.compile_s,
      **({"cpu_median_s": self.cpu().median, "cpu_samples_s": self.cpu_samples} if self.cpu_samples else {}),
    }


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


def time_interleaved(
  configs: Mapping[str, tuple[Callable, tuple]],
  *,
  repeats: int = 5,
  warmup: int = 1,
  number: int = 1,
  prime: int = 1,
  seed: int = 0,
  log: Callable[[str], None] | None = None,
  progress: Callable[[dict[str, Timing]], None] | None = None,
) -> dict[str, Timing]:
  """Times `fn(*args)` for every (fn, args) in `configs`, interleaving the repeats.

  `progress(timings so far)` is called after each configuration's first calls and after each
  round, so a caller can write what it has before a time limit cuts the run.

  Each fn should already be jitted. The first call (compile + run) is timed separately as
  `compile_s`; then `warmup` more untimed calls; then `repeats` rounds, each round calling
  every configuration once (each sample is the mean of `number` back-to-back calls), in the
  orders of `balanced_orders`, cycled. Each sample's process CPU time (`time.process_time`, all
  threads) is kept beside its wall-clock time (`Timing.cpu`).

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
    if progress:
      progress(out)
  slots = random.Random(seed).sample(names, len(names))  # which config takes which place in the design
  orders = balanced_orders(len(slots))
  for i in range(repeats):
    for n in (slots[j] for j in orders[i % len(orders)]):
      fn, args = configs[n]
      for _ in range(prime):
        block(fn(*args))
      t0, c0 = time.perf_counter(), time.process_time()
      res = fn(*args)
      for _ in range(number - 1):
        res = fn(*args)
      block(res)
      out[n].samples.append((time.perf_counter() - t0) / number)
      out[n].cpu_samples.append((time.process_time() - c0) / number)
    if progress:
      progress(out)
  return out


def paired_ratio(num: Timing, den: Timing) -> float:
  """Median over rounds of num/den for samples taken in the same round (drift-robust)."""
  n = min(len(num.samples), len(den.samples))
  if n == 0:
    return float("nan")
  return float(np.median(np.asarray(num.samples[:n]) / np.asarray(den.samples[:n])))


def median_interval_ranks(n: int, confidence: float = 0.95) -> tuple[int, int] | None:
  """1-based ranks (lo, hi) of the order statistics that bound the median of n independent
  samples of a continuous distribution with at least `confidence` coverage, whatever the
  distribution: the sign-test interval [x_(j), x_(n+1-j)], j the largest rank with
  P(Binomial(n, 1/2) < j) ≤ (1 - confidence) / 2. None when n is too small for any interval."""
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
  tail, cdf, j = (1 - confidence) / 2, 0.0, 0
  for i in range(n + 1):  # cdf = P(B ≤ i - 1) = P(B < i) when rank i is tried
    if cdf > tail:
      break
    j = i
    cdf += math.comb(n, i) / 2**n
  return None if j < 1 else (j, n + 1 - j)


def paired_ratio_interval(num: Timing, den: Timing, confidence: float = 0.95) -> tuple[float, float] | None:
  """Distribution-free `confidence` interval for the median of the same-round ratios num/den
  (the quantity `paired_ratio` estimates), treating the rounds as independent: the
  order-statistic interval of `median_interval_ranks`. None when there are too few rounds
  (fewer than 6 at 95%)."""
  n = min(len(num.samples), len(den.samples))
  ranks = median_interval_ranks(n, confidence)
  if ranks is None:
    return None
  r = np.sort(np.asarray(num.samples[:n]) / np.asarray(den.samples[:n]))
  return float(r[ranks[0] - 1]), float(r[ranks[1] - 1])
