"""Expert parallelism: an MoE layer's gradients on one device and on expert x data meshes.

One MoE layer (8 experts, top-2, one shared expert; 128 tokens) with `s3r` and `s3r_ec_dx`, on
one device and on 8 devices as expert=8 and expert=2 x data=4 (tokens over
(data, expert), expert weights over expert, as `s3r train --mesh` shards them). The rounding
thresholds are drawn from the global row index (partitionable Threefry), not from the device,
so the int8 codes, and with them the output and every quantized gradient (expert and shared
weights, the input), are bitwise the one-device ones; the int8 GEMMs accumulate in int32, whose
cross-device sums are exact. The router's f32 gradient and the load-balancing loss are summed
over tokens in another order on a sharded mesh (bounded at 4 ulp, of the router gradient's
largest entry and of the loss; observed: one ulp).

The all-FP8 recipe (`s3r_ec_dx@e5m2+fwd_e4m3`, slow): the output, the input's and the experts' gradients
are bitwise the one-device ones on both meshes too; the shared expert's dW, a dense FP8 GEMM whose f32
partial sums over token shards are added in a mesh-dependent order, agrees to 8 ulp of its largest entry.

Each recipe runs in its own 8-device worker (about 30 s); the default suite runs `s3r_ec_dx`, whose
error-correction factors add collectives of their own, and `s3r` is slow.
"""

import numpy as np
import pytest

import s3r
from tests.distributed.conftest import run_worker

MESHES = ("expert=8", "expert=2,data=4")  # pure expert and expert x data (4,2: test_expert_parallel_a2a.py)
RECIPES = (
  pytest.param("s3r", marks=pytest.mark.slow),
  "s3r_ec_dx",
  pytest.param("s3r_ec_dx@e5m2+fwd_e4m3", marks=pytest.mark.slow),  # all-FP8: E4M3 forward, E5M2 gradients
)


@pytest.fixture(scope="module")
def moe_worker_runs(tmp_path_factory):
  """recipe -> (result.json, load(recipe, mesh)) of its worker, run when a test first asks for it."""
  runs = {}

  def of(recipe: str):
    if recipe not in runs:
      out = tmp_path_factory.mktemp(f"moe_{recipe}")
      info = run_worker("moe", out, recipe, timeout=600)
      runs[recipe] = info, lambda recipe, mesh, out=out: dict(np.load(out / f"moe_{recipe}_{mesh}.npz"))
    return runs[recipe]

  return of


@pytest.fixture
def moe_runs(moe_worker_runs, recipe):
  return moe_worker_runs(recipe)


@pytest.mark.parametrize("recipe", RECIPES)
def test_moe_gradients_are_the_same_on_one_device_and_on_expert_x_data_meshes(moe_runs, recipe):
  info, load = moe_runs
  ref = load(recipe, "1")
  for mesh in MESHES:
    assert info[f"{recipe}_{mesh}_gate_spec"] == "P('expert', None, None)"  # the experts are sharded
    got = load(recipe, mesh)
    for name, r in ref.items():
      if name == "d_router":
        np.testing.assert_allclose(got[name], r, rtol=0, atol=4 * np.finfo(np.float32).eps * np.abs(r).max())
      elif name == "load_balance_loss":  # a scalar mean reduced in a mesh-dependent order
        np.testing.assert_allclose(got[name], r, rtol=4 * float(np.finfo(np.float32).eps))
      elif name.startswith("d_shared_") and s3r.recipe(recipe).forward_format == "e4m3":
        # the shared expert is a dense qmatmul whose dW sums its token-sharded rows: FP8 GEMMs accumulate
        # in f32, so the per-shard partial sums are added in a mesh-dependent order (int32 ones are exact)
        np.testing.assert_allclose(got[name], r, rtol=0, atol=8 * np.finfo(np.float32).eps * np.abs(r).max())
      else:
        np.testing.assert_array_equal(got[name], r, err_msg=f"{recipe} {name} on {mesh}")


@pytest.mark.parametrize("recipe", RECIPES)
def test_another_key_changes_the_quantized_gradients(moe_runs, recipe):
  """The bitwise agreement above is not trivial: a different step key moves every quantized
  gradient by percents (the stochastic rounding noise a mesh-dependent threshold would add)."""
  _, load = moe_runs
  ref, other = load(recipe, "1"), load(recipe, "1:other_key")
  for name in ("d_gate", "d_up", "d_down", "d_shared_gate", "dx"):
    assert np.abs(other[name] - ref[name]).max() > 0.01 * np.abs(ref[name]).max(), name
