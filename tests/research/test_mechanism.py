"""Prop. 1 per projection: the exact local errors agree with the project's quantizer sampled over keys,
and follow sqrt((1 + ρ) / 2) when the residuals are spread evenly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research import evalsize, mechanism
from s3r.quant import gradient_codes, numerics


def _layer(seed, *, common=0.0, t=64, k=24, n=40):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((1, t, k)).astype(np.float32)
  w = (rng.standard_normal((k, n)) + common * rng.standard_normal((k, 1))).astype(np.float32)
  g = rng.standard_normal((1, t, n)).astype(np.float32)
  return x, w, g


def test_common_row_statistic_bounds():
  assert mechanism.common_row_statistic(np.ones((3, 8))) == pytest.approx(8)
  assert mechanism.common_row_statistic(np.array([[1.0, -1.0], [2.0, -2.0]])) == pytest.approx(0)


def test_exact_s3r_dx_error_matches_sampled_quantizer():
  x, w, g = _layer(0)
  res = mechanism.local_errors(x, w, g, tokens=64)
  sx = numerics.absmax_scale(jnp.asarray(x), axis=-1)
  sw = numerics.absmax_scale(jnp.asarray(w), axis=0)
  wq = np.asarray(numerics.quantize_rtne(jnp.asarray(w), sw), np.float64)
  codes = jax.jit(lambda key: gradient_codes(jnp.asarray(x), jnp.asarray(w), jnp.asarray(g), key=key, recipe="s3r"))
  gp = np.asarray(sx[..., None] * g * sw, np.float64)[0]
  exact_norm = np.linalg.norm((gp @ wq.T) / np.asarray(sx, np.float64)[0][:, None])
  sq = []
  for key in jax.random.split(jax.random.key(1), 400):
    q, _, delta = codes(key)
    err = (float(delta) * np.asarray(q, np.float64)[0] - gp) @ wq.T / np.asarray(sx, np.float64)[0][:, None]
    sq.append(np.sum(err**2))
  sq = np.asarray(sq)
  mean, se = sq.mean(), sq.std(ddof=1) / np.sqrt(len(sq))
  assert abs(mean - (res["dx"]["s3r"] * exact_norm) ** 2) < 5 * se


def test_dx_ratio_follows_common_row_prediction_and_dw_is_unchanged():
  for common, tol in ((0.0, 0.05), (1.0, 0.1)):
    res = mechanism.local_errors(*_layer(2, common=common, n=64), tokens=64)
    assert res["dx_ratio"] == pytest.approx(res["dx_ratio_pred"], rel=tol)
    assert res["dw_ratio"] == pytest.approx(1.0, abs=0.01)
    assert res["ec_ratio"] < 1
  assert mechanism.local_errors(*_layer(2, common=1.0, n=64), tokens=64)["rho"] > 10


def test_sixteen_batch_standard_error_matches_random_subsets():
  rng = np.random.default_rng(0)
  per_batch = rng.gamma(5.0, 0.2, 400)
  stats = evalsize.subset_stats(per_batch, np.arange(16))
  means = [per_batch[rng.choice(400, 16, replace=False)].mean() for _ in range(4000)]
  assert stats["subset_se"] == pytest.approx(np.std(means), rel=0.08)
  assert stats["difference"] == pytest.approx(per_batch[:16].mean() - per_batch.mean())


def test_paired_checkpoints_difference_has_smaller_se_when_batches_correlate():
  rng = np.random.default_rng(1)
  level = rng.normal(5.0, 0.2, 300)
  a = {"run": "r", "step": 1, "n_batches": 300, "per_batch": (level + rng.normal(0, 0.01, 300)).tolist()}
  b = {"run": "r", "step": 2, "n_batches": 300, "per_batch": (level - 0.1 + rng.normal(0, 0.01, 300)).tolist()}
  (pair,) = evalsize.paired_checkpoints([a, b])
  single = evalsize.subset_stats(np.asarray(a["per_batch"]), np.arange(16))
  assert pair["full"] == pytest.approx(-0.1, abs=0.005) and pair["correlation"] > 0.9
  assert pair["subset_se"] < single["subset_se"] / 5


def test_provenance_command_has_no_absolute_paths():
  from labtools import results

  assert results.repo_relative("/somewhere/else/runs/sweeps/x") == "runs/sweeps/x"
  assert results.repo_relative("relative/path") == "relative/path"
