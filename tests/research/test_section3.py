"""Section III's statements on small synthetic layers, with bounds from the Monte Carlo variance."""

from __future__ import annotations

import numpy as np
import pytest

from research import section3


def test_shared_threshold_variance_is_delta2_over_6_and_covariance_delta2_over_12():
  res = section3.variance_and_covariance(n=64, draws=20_000, seed=1)
  assert res["exact"]["var"] == pytest.approx(1 / 6, rel=1e-3)
  assert res["exact"]["cov"] == pytest.approx(1 / 12, rel=0.02)  # pairs exclude h = h': 1/12 - O(1/N)
  for name in ("uniform", "compact_7bit"):
    (v, dv), (c, dc) = res[name]["var"], res[name]["cov"]
    # 95% half-widths -> 2.5 half-widths is about 5 standard errors
    assert abs(v - res["exact"]["var"]) < 2.5 * dv + 1 / 256
    assert abs(c - res["exact"]["cov"]) < 2.5 * dc + 1 / 256


def test_per_token_sharing_keeps_dw_variance_of_independent_sr():
  res = section3.gradient_variances(t=16, k=8, n=24, draws=3000, seed=2)
  assert res["dw"]["exact_ratio"] == pytest.approx(1.0, abs=1e-12)
  ratio, half = res["dw"]["ratio"]
  assert abs(ratio - 1) < 2.5 * half
  # Monte Carlo summed variances agree with the exact ones
  for topo in ("token", "independent"):
    mean, h = res["dw"][topo]
    assert abs(mean - res["dw"]["exact"][topo]) < 2.5 * h


def test_per_token_sharing_adds_dx_variance_growing_with_common_row_component():
  iid = section3.gradient_variances(t=16, k=8, n=24, draws=2000, seed=3, common=0.0)
  common = section3.gradient_variances(t=16, k=8, n=24, draws=2000, seed=3, common=1.0)
  assert common["rho"] > 5 * iid["rho"]
  assert common["dx"]["exact_ratio"] > 3 * iid["dx"]["exact_ratio"]
  for res in (iid, common):
    ratio, half = res["dx"]["ratio"]
    assert abs(ratio - res["dx"]["exact_ratio"]) < 2.5 * half


def test_centering_makes_some_outputs_noisier_but_lowers_summed_variance():
  _, v, w = section3.synthetic_layer(16, 32, 64, seed=0)
  res = section3.centering_exact(v - np.floor(v), w)
  assert 0 < res["noisier_fraction"] < 0.5
  assert res["summed_variance_drop"] > 0.2
  assert res["ec_over_sr"] < 1


def test_centering_exact_variance_matches_monte_carlo():
  t, n = 4, 32
  _, v, w = section3.synthetic_layer(t, 6, n, seed=4)
  p = v - np.floor(v)
  rng = np.random.default_rng(5)
  draws = 20_000
  e = section3.sr_errors(p[None], rng.random((draws, t, 1)))
  e -= e.mean(axis=2, keepdims=True)
  per_draw = np.sum((e @ w.T) ** 2, axis=(1, 2))
  mean, half = section3.batch_means_ci(per_draw)
  exact = section3.centering_exact(p, w)
  var_sr = np.sum((p * (1 - p)) @ (w**2).T)
  assert abs(mean - exact["ec_over_sr"] * var_sr) < 2.5 * half


def test_three_element_example_matches_paper():
  ex = section3.three_element_example()
  assert ex["first_after"] == pytest.approx(16 / 9) and ex["average_after"] == pytest.approx(8 / 9)
