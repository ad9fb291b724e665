"""docs/fp8.md stays true: its Linen example runs, and its step's GEMMs are the FP8 ones the page counts."""

import functools
import pathlib
import re

import jax.numpy as jnp

DOC = (pathlib.Path(__file__).parents[1] / "docs" / "fp8.md").read_text()
_DOT = re.compile(r"stablehlo\.dot_general .*: \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\)")


@functools.cache  # one run of the example (a jit compile) for every test that reads it
def _example():
  blocks = re.findall(r"```python\n(.*?)```", DOC, flags=re.S)
  assert len(blocks) == 1, "docs/fp8.md should hold exactly one Python example"
  namespace = {}
  exec(compile(blocks[0], "docs/fp8.md", "exec"), namespace)
  return namespace


def test_fp8_doc_example_has_five_fp8_gemms_and_one_bf16_correction():
  namespace = _example()
  operands = _DOT.findall(namespace["hlo"])
  fp8 = {"f8E4M3FN", "f8E5M2"}
  assert len(operands) == 6, operands
  assert sum(a in fp8 and b in fp8 for a, b in operands) == 5, operands
  assert [pair for pair in operands if not (pair[0] in fp8 and pair[1] in fp8)] == [("bf16", "bf16")], operands
  assert "five of the six have `f8E4M3FN`" in DOC


def test_fp8_doc_example_gradients_are_finite_and_nonzero():
  grads = _example()["grads"]["params"]
  for name in ("up", "down"):
    kernel = grads[name]["kernel"]
    assert bool(jnp.all(jnp.isfinite(kernel))) and float(jnp.max(jnp.abs(kernel))) > 0, name


def test_every_recipe_the_fp8_doc_names_resolves():
  import s3r

  names = set(re.findall(r"`((?:[a-z0-9_]+|NAME)@\w+(?:\+fwd_e4m3)?)`", DOC))
  assert len(names) >= 4, names
  for name in names:
    s3r.recipe(name.replace("NAME", "s3r_ec_dx"))
