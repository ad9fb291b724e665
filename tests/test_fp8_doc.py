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


def fp8_detectable_phrase(arms: list[dict]) -> str:
  """What two seeds of the FP8 dose arms can detect: the seed-to-seed sd of the gaps to `int8_sr`, pooled over
  every (recipe, FP8 grid) pair, and the mean gap a 95% paired t interval excludes from 0 with 1 degree of
  freedom (one pair alone) and with the pooled degrees of freedom (research/results/dose_fp8/dose.json)."""
  import numpy as np
  from scipy import stats

  variances = []
  for grid in ("e4m3", "e5m2"):
    for recipe in ("int8_rtne", "s3r", "s3r_ec_dx"):
      gaps = [a["gap"][recipe] for a in arms if a["grid"] == grid]
      variances.append(np.var(gaps, ddof=1))
  sd, n = float(np.sqrt(np.mean(variances))), len(variances)
  alone, pooled = (stats.t.ppf(0.975, df) * sd / np.sqrt(2) for df in (1, n))
  return (
    f"seed-to-seed sd, pooled over the six FP8 recipe-grid pairs, is {sd:.3f}, so one pair's two-seed mean gap "
    f"is resolved at the 5% level only beyond {stats.t.ppf(0.975, 1):.1f} × sd / √2 = {alone:.2f} (beyond "
    f"{pooled:.2f} if all six pairs share that spread, with {n} degrees of freedom)"
  )


def test_fp8_doc_states_what_two_seeds_can_detect_from_the_fp8_arms():
  import json

  arms = json.loads((pathlib.Path(__file__).parents[1] / "research/results/dose_fp8/dose.json").read_text())["arms"]
  doc = " ".join(DOC.split())
  assert fp8_detectable_phrase(arms) in doc, fp8_detectable_phrase(arms)
  arms[-1]["gap"]["s3r"] += 0.02  # the check can fail
  assert fp8_detectable_phrase(arms) not in doc
