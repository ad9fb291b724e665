"""The s3r MaxText backend's config values, refusals and tensor-parallel reading, without MaxText installed
(the backend module imports MaxText only in `register()`); the MaxText runs are in test_maxtext.py."""

import types
from typing import Any, cast

import pytest

import s3r
from s3r.integrations import maxtext as smt


def _config(**kw):
  base = dict(quantization="s3r:s3r_ec_dx", use_qwix_quantization=False, use_batch_split_schedule=False, num_experts=1)
  return types.SimpleNamespace(**(base | kw))


def _parse(value: str) -> s3r.Recipe:
  """The recipe an s3r quantization value selects (every value parsed here is one)."""
  recipe = smt.parse(value)
  assert recipe is not None, value
  return recipe


def _backend(config, **kwargs) -> smt.S3rQuantization:
  """The s3r backend of a config whose quantization is an s3r value."""
  backend = smt.backend(config, **kwargs)
  assert backend is not None
  return backend


def test_values_select_every_recipe_by_name_and_s3r_alone_the_default():
  values = smt.quantization_values()
  assert _parse("s3r").name == s3r.DEFAULT_RECIPE
  for name in s3r.RECIPES:
    assert f"s3r:{name}" in values
    assert _parse(f"s3r:{name}").name == name
  assert _parse("s3r:s3r_ec_dx@int4").grad_format == "int4"
  for fmt in ("e4m3", "e5m2"):  # FP8 gradients
    assert f"s3r:s3r_ec_dx@{fmt}" in values and _parse(f"s3r:s3r_ec_dx@{fmt}").grad_format == fmt
  all_fp8 = _parse("s3r:s3r_ec_dx@e5m2+fwd_e4m3")  # E4M3 forward and E5M2 gradients
  assert "s3r:s3r_ec_dx@e5m2+fwd_e4m3" in values and (all_fp8.forward_format, all_fp8.grad_format) == ("e4m3", "e5m2")
  assert "s3r:s3r@e4m3+fwd_e4m3" in values and "s3r:bf16+fwd_e4m3" not in values
  assert "s3r:bf16@int4" not in values  # bf16 has no quantized gradient, so no gradient format
  assert len(set(values)) == len(values)


@pytest.mark.parametrize("value", ["", "int8", "fp8_full", None, "s3rx", "s3r_ec_dx"])
def test_values_of_other_backends_are_left_to_maxtext(value):
  assert smt.parse(value) is None
  assert smt.backend(_config(quantization=value)) is None


def test_an_unknown_recipe_name_raises_naming_the_value():
  with pytest.raises(ValueError, match=r"quantization='s3r:s3r_ecdx': unknown recipe 's3r_ecdx'"):
    _parse("s3r:s3r_ecdx")


def test_backend_builds_the_recipe_and_refuses_what_it_does_not_cover():
  assert _backend(_config(quantization="s3r:int8_sr")).recipe.name == "int8_sr"
  assert _backend(_config(num_experts=4, sparse_matmul=True, megablox=True)).recipe.name == "s3r_ec_dx"
  with pytest.raises(ValueError, match=r"use_qwix_quantization=False"):
    _backend(_config(use_qwix_quantization=True))
  with pytest.raises(NotImplementedError, match=r"quant_mode_str='serve'"):
    _backend(_config(), quant_mode_str="serve")
  with pytest.raises(NotImplementedError, match=r"use_batch_split_schedule"):
    _backend(_config(use_batch_split_schedule=True))
  with pytest.raises(TypeError, match=r"S3rQuantization.recipe"):
    smt.S3rQuantization(recipe=cast(Any, "s3r"))  # a name where a Recipe belongs, on purpose


@pytest.mark.parametrize(
  ("field", "value", "message"),
  [
    ("sparse_matmul", False, r"sparse_matmul=False \(MaxText's dense einsum/capacity expert path\) is not wired"),
    ("megablox", False, r"megablox=False runs the experts through jax.lax.ragged_dot"),
    ("ici_expert_parallelism", 2, r"ici_expert_parallelism=2: expert parallelism through MaxText's ragged all-to-all"),
    ("dcn_expert_parallelism", 2, r"dcn_expert_parallelism=2: expert parallelism .* use_ring_of_experts=True"),
    ("te_moe_block", True, r"te_moe_block=True is not supported"),
    ("moe_quantize_token_all_gather", True, r"moe_quantize_token_all_gather=True is not supported"),
    ("num_moe_emb_chunks", 2, r"num_moe_emb_chunks=2 is not supported"),
  ],
)
def test_moe_paths_the_expert_hook_does_not_cover_are_refused_naming_the_field(field, value, message):
  moe = dict(num_experts=4, sparse_matmul=True, megablox=True, use_tokamax_gmm=False)
  with pytest.raises(NotImplementedError, match=rf"quantization=s3r:s3r_ec_dx with num_experts=4: {message}"):
    _backend(_config(**(moe | {field: value})))
  assert smt.backend(_config(**(moe | {field: value, "num_experts": 1}))) is not None  # dense: the field is moot


def test_expert_parallelism_is_covered_through_the_ring_of_experts():
  moe = dict(num_experts=4, sparse_matmul=True, megablox=True, ici_expert_parallelism=2, use_ring_of_experts=True)
  assert _backend(_config(**moe)).recipe.name == "s3r_ec_dx"


def test_megablox_false_is_covered_where_tokamax_selects_maxtexts_gmm():
  cfg = _config(num_experts=4, sparse_matmul=True, megablox=False, use_tokamax_gmm=True)
  assert _backend(cfg).recipe.name == "s3r_ec_dx"


@pytest.mark.parametrize(
  ("mesh_axes", "contract", "kind"),
  [
    ([("fsdp",), ("tensor",)], (0,), "column"),  # wi [embed, mlp]: output split
    ([("tensor",), ("fsdp",)], (0,), "row"),  # wo [mlp, embed]: contraction split
    ([("tensor", "fsdp_transpose"), (), ("fsdp",)], (0, 1), "row"),  # out [heads, kv, embed]
    ([("fsdp",), ()], (0,), None),  # no tensor axis
    ([("tensor",), ("tensor",)], (0,), None),  # both: no per-shard rounding rule applies
  ],
)
def test_tensor_parallel_kind_follows_where_the_tensor_axis_splits_the_kernel(mesh_axes, contract, kind):
  assert smt.tensor_parallel_kind(mesh_axes, contract) == kind


def test_register_without_maxtext_says_how_to_install_it():
  try:
    import maxtext  # noqa: F401
  except ModuleNotFoundError:
    with pytest.raises(ModuleNotFoundError, match=r"s3r\[maxtext\]"):
      smt.register()
  else:
    pytest.skip("MaxText is installed (test_maxtext.py covers register())")


SHARD_KEYS = """
import jax, numpy as np
from jax.sharding import PartitionSpec as P
from s3r.integrations import maxtext as smt
mesh = jax.make_mesh((2, 2), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
key = jax.random.key(7)
def body(x):
  k = smt.shard_key(key, (("data", 2), ("fsdp", 2)))
  return jax.random.key_data(k)[None]
out = jax.shard_map(body, mesh=mesh, in_specs=P(("data", "fsdp")), out_specs=P(("data", "fsdp")))(np.zeros(4))
rows = [tuple(r) for r in np.asarray(out)]
assert len(set(rows)) == 4, rows  # a key of its own per shard
assert rows[0] == tuple(np.asarray(jax.random.key_data(jax.random.fold_in(key, 0))))  # shard (0, 0): index 0
assert rows[3] == tuple(np.asarray(jax.random.key_data(jax.random.fold_in(key, 3))))  # shard (1, 1): index 3
assert smt.shard_key(key, ()) is key and smt.shard_key(None, (("data", 2),)) is None
print("ok")
"""


def test_each_shard_of_a_moe_layer_draws_its_own_key():
  import os
  import subprocess
  import sys

  from tests.conftest import xla_flags

  env = os.environ | {"XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=4"), "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-c", SHARD_KEYS], env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_expert_gmm_computes_the_first_groups_where_maxtext_names_more_groups_than_the_kernel_holds():
  # the ring of experts hands the gmm every expert's size, this shard's experts rolled to the front
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  kx, kw, kg, kq = jax.random.split(jax.random.key(0), 4)
  x, w = jax.random.normal(kx, (12, 16)), jax.random.normal(kw, (2, 16, 8))
  every, local = jnp.array([3, 4, 2, 3], jnp.int32), jnp.array([3, 4], jnp.int32)
  recipe = s3r.recipe("s3r_ec_dx")

  def loss(fn_x, fn_w, sizes):
    out = smt.expert_gmm(fn_x, fn_w, sizes, recipe=recipe, key=kq)
    return jnp.sum(out * jax.random.normal(kg, out.shape)), out

  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, w, every)
  (_, ref), ref_grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, w, local)
  np.testing.assert_array_equal(out, ref)
  assert not np.any(np.asarray(out[7:]))  # rows of the other shards' experts stay zero
  for g, r in zip(grads, ref_grads, strict=True):
    np.testing.assert_array_equal(g, r)


def test_an_all_fp8_recipe_builds_a_moe_backend_whose_expert_gemms_are_grouped_qmatmuls_with_the_e4m3_forward():
  """`s3r:s3r_ec_dx@e5m2+fwd_e4m3` on MaxText's sparse-MoE path: the expert GEMM hook is grouped_qmatmul
  with the all-FP8 recipe (E4M3 forward, E5M2 gradients) and the layer key folded with the kernel's
  fingerprint, outputs and gradients bit for bit."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  moe = dict(num_experts=2, sparse_matmul=True, megablox=True, use_tokamax_gmm=False)
  recipe = _backend(_config(quantization="s3r:s3r_ec_dx@e5m2+fwd_e4m3", **moe)).recipe
  assert (recipe.forward_format, recipe.grad_format) == ("e4m3", "e5m2")
  kx, kw, kg, kq = jax.random.split(jax.random.key(1), 4)
  x, w, sizes = jax.random.normal(kx, (12, 16)), jax.random.normal(kw, (2, 16, 8)), jnp.array([5, 7], jnp.int32)
  folded = jax.random.fold_in(kq, smt.kernel_fingerprint(w))

  def loss(gemm, fn_x, fn_w):
    out = gemm(fn_x, fn_w)
    return jnp.sum(out * jax.random.normal(kg, out.shape)), out

  hook = lambda a, b: smt.expert_gmm(a, b, sizes, recipe=recipe, key=kq)
  direct = lambda a, b: s3r.grouped_qmatmul(a, b, sizes, key=folded, recipe=recipe)
  (_, out), grads = jax.value_and_grad(lambda a, b: loss(hook, a, b), argnums=(0, 1), has_aux=True)(x, w)
  (_, ref), ref_grads = jax.value_and_grad(lambda a, b: loss(direct, a, b), argnums=(0, 1), has_aux=True)(x, w)
  np.testing.assert_array_equal(out, ref)
  for g, r in zip(grads, ref_grads, strict=True):
    np.testing.assert_array_equal(g, r)
  int8_out = s3r.grouped_qmatmul(x, w, sizes, key=folded, recipe="s3r_ec_dx@e5m2")
  assert not np.array_equal(out, int8_out)  # the E4M3 forward, not the int8 one


def _gmm_call(**kw):
  import jax.numpy as jnp  # noqa: PLC0415

  base = dict(
    lhs=jnp.zeros((4, 8)),
    rhs=jnp.zeros((2, 8, 8)),
    group_offset=None,
    existing_out=None,
    transpose_rhs=False,
    weight_gather_axes=None,
    partial_sum=None,
  )
  return base | kw


def test_a_plain_expert_gemm_call_is_covered_and_a_zero_group_offset_too():
  assert smt._unsupported_gmm_arguments(_gmm_call()) == []
  assert smt._unsupported_gmm_arguments(_gmm_call(group_offset=0)) == []


@pytest.mark.parametrize(
  "field, value, name",
  [
    ("group_offset", 1, "group_offset"),
    ("existing_out", 0.0, "existing_out"),
    ("transpose_rhs", True, "transpose_rhs"),
    ("weight_gather_axes", ("fsdp",), "weight_gather_axes"),
    ("partial_sum", 0.0, "partial_sum"),
    ("rhs", types.SimpleNamespace(qvalue=None), "a pre-quantized operand"),
  ],
)
def test_each_expert_gemm_option_the_backend_does_not_cover_is_named(field, value, name):
  assert smt._unsupported_gmm_arguments(_gmm_call(**{field: value})) == [name]


def test_every_value_gets_a_distinct_enum_member_name_that_is_an_identifier():
  names = [smt._member_name(v) for v in smt.quantization_values()]  # noqa: SLF001 - the names register() adds
  assert len(set(names)) == len(names) and all(n.isidentifier() for n in names)
  assert smt._member_name("s3r:s3r_ec_dx@e5m2+fwd_e4m3") == "S3R__S3R_EC_DX_AT_E5M2_FWD_E4M3"  # noqa: SLF001
