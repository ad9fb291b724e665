"""Mesh-independent randomness (partitionable Threefry) and the global step Δ.

One qmatmul on 1 device and on 8 devices as pure FSDP (8x1), mixed (4x2, 2x4) and pure TP
(1x8), with the token dims of x and of the upstream gradient sharded over all 8 devices
(B over fsdp, S over tensor) and the weight sharded as in `s3r train`: the thresholds u,
the int8 codes Q and the step Δ are bitwise identical on every mesh, and drawing the random
numbers adds no collective. The `tiny` train steps on other meshes (losses bounded, the global Δ
of every projection) are read in test_tensor_parallel.py, from the same runs as its collectives.
"""

from collections import Counter

import numpy as np
import pytest

from tests.distributed.conftest import run_worker

MESHES = ("8x1", "4x2", "2x4", "1x8")
RECIPES = ("s3r", "s3r_bcast", "int8_sr", "s3r_ec")
EXACT_GRAD_RECIPES = ("s3r", "s3r_bcast", "int8_sr", "int8_rtne")


@pytest.fixture(scope="module")
def qmatmul_runs(tmp_path_factory):
  out = tmp_path_factory.mktemp("qmatmul")
  info = run_worker("qmatmul", out)
  return info, {m: dict(np.load(out / f"qmatmul_{m}.npz")) for m in info}


def test_thresholds_and_codes_are_bitwise_identical_on_every_mesh(qmatmul_runs):
  _, arrays = qmatmul_runs
  ref = arrays["1"]
  assert ref["u_token"].shape == (8, 16, 1) and ref["u_example"].shape == (8, 1, 1)
  assert len(np.unique(ref["u_token"])) > 32  # 128 tokens draw many of the 128 levels
  for recipe in RECIPES:
    assert ref[f"{recipe}_q_dx"].dtype == np.int8 and np.count_nonzero(ref[f"{recipe}_q_dx"]) > 1000
  for mesh in MESHES:
    for name in ["u_token", "u_example"] + [f"{r}_{q}" for r in RECIPES for q in ("q_dx", "q_dw")]:
      np.testing.assert_array_equal(arrays[mesh][name], ref[name], err_msg=f"{name} on {mesh}")


def test_the_step_delta_is_the_global_max_on_every_mesh(qmatmul_runs):
  """Δ = max|G'|/127 over all shards: bitwise the one-device Δ (a per-shard max would differ)."""
  _, arrays = qmatmul_runs
  for recipe in RECIPES:
    ref = arrays["1"][f"{recipe}_delta"]
    assert ref.shape == () and ref > 0
    for mesh in MESHES:
      assert arrays[mesh][f"{recipe}_delta"] == ref, (recipe, mesh)


def test_quantized_gradients_are_bitwise_identical_without_ec_and_within_an_ulp_with_ec(qmatmul_runs):
  """dX and dW of the S3R, independent-SR and RTNE recipes are bitwise equal on every mesh: the
  int8 GEMMs accumulate in int32, whose cross-device sums are exact. S3R-EC adds float means of
  the rounding error over the channels and tokens (r, c, m); when N or S is sharded, XLA sums
  those in another order, so dX and dW may differ in the last bit (bounded at 4 ulp of the
  largest entry; observed: at most one ulp)."""
  _, arrays = qmatmul_runs
  ref = arrays["1"]
  for mesh in MESHES:
    for recipe in EXACT_GRAD_RECIPES:
      for g in ("dx", "dw"):
        np.testing.assert_array_equal(
          arrays[mesh][f"{recipe}_{g}"], ref[f"{recipe}_{g}"], err_msg=f"{recipe} {g} {mesh}"
        )
    for g in ("dx", "dw"):
      r, got = ref[f"s3r_ec_{g}"], arrays[mesh][f"s3r_ec_{g}"]
      np.testing.assert_allclose(got, r, rtol=0, atol=4 * np.finfo(np.float32).eps * np.abs(r).max())


def _signature(collectives):
  return sorted((c["kind"], c["dtype"], str(c["shapes"])) for c in collectives)


def test_drawing_the_thresholds_adds_no_collective(qmatmul_runs):
  """The thresholds of a sharded token range are computed where they are used: the threshold
  program has no collective, and the S3R backward moves exactly what the deterministic RTNE
  backward moves (no random number crosses a device). Independent SR moves its second int8
  code tensor Q2 as well (it quantizes G' twice), but no random number either."""
  info, _ = qmatmul_runs
  for mesh in MESHES:
    assert info[mesh]["u_token_collectives"] == 0 and info[mesh]["u_example_collectives"] == 0
    rtne = _signature(info[mesh]["int8_rtne_grad_collectives"])
    assert rtne, "the sharded backward needs collectives (Δ, dW, dX)"
    for recipe in ("s3r", "s3r_bcast"):
      assert _signature(info[mesh][f"{recipe}_grad_collectives"]) == rtne, (recipe, mesh)
    extra = Counter(_signature(info[mesh]["int8_sr_grad_collectives"])) - Counter(rtne)
    assert all(dtype == "s8" for _, dtype, _ in extra), (mesh, extra)
