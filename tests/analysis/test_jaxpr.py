"""The jaxpr walker: nested equations, scan multiplicity, int8 GEMMs and random words."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from labtools.analysis import jaxpr as ja


def _draw_in_scan(key):
  def body(k, _):
    k, sub = jax.random.split(k)
    return k, jax.random.bits(sub, (8,), jnp.uint32)

  return jax.lax.scan(body, key, None, length=5)[1]


def test_random_words_count_every_iteration_of_a_scan():
  draws = ja.random_draws(jax.make_jaxpr(_draw_in_scan)(jax.random.key(0)))
  assert draws["words"] == 5 * 8 and ja.random_words(jax.make_jaxpr(_draw_in_scan)(jax.random.key(0))) == 40
  assert draws["derived_keys"] == 5 * 2


def test_int8_dots_are_found_inside_nested_jit():
  inner = jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.int32))
  jaxpr = jax.make_jaxpr(lambda a, b: inner(a, b) + 1)(jnp.ones((2, 3), jnp.int8), jnp.ones((3, 4), jnp.int8))
  assert len(ja.int8_dots(jaxpr)) == 1
  assert any(e.primitive.name == "add" for e in ja.iter_eqns(jaxpr))
  f32 = jax.make_jaxpr(jnp.dot)(jnp.ones((2, 3)), jnp.ones((3, 4)))
  assert ja.int8_dots(f32) == []
