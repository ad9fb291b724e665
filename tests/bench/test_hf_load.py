"""`python -m benchmarks hf_load`: the synthetic checkpoint it measures and one measurement (no timing is checked)."""

from __future__ import annotations

import jax
import numpy as np

from benchmarks import hf_load
from s3r import model as M


def test_the_synthetic_checkpoint_has_the_presets_layout_and_size(tmp_path):
  size = hf_load.write_checkpoint(tmp_path / "ckpt", "llama-tiny", 1)
  cfg, params = M.load_hf(tmp_path / "ckpt", dtype=np.float32)
  want = M.preset("llama-tiny", layers=1)
  assert cfg == want
  shapes = jax.eval_shape(lambda: M.init_params(want, jax.random.key(0)))
  assert jax.tree.map(lambda x: x.shape, params) == jax.tree.map(lambda x: x.shape, shapes)
  n = sum(x.size for x in jax.tree.leaves(params))
  assert n * 2 < size < n * 2 + 2**16  # bf16 data plus the header
  assert all(np.all(np.isfinite(np.asarray(x))) and np.std(np.asarray(x)) > 0.01 for x in jax.tree.leaves(params))


def test_a_measurement_reports_the_load_time_and_both_peaks(tmp_path):
  hf_load.write_checkpoint(tmp_path / "ckpt", "llama-tiny", 1)
  for kind in ("plain read", "load_hf bf16 + save_hf"):
    r = hf_load.measure(kind, tmp_path / "ckpt")
    assert r["kind"] == kind and r["load_s"] > 0 and r["peak_rss_bytes"] > r["peak_anon_bytes"] >= 0
  assert r["export_s"] > 0 and M.hf_config(tmp_path / "export") == M.hf_config(tmp_path / "ckpt")
  summary = hf_load.summarize([r, {**r, "load_s": 3 * r["load_s"]}], size=1000)
  assert summary["load_s"] == 2 * r["load_s"] and summary["peak_anon_x_checkpoint"] == r["peak_anon_bytes"] / 1000
