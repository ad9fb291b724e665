"""The quantizer bench runs the same quantizer as qmatmul's backward, and writes its results."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import cli, quantizer
from s3r import qmatmul
from s3r.quant import numerics


@pytest.mark.parametrize("recipe", ["int8_rtne", "int8_sr", "s3r"])
def test_quantize_gradient_matches_qmatmul_backward(recipe):
  t, k, n = 16, 24, 32
  kx, kw, kg, key = jax.random.split(jax.random.key(3), 4)
  x = jax.random.normal(kx, (t, k), jnp.float32).astype(jnp.bfloat16)
  w = jax.random.normal(kw, (k, n), jnp.float32)
  g = jax.random.normal(kg, (t, n), jnp.float32).astype(jnp.bfloat16)
  _, vjp = jax.vjp(lambda x, w: qmatmul(x, w, key=key, recipe=recipe), x, w)
  dx, _ = vjp(g)
  sx = numerics.absmax_scale(x, axis=1)
  sw = numerics.absmax_scale(w, axis=0)
  wq = numerics.quantize_rtne(w, sw[None, :])
  q_dx, _, delta, _ = quantizer.quantize_gradient(recipe, g[None], sx[None], sw, key)
  acc = jnp.dot(q_dx[0].astype(jnp.int32), wq.astype(jnp.int32).T).astype(jnp.float32)
  expected = (acc * (delta / sx)[:, None]).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(dx, np.float32), np.asarray(expected, np.float32))


def test_quantizer_outputs_per_recipe():
  g, sx, sw, key = quantizer.make_inputs(8, 16)
  out = quantizer.make_quantizer("int8_sr")(g, sx, sw, key)
  assert out[0].dtype == jnp.int8 and out[1].dtype == jnp.int8  # two Qs
  out = quantizer.make_quantizer("s3r")(g, sx, sw, key)
  assert out[1] is None and out[3] is None
  r, c, m = quantizer.make_quantizer("s3r_ec_dx")(g, sx, sw, key)[3]
  assert (r.shape, c.shape, m.shape) == ((1, 8), (1, 16), (1,))


def test_quantizer_bench_writes_results(tmp_path):
  args = cli.build_parser().parse_args(
    [
      "quantizer",
      "--shapes",
      "64x128",
      "--tokens",
      "32",
      "--repeats",
      "1",
      "--number",
      "1",
      "--warmup",
      "0",
      "--out-dir",
      str(tmp_path),
    ]
  )
  assert args.func(args) == 0
  stem = tmp_path / f"bench_quantizer_{jax.default_backend()}"
  (res,) = json.loads(stem.with_suffix(".json").read_text())["results"]
  assert set(res["configs"]) == {"floor", "floor_2pass", "int8_rtne", "int8_sr", "s3r", "s3r_ec", "s3r_ec_dx"}
  assert res["configs"]["int8_sr"]["q_tensors"] == 2 and res["configs"]["s3r"]["q_tensors"] == 1
  assert res["configs"]["floor"]["time_vs_floor"] == 1.0
  assert stem.with_suffix(".md").exists() and stem.with_suffix(".png").exists()
