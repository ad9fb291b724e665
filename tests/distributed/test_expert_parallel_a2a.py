"""Expert parallelism by explicit all_to_all (`expert_dispatch="all_to_all"`, s3r.model.moe_ep).

The MoE layer of test_expert_parallel.py (8 experts, top-2, one shared expert; 128 tokens) with
`s3r` and `s3r_ec_dx`, on one device and, traced under expert=8 and expert=4 x data=2 meshes of 8
simulated devices, by the shard_map/all_to_all formulation. Each row's thresholds are drawn at its
global row index and Δ is a pmax over the token axes, and each expert's rows arrive complete and
in one-device order on one device, so the layer output and the gradients of every expert weight
and shared weight are bitwise the one-device ones.

Not bitwise: the gradient of the routing weights. The one-device program's reverse-mode gradient
of the routing weights (Σ_D out · ∂L/∂y per row, from bf16 expert outputs) carries an error at
the scale of bf16 rounding relative to the f32 value that the all_to_all program computes and that
forward-mode differentiation of either program gives; it reaches the router's gradient and,
through the router, the input's. Bound: one bf16 rounding (relative 2^-9) of each factor of each
term, so 2^-8 of the largest entry; the input gradient is bf16 itself, so the same relative bound
is its resolution. The load-balancing loss averages the router probabilities over the tokens in
another order (a reduction over 128 tokens in f32: 128 ulp of its value bounds it).

The tests that run the 8-device worker are slow-marked (a few minutes of compilation; the opt-in
dispatch stays out of the default suite): `python -m pytest -m slow
tests/distributed/test_expert_parallel_a2a.py`.

With `act_dtype="float32"` (the unquantized recipe's operands in float32) the all_to_all program computes the
one-device float32 layer to f32 rounding.
"""

import numpy as np
import pytest

from s3r.model.config import MoeFields
from tests.distributed.conftest import run_worker

MESHES = ("expert=8", "expert=4,data=2")
RECIPES = ("s3r", "s3r_ec_dx")
BITWISE = ("d_gate", "d_up", "d_down", "d_shared_gate", "d_shared_up", "d_shared_down", "y")
BF16_RESOLUTION = ("d_router", "dx")


@pytest.fixture(scope="module")
def a2a_runs(tmp_path_factory):
  out = tmp_path_factory.mktemp("moe_a2a")
  info = run_worker("moe_a2a", out, timeout=900)
  load = lambda recipe, mesh: dict(np.load(out / f"moe_a2a_{recipe}_{mesh}.npz"))
  return info, load


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_all_to_all_expert_and_shared_gradients_and_output_are_bitwise_the_one_device_ones(a2a_runs, recipe):
  _, load = a2a_runs
  ref = load(recipe, "1")
  for mesh in MESHES:
    got = load(recipe, mesh)
    for name in BITWISE:
      np.testing.assert_array_equal(got[name], ref[name], err_msg=f"{recipe} {name} on {mesh}")
    assert float(got["dropped_fraction"]) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_all_to_all_router_and_input_gradients_agree_within_bf16_resolution(a2a_runs, recipe):
  _, load = a2a_runs
  ref = load(recipe, "1")
  for mesh in MESHES:
    got = load(recipe, mesh)
    for name in BF16_RESOLUTION:
      bound = 2.0**-8 * np.abs(ref[name]).max()
      np.testing.assert_allclose(got[name], ref[name], rtol=0, atol=bound, err_msg=f"{recipe} {name} on {mesh}")
    lb = float(ref["load_balance_loss"])
    assert abs(float(got["load_balance_loss"]) - lb) <= 128 * np.finfo(np.float32).eps * abs(lb)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_the_all_to_all_program_exchanges_the_rows_with_all_to_all_collectives(a2a_runs, recipe):
  """Forward: rows, their (global row, expert) indices, outputs back; backward: the transposes of
  the two row exchanges. The compiled gradient program keeps them as all-to-all collectives."""
  info, _ = a2a_runs
  for mesh in MESHES:
    assert info[f"{recipe}_{mesh}_jaxpr_all_to_all"] == 5
    assert info[f"{recipe}_{mesh}_collectives"].get("all-to-all", 0) >= 5


@pytest.mark.slow
def test_all_to_all_with_float32_activations_computes_the_one_device_float32_layer(tmp_path):
  """act_dtype float32 reaches the expert GEMMs of the all_to_all program as it does the one-device ones (the
  unquantized recipe, whose operands are in act_dtype): output and gradients agree to f32 reductions in another
  order (128 ulp of the largest entry), far inside the bf16-activation layer's distance from them."""
  run_worker("moe_a2a_act_dtype", tmp_path, timeout=900)
  load = lambda dtype, mesh: dict(np.load(tmp_path / f"moe_a2a_dtype_{dtype}_{mesh}.npz"))
  ref, got, bf16 = load("float32", "1"), load("float32", "expert=4,data=2"), load("bfloat16", "1")
  f32 = 128 * np.finfo(np.float32).eps
  for name in (*BITWISE, *BF16_RESOLUTION):
    assert got[name].dtype == np.float32, name
    scale = np.abs(ref[name]).max()
    np.testing.assert_allclose(got[name], ref[name], rtol=0, atol=f32 * scale, err_msg=name)
    assert np.abs(bf16[name].astype(np.float32) - ref[name]).max() > 2.0**-12 * scale, name  # bf16 is visible


def test_expert_dispatch_is_validated_with_the_field_and_the_allowed_values():
  from s3r.model.moe_settings import MoeSettings
  from s3r.model.presets import preset

  kw = dict(d_model=8, d_expert=8, n_experts=4, top_k=2)
  with pytest.raises(ValueError, match=r"expert_dispatch must be one of \('gspmd', 'all_to_all'\), got 'ragged'"):
    MoeSettings(**kw, expert_dispatch="ragged")
  with pytest.raises(ValueError, match=r"Qwen3MoeConfig.expert_dispatch must be one of"):
    preset("moe-tiny", expert_dispatch="ragged")
  with pytest.raises(ValueError, match="dropless: capacity_factor must be None"):
    preset("moe-tiny", expert_dispatch="all_to_all", capacity_factor=1.0)
  with pytest.raises(ValueError, match="dropless: capacity_factor must be None"):
    MoeSettings(**kw, expert_dispatch="all_to_all", capacity_factor=1.0)
  cfg = preset("moe-tiny", expert_dispatch="all_to_all")
  assert isinstance(cfg, MoeFields) and cfg.expert_dispatch == "all_to_all"


def test_the_all_to_all_token_and_expert_axes_are_those_of_the_sharding_rules():
  from s3r.model import moe_ep
  from s3r.train.step import sharding

  assert sharding.RULES["batch"] == moe_ep.TOKEN_AXES
  assert sharding.RULES["expert"] == moe_ep.EXPERT_AXIS
