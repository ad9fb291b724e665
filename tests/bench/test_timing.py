"""The timing harness: interleaved repeats in balanced orders, paired ratios (no timing asserts)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from benchmarks import timing
from benchmarks.options import DEFAULT_TOKENS, parse_shapes, tokens_for


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_balanced_orders_put_every_config_right_before_every_other_equally_often(n):
  orders = timing.balanced_orders(n)
  assert len(orders) == (n if n % 2 == 0 else 2 * n)
  assert all(sorted(o) == list(range(n)) for o in orders)
  pairs = collections.Counter((o[k], o[k + 1]) for o in orders for k in range(n - 1))
  assert set(pairs) == {(i, j) for i in range(n) for j in range(n) if i != j}
  assert len(set(pairs.values())) <= 1  # every ordered pair equally often


def test_time_interleaved_times_each_config_once_per_round_in_balanced_orders():
  order = []
  names = ("a", "b", "c", "d")
  fns = {n: ((lambda n=n: order.append(n) or 0), ()) for n in names}
  out = timing.time_interleaved(fns, repeats=8, warmup=1, number=2, prime=0)
  assert list(out) == list(names)  # results in the caller's order
  assert all(len(t.samples) == 8 for t in out.values())
  timed = order[2 * len(names) :]  # after the compile call + warm-up of each config
  assert all(timed[i] == timed[i + 1] for i in range(0, len(timed), 2))  # `number` calls back to back
  rounds = [timed[i : i + 2 * len(names) : 2] for i in range(0, len(timed), 2 * len(names))]
  assert all(sorted(r) == list(names) for r in rounds)  # every config once per round
  pairs = collections.Counter((r[k], r[k + 1]) for r in rounds for k in range(len(names) - 1))
  assert len(pairs) == 12 and set(pairs.values()) == {2}  # 8 rounds = the 4-round design twice
  # the seed only relabels the design: another seed gives another order, the same seed the same
  again = []
  fns2 = {n: ((lambda n=n: again.append(n) or 0), ()) for n in names}
  timing.time_interleaved(fns2, repeats=8, warmup=1, number=2, prime=0, seed=1)
  assert again[2 * len(names) :] != timed
  again.clear()
  timing.time_interleaved(fns2, repeats=8, warmup=1, number=2, prime=0)
  assert again == order
  # by default one untimed call of the same configuration precedes each sample
  order.clear()
  timing.time_interleaved(fns, repeats=2, warmup=0, number=2)
  timed = order[len(names) :]
  assert all(timed[i : i + 3] == [timed[i]] * 3 for i in range(0, len(timed), 3))
  t = out["a"]
  assert t.q25 <= t.median <= t.q75 and t.iqr >= 0
  assert set(t.as_dict()) >= {"median_s", "iqr_s", "samples_s", "compile_s"}


def test_time_interleaved_records_process_cpu_time_beside_wall_time():
  import time

  def busy():
    end = time.process_time() + 0.01
    while time.process_time() < end:
      pass

  fns = {"sleep": ((lambda: time.sleep(0.02)), ()), "busy": (busy, ())}
  out = timing.time_interleaved(fns, repeats=3, warmup=0, prime=0)
  for t in out.values():
    assert len(t.cpu_samples) == len(t.samples) == 3
    assert t.cpu().samples == t.cpu_samples and "cpu_median_s" in t.as_dict()
  assert all(c < 0.5 * w for c, w in zip(out["sleep"].cpu_samples, out["sleep"].samples, strict=True))  # idle
  assert all(c >= 0.01 for c in out["busy"].cpu_samples)  # spinning costs CPU time whatever the load


def test_parse_shapes_accepts_paper_and_custom_shapes():
  assert parse_shapes("W1,W9") == {"W1": (512, 2048), "W9": (8192, 28672)}
  assert parse_shapes("64x128") == {"64x128": (64, 128)}
  assert len(parse_shapes("all")) == 9
  assert tokens_for("W1", None) == DEFAULT_TOKENS["W1"]
  assert tokens_for("64x128", 32) == 32


def test_paired_ratio_is_the_median_of_same_round_ratios():
  num, den = timing.Timing("a", [2.0, 9.0, 3.0]), timing.Timing("b", [1.0, 3.0, 1.0, 5.0])
  assert timing.paired_ratio(num, den) == 3.0  # ratios 2, 3, 3 over the three common rounds
  assert timing.paired_ratio(timing.Timing("c", []), den) != timing.paired_ratio(timing.Timing("c", []), den)  # nan


@pytest.mark.parametrize("n, ranks", [(5, None), (6, (1, 6)), (15, (4, 12)), (40, (14, 27))])
def test_median_interval_ranks_are_the_sign_test_ranks(n, ranks):
  # 6 rounds: P(Bin(6, 1/2) = 0) = 1/64 ≤ 0.025 < 7/64; 15: P(B ≤ 3) = 0.018 ≤ 0.025 < P(B ≤ 4) = 0.059
  assert timing.median_interval_ranks(n) == ranks


def test_paired_ratio_interval_covers_the_true_median_ratio_at_least_95_percent_of_the_time():
  """Rounds whose ratio is 1.1 · lognormal noise (true median 1.1) times a shared per-round drift:
  the interval must hold 1.1 in ≥ 95% of 2000 runs of 15 rounds. Its exact coverage at n = 15 is
  1 - 2·P(B ≤ 3) = 0.9648; the test fails below 0.95 - 3σ of a binomial proportion at 0.95 over
  2000 runs (σ = 0.0049), so a wrong rank (coverage 0.88 at ranks 5-11) cannot pass."""
  rng = np.random.default_rng(0)
  runs, n, hits = 2000, 15, 0
  for _ in range(runs):
    drift = rng.lognormal(0, 0.3, n)
    den = timing.Timing("b", list(drift * rng.lognormal(0, 0.05, n)))
    num = timing.Timing("a", list(np.asarray(den.samples) * 1.1 * rng.lognormal(0, 0.1, n)))
    interval = timing.paired_ratio_interval(num, den)
    assert interval is not None  # 15 rounds are enough
    lo, hi = interval
    hits += lo <= 1.1 <= hi
  assert hits / runs >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / runs)


def test_paired_ratio_interval_needs_six_rounds_at_95_percent():
  den = timing.Timing("b", [1.0] * 5)
  assert timing.paired_ratio_interval(timing.Timing("a", [2.0] * 5), den) is None
  with pytest.raises(ValueError, match="confidence"):
    timing.median_interval_ranks(10, confidence=1.0)


def test_progress_sees_each_configuration_after_its_first_calls_and_every_round():
  seen = []
  configs = {n: (lambda: 0, ()) for n in ("a", "b", "c")}
  timing.time_interleaved(
    configs, repeats=4, warmup=0, prime=0, progress=lambda t: seen.append({n: len(v.samples) for n, v in t.items()})
  )
  assert len(seen) == 3 + 4  # one per configuration compiled, then one per round
  assert seen[2] == dict.fromkeys("abc", 0) and seen[3] == dict.fromkeys("abc", 1)
  assert seen[-1] == dict.fromkeys("abc", 4)
