"""Meshes with Explicit axes ("sharding in types") on 8 simulated devices.

qmatmul with every recipe kind, grouped_qmatmul and a Linen Dense (LinenDotGeneral) run with the
tokens, the output features or the contraction sharded, and give the gradients of the unsharded
program, sharded as their inputs; the NNX miniGPT fixture (tests/nn/minigpt.py) trains with
`s3r.nn.quantize` on a 1-device and on a 4x2 explicit mesh with the same losses and gradients.
Both workers compile dozens of programs on 8 devices (minutes on 2 cores), hence slow-marked; the
one-device explicit mesh is checked in the default suite (tests/nn/test_explicit_axes.py).
"""

import numpy as np
import pytest

from tests.distributed.conftest import run_worker
from tests.distributed.explicit_workers import OPS_LAYOUTS, OPS_RECIPES

EPS = np.finfo(np.float32).eps
K = 64  # the contraction of the explicit_ops operands


@pytest.fixture(scope="module")
def ops_runs(tmp_path_factory):
  out = tmp_path_factory.mktemp("explicit_ops")
  info = run_worker("explicit_ops", out)
  return info, dict(np.load(out / "explicit_ops.npz"))


@pytest.fixture(scope="module")
def minigpt_runs(tmp_path_factory):
  out = tmp_path_factory.mktemp("explicit_minigpt")
  info = run_worker("explicit_minigpt", out, "3")
  grads = {name: dict(np.load(out / f"minigpt_{name.replace(':', '_')}.npz")) for name in info}
  return info, grads


def _bound(recipe: str, ref: np.ndarray) -> float:
  """How far a gradient may move when the partitioner sums in another order. Integer GEMMs sum
  int32 exactly: none (S3R-EC's float means of the rounding error: 4 ulp of the largest entry, as
  in test_mesh_independence.py). f32 products (int8_exact_bwd): a reordered K-term sum moves by at
  most K ulp of the largest term. bf16: the partial products are rounded to bf16 per shard (one
  bf16 ulp, 2^-8, of the largest entry, twice: once per partial sum and once for the total)."""
  top = float(np.abs(ref).max())
  if recipe == "bf16":
    return 2 * 2.0**-8 * top
  if recipe == "int8_exact_bwd":
    return float(K * EPS * top)
  if recipe.startswith("s3r_ec"):
    return float(4 * EPS * top)
  return 0.0


@pytest.mark.slow
def test_every_recipe_gives_the_unsharded_gradients_under_explicit_axes(ops_runs):
  _, arrays = ops_runs
  for layout in OPS_LAYOUTS:
    for name in (*OPS_RECIPES, "grouped", "linen"):
      recipe = name if name in OPS_RECIPES else "s3r"
      for i in (0, 1):
        ref, got = arrays[f"ref_{name}_{i}"], arrays[f"{layout}_{name}_{i}"]
        assert np.count_nonzero(ref) > ref.size // 2, (name, i)
        np.testing.assert_allclose(got, ref, rtol=0, atol=_bound(recipe, ref), err_msg=f"{layout} {name} grad {i}")


@pytest.mark.slow
def test_results_and_gradients_carry_the_shardings_of_a_plain_product(ops_runs):
  """y is sharded as x @ w (x's leading dims; w's output features unless x already uses that mesh
  axis) and dX, dW exactly as x and w."""
  info, _ = ops_runs
  expected_y = {
    "tokens_columns": "P('batch', None, 'model')",
    "tokens_both_axes": "P('batch', 'model', None)",
    "contraction": "P('batch', None, None)",
  }
  for layout in OPS_LAYOUTS:
    for name in (*OPS_RECIPES, "linen"):
      entry = info[f"{layout}_{name}"]
      assert entry["y"] == expected_y[layout], (layout, name)
      assert entry["grads"] == entry["inputs"], (layout, name)
    grouped = info[f"{layout}_grouped"]
    assert grouped["grads"] == grouped["inputs"], layout


@pytest.mark.slow
def test_minigpt_trains_with_the_same_losses_and_gradients_on_one_and_eight_devices(minigpt_runs):
  """The miniGPT fixture, quantized with s3r.nn.quantize, trains under explicit meshes of 1 and 8
  devices (kernels sharded over "model"). bf16: the gradients agree to float reordering. s3r_ec_dx:
  float sums in another order can flip a rare stochastic rounding, so the gradients are compared
  with the rounding noise itself (the same step with another key): the difference between meshes is
  below a twentieth of it."""
  info, grads = minigpt_runs
  assert info["8:s3r_ec_dx"]["devices"] == 8 and info["8:s3r_ec_dx"]["kernel_spec"] == "P(None, 'model')"
  for name, run in info.items():
    assert run["losses"][-1] < run["losses"][0] - 0.5, name  # a fixed batch: three steps lower the loss
  # The first loss is computed from the same parameters on both meshes: only the order of float sums
  # differs. Later losses follow Adam steps, whose normalised update turns a reordering difference in a
  # near-zero gradient entry into a step of the full learning rate; they are compared with the rounding
  # noise between two quantizer keys at the same step: the mesh moves the loss by less than a fifth of it.
  noise = np.abs(np.subtract(info["1:s3r_ec_dx:other_key"]["losses"], info["1:s3r_ec_dx"]["losses"]))[1:]
  assert (noise > 1e-3).all(), noise
  for recipe in ("bf16", "s3r_ec_dx"):
    one, eight = info[f"1:{recipe}"]["losses"], info[f"8:{recipe}"]["losses"]
    np.testing.assert_allclose(eight[0], one[0], rtol=1e-5)
    assert (np.abs(np.subtract(eight, one))[1:] < noise / 5).all(), (recipe, one, eight, noise)

  def distance(a: dict, b: dict) -> float:
    return float(np.sqrt(sum(np.sum((a[k] - b[k]) ** 2) for k in a)) / np.sqrt(sum(np.sum(b[k] ** 2) for k in b)))

  # bf16 partial products are rounded to bf16 per shard (see _bound): within two bf16 ulps, relative
  assert distance(grads["8:bf16"], grads["1:bf16"]) < 2 * 2.0**-8
  mesh_gap = distance(grads["8:s3r_ec_dx"], grads["1:s3r_ec_dx"])
  noise = distance(grads["1:s3r_ec_dx:other_key"], grads["1:s3r_ec_dx"])
  assert noise > 1e-3, noise  # the rounding noise is visible at this size
  assert mesh_gap < noise / 20, (mesh_gap, noise)
