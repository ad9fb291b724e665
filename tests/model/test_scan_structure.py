"""Program structure of the scanned decoder's train step: the scan body holds one layer's int8 GEMMs
and gradient quantizations (those of the unrolled one-layer model, whatever the depth), no full-size
threshold tensor, and S3R-EC's dW correction adds no weight-sized buffer (tests/quant/test_structure.py
checks one projection; here the projections sit inside the scan)."""

import collections

import jax
import jax.numpy as jnp
import pytest

from labtools.analysis import hlo
from labtools.analysis import jaxpr as jaxpr_analysis
from labtools.analysis.jaxpr import shaped
from s3r import model as M
from s3r.train import step as train_step

B, S = 2, 24  # T = 48 tokens


def _cfg(recipe, layers, scan=True):
  return M.preset("llama-tiny", recipe=recipe, layers=layers, scan_layers=scan)


def _grad_fn(cfg):
  graphdef = M.graphdef(cfg)

  def f(params, tokens_BxS1, key):
    logits = M.apply(graphdef, params, tokens_BxS1[:, :-1], key=key)
    return train_step.cross_entropy(logits, tokens_BxS1[:, 1:])

  args = (
    jax.eval_shape(lambda: M.init_params(cfg, jax.random.key(0))),
    jax.ShapeDtypeStruct((B, S + 1), jnp.int32),
    jax.random.key(0),
  )
  return jax.grad(f), args


def _int8_ops(cfg):
  """Multiset of (int8 dot operand shapes) and of (int8 conversion input shapes) in the gradient's
  jaxpr, scan bodies counted once."""
  fn, args = _grad_fn(cfg)
  jaxpr = jax.make_jaxpr(fn)(*args)
  eqns = list(jaxpr_analysis.iter_eqns(jaxpr))
  dots = collections.Counter(
    tuple(tuple(shaped(v).shape) for v in e.invars) for e in eqns if jaxpr_analysis.is_int8_dot(e)
  )
  converts = collections.Counter(
    tuple(shaped(e.invars[0]).shape)
    for e in eqns
    if e.primitive.name == "convert_element_type" and e.params["new_dtype"] == jnp.int8
  )
  return dots, converts


@pytest.mark.parametrize("recipe", ["s3r_ec_dx", "int8_sr"])
def test_the_scanned_step_holds_one_layers_gemms_and_quantizations_whatever_the_depth(recipe):
  one_layer = _int8_ops(_cfg(recipe, 1, scan=False))
  assert sum(one_layer[0].values()) >= 3 * len(M.PROJECTIONS)  # forward, dX, dW of every projection
  for layers in (2, 4):
    assert _int8_ops(_cfg(recipe, layers)) == one_layer, layers
  unrolled = _int8_ops(_cfg(recipe, 2, scan=False))  # the contrast: unrolled, every layer has its own
  assert sum(unrolled[0].values()) == 2 * sum(one_layer[0].values())


def _buffers(cfg, num_elements):
  """(dtype, opcode) of every array with that many elements that XLA writes to memory (the
  instructions of the entry computation and of the loop bodies; not those inside fusions)."""
  fn, args = _grad_fn(cfg)
  comps = hlo.parse_hlo(hlo.hlo_text(jax.jit(fn).lower(*args).compile()))
  counts, fused = hlo.execution_counts(comps)
  return sorted(
    (i.dtype, i.opcode)
    for name in counts
    if name not in fused
    for i in comps[name].instrs
    if i.opcode not in ("parameter", "get-tuple-element", "tuple") and i.dims and i.elements == num_elements
  )


def test_no_full_size_threshold_tensor_and_no_weight_sized_dw_temporary_inside_the_scan():
  cfg = _cfg("s3r_ec_dx", 2)
  for width in (cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.d_ff):  # projection outputs
    assert not [b for b in _buffers(cfg, B * S * width) if b[0] in ("u32", "u8", "u16")], width
  weight = cfg.d_model * cfg.d_ff  # gate, up, down
  assert _buffers(_cfg("s3r_ec", 2), weight) == _buffers(cfg, weight)
  contrast = _buffers(_cfg("int8_sr", 2), B * S * cfg.d_ff)  # independent SR writes full-size random bits
  assert [b for b in contrast if b[0] == "u32"]


def _saved_for_backward(cfg):
  """(shape, dtype) of every array the scanned forward keeps for the backward pass (the residuals of
  `jax.vjp`, traced abstractly)."""
  graphdef = M.graphdef(cfg)
  params = jax.eval_shape(lambda: M.init_params(cfg, jax.random.key(0)))
  tokens = jax.ShapeDtypeStruct((B, S), jnp.int32)

  def residuals(p, t, k):
    return jax.tree.leaves(jax.vjp(lambda p: jnp.mean(M.apply(graphdef, p, t, key=k)), p)[1])

  out = jax.eval_shape(residuals, params, tokens, jax.random.key(0))
  return collections.Counter((tuple(a.shape), str(a.dtype)) for a in out)


@pytest.mark.parametrize("recipe", ["bf16", "s3r_ec_dx"])
def test_the_scan_keeps_gate_and_up_but_no_norm_or_activation_intermediates(recipe):
  """RMSNorm's f32 arithmetic and the gated product are recomputed in the backward pass: per layer the
  scan keeps the gate and up outputs at FFN width (and `bf16` the down projection's input) and nothing in
  f32 at model or FFN width (without the recomputation: three more bf16 stacks at FFN width and four f32
  ones at model width)."""
  cfg = _cfg(recipe, 3)
  saved = _saved_for_backward(cfg)
  lay = (cfg.n_layers, B, S)
  down_input = recipe == "bf16"  # bf16's down projection keeps its input for dW; INT8 keeps its int8 codes
  assert saved[(lay + (cfg.d_ff,), "bfloat16")] == 2 + down_input, saved
  assert saved[(lay + (cfg.d_model,), "float32")] == 0, saved
  assert not any(shape[:3] == lay and dtype == "float32" and shape[3:] in ((cfg.d_ff,), (cfg.d_model,))
                 for shape, dtype in saved)  # fmt: skip
