"""Compact 7-bit thresholds: value set, bit layout and the Δ/256 bias bound."""

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

from s3r.quant import thresholds


def _exact_bias(p: Fraction) -> Fraction:
  """E[floor(p + u)] - p over the 128 equally likely thresholds u = (k + 1/2)/128."""
  hits = sum(1 for k in range(128) if p + Fraction(2 * k + 1, 256) >= 1)
  return Fraction(hits, 128) - p


def test_threshold_rounding_bias_is_at_most_a_256th_of_a_step():
  # E[floor(p+u)] is a step function of p that jumps at the 128 points 1 - (k+1/2)/128, and
  # p is linear, so the largest |bias| is reached at a jump; checking both sides of every
  # jump and a fine rational grid is exact.
  jumps = [1 - Fraction(2 * k + 1, 256) for k in range(128)]
  eps = Fraction(1, 10**9)
  grid = [Fraction(i, 4096) for i in range(4096)]
  points = grid + jumps + [j - eps for j in jumps if j - eps >= 0]
  worst = max(abs(_exact_bias(p)) for p in points)
  assert worst <= Fraction(1, 256)
  assert worst > Fraction(1, 256) - Fraction(1, 10**6)  # the bound is tight: the half-step shift is needed


def test_without_half_step_shift_the_bias_would_be_twice_as_large():
  p = Fraction(1, 128) - Fraction(1, 10**9)  # just below the first jump of u = k/128
  hits = sum(1 for k in range(128) if p + Fraction(k, 128) >= 1)
  assert abs(Fraction(hits, 128) - p) > Fraction(1, 256) * Fraction(19, 10)


def test_compact_thresholds_take_four_7bit_values_from_each_word():
  key = jax.random.key(7)
  count = 37
  u = np.asarray(thresholds.compact_uniform(key, count))
  words = np.asarray(jax.random.bits(key, (thresholds.words_needed(count),), jnp.uint32))
  expected = [((int(w) >> (8 * j)) & 0x7F) for w in words for j in range(4)][:count]
  np.testing.assert_array_equal(u, (np.asarray(expected, np.float32) + 0.5) / 128)
  assert thresholds.words_needed(count) == 10


def test_threshold_values_cover_all_128_levels_uniformly():
  u = np.asarray(thresholds.compact_uniform(jax.random.key(0), 4 * 128 * 64))
  levels, counts = np.unique(u, return_counts=True)
  np.testing.assert_array_equal(levels, np.asarray(thresholds.threshold_values()))
  # chi-square goodness of fit at alpha = 1e-6 (127 degrees of freedom: critical value ~ 221)
  expected = u.size / 128
  chi2 = float(((counts - expected) ** 2 / expected).sum())
  assert chi2 < 221.0


def test_topologies_have_one_threshold_per_token_or_per_example():
  key = jax.random.key(1)
  assert thresholds.shared_thresholds(key, 3, 5, "token").shape == (3, 5, 1)
  assert thresholds.shared_thresholds(key, 3, 5, "example").shape == (3, 1, 1)


def test_threefry_partitionable_is_on():
  assert jax.config.jax_threefry_partitionable
