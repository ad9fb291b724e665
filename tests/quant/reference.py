"""Shared helpers for the quantized-matmul tests: float64 NumPy references of docs/algorithm.md §1."""

import functools

import jax
import jax.numpy as jnp
import numpy as np


def np_scale(a: np.ndarray, axis: int) -> np.ndarray:
  s = np.max(np.abs(a.astype(np.float32)), axis=axis) * np.float32(1 / 127)  # as numerics.absmax_scale
  return np.where(s == 0, np.float32(1), s).astype(np.float32)


def np_rtne_codes(a: np.ndarray, s: np.ndarray) -> np.ndarray:
  # times the f32 reciprocal, as numerics.quantize_rtne (a division differs by an ulp at ties)
  return np.clip(np.round(a.astype(np.float32) * (np.float32(1) / s.astype(np.float32))), -127, 127).astype(np.int8)


def np_e4m3_scale(a: np.ndarray, axis: int) -> np.ndarray:
  s = np.max(np.abs(a.astype(np.float32)), axis=axis) * np.float32(1 / 448)  # max |a| onto E4M3's largest value
  return np.where(s == 0, np.float32(1), s).astype(np.float32)


def np_e4m3_codes(a: np.ndarray, s: np.ndarray) -> np.ndarray:
  # ml_dtypes' cast rounds to nearest even; the clip keeps an f32 product just above 448 finite
  v = np.clip(a.astype(np.float32) * (np.float32(1) / s.astype(np.float32)), -448, 448)
  return v.astype(jnp.float8_e4m3fn)


class Reference:
  """The executed forward graph's operands and its exact (float64) backward for upstream g
  (`forward`: the forward format, "int8" or "e4m3")."""

  def __init__(self, x, w, g, forward: str = "int8"):
    x, w, g = (np.asarray(a, np.float32) for a in (x, w, g))
    scale, codes = (np_scale, np_rtne_codes) if forward == "int8" else (np_e4m3_scale, np_e4m3_codes)
    self.sx = scale(x, axis=-1)  # [B, S]
    self.sw = scale(w, axis=0)  # [N]
    self.xq = codes(x, self.sx[..., None])
    self.wq = codes(w, self.sw[None, :])
    x_deq = self.xq.astype(np.float64) * self.sx[..., None]
    w_deq = self.wq.astype(np.float64) * self.sw[None, :]
    self.y = x_deq @ w_deq
    self.dx = g.astype(np.float64) @ w_deq.T
    self.dw = np.einsum("bsk,bsn->kn", x_deq, g.astype(np.float64))
    self.gp = self.sx[..., None].astype(np.float64) * g * self.sw
    self.delta = np.abs(self.gp).max() / 127


def heavy_tailed(rng: np.random.Generator, shape, decades: float = 4.0) -> np.ndarray:
  """Random signs times log-normal magnitudes spanning about `decades` orders of magnitude."""
  sigma = decades * np.log(10) / 4  # +-2 sigma covers the decades
  return (rng.choice([-1.0, 1.0], size=shape) * rng.lognormal(0.0, sigma, size=shape)).astype(np.float32)


def grads(recipe, x, w, g, key):
  """(dX, dW) of qmatmul for upstream gradient g."""
  from s3r import qmatmul

  _, vjp = jax.vjp(lambda a, b: qmatmul(a, b, key=key, recipe=recipe), x, w)
  return vjp(jnp.asarray(g, x.dtype))


@functools.cache
def gradient_problem(b: int, s: int, k: int, n: int, forward: str = "int8"):
  """(x [b,s,k], w [k,n], heavy-tailed upstream g [b,s,n], its Reference at the forward format
  `forward`): the unbiasedness tests' problem."""
  rng = np.random.default_rng(1)
  x = rng.standard_normal((b, s, k)).astype(np.float32)
  w = (rng.standard_normal((k, n)) * 0.3).astype(np.float32)
  g = heavy_tailed(rng, (b, s, n), decades=4)
  return x, w, g, Reference(x, w, g, forward)


def gradient_samples(recipe: str, problem, draws: int) -> tuple[np.ndarray, np.ndarray]:
  """(dX, dW) of `recipe` on `problem` under `draws` independent keys, stacked along axis 0 (float64)."""
  x, w, g, _ = problem
  keys = jax.random.split(jax.random.key(123), draws)
  dx, dw = jax.jit(jax.vmap(lambda k: grads(recipe, jnp.asarray(x), jnp.asarray(w), g, k)))(keys)
  return np.asarray(dx, np.float64), np.asarray(dw, np.float64)
