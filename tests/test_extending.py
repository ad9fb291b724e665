"""docs/extending.md names only files that exist (it lists what each kind of addition touches)."""

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_every_path_docs_extending_names_exists():
  text = (REPO / "docs" / "extending.md").read_text()
  top = r"(?:s3r|tests|benchmarks|research|labtools|docs|scripts)"
  named = {m for m in re.findall(rf"`({top}/[\w/.]+\.(?:py|md))`", text)}
  named |= {"README.md"} if "`README.md`" in text else set()
  assert len(named) >= 15, sorted(named)
  missing = sorted(p for p in named if "<name>" not in p and not (REPO / p).exists())
  assert not missing, missing


# --- the steps docs/extending.md gives for a new format and a new topology, taken for real ---------


def _problem():
  import jax.numpy as jnp
  import numpy as np

  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, 8, 16)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((16, 12)), jnp.float32)
  g = jnp.asarray(rng.standard_normal((2, 8, 12)), jnp.float32)
  return x, w, g


def test_a_new_format_on_an_existing_grid_is_one_registry_line(monkeypatch):
  import jax
  import jax.numpy as jnp
  import numpy as np

  import s3r
  from s3r.quant import formats

  # IEEE-style E4M3 (with infinities; largest finite value 240): the registry line
  ieee = formats.FloatFormat(name="e4m3ieee", qmax=240, code_dtype=jnp.float8_e4m3)
  monkeypatch.setattr(formats, "FORMATS", formats._registry(formats._FORMATS + (ieee,))[0])
  x, w, g = _problem()
  q_dx, q_dw, _ = s3r.gradient_codes(x, w, g, key=jax.random.key(0), recipe="s3r_ec_dx@e4m3ieee")
  assert q_dx.dtype == jnp.float8_e4m3 and q_dx is q_dw
  every_value = np.arange(256, dtype=np.uint8).view(jnp.float8_e4m3).astype(np.float32)
  assert np.isin(np.abs(np.asarray(q_dx, np.float32)), every_value).all()
  assert float(jnp.max(jnp.abs(q_dx.astype(jnp.float32)))) == 240  # the step maps max|G'| onto 240
  _, vjp = jax.vjp(lambda a, b: s3r.qmatmul(a, b, key=jax.random.key(0), recipe="s3r_ec_dx@e4m3ieee"), x, w)
  assert all(bool(jnp.isfinite(d).all()) for d in vjp(g))


def test_a_block_scaled_fp8_format_is_one_registry_line_that_the_reference_reads(monkeypatch):
  import jax
  import jax.numpy as jnp
  import numpy as np

  import s3r
  from s3r.quant import formats
  from tests.quant import format_reference as ref

  e5m2_b64 = formats.BlockFloatFormat(
    name="e5m2_b64", qmax=57344, element_dtype=np.dtype(jnp.float8_e5m2), block=64, block_scale="e8m0"
  )
  registry = formats._registry(formats._FORMATS + (e5m2_b64,))[0]
  monkeypatch.setattr(formats, "FORMATS", registry)
  monkeypatch.setattr(ref, "FORMATS", registry)
  x, w, g = _problem()
  q, _, delta = s3r.gradient_codes(x, w, g, recipe="int8_rtne@e5m2_b64")
  v = np.asarray(s3r.quant.matmul.quantize_gradient(s3r.recipe("int8_rtne@e5m2_b64"), *_scales(x, w), g, None)[1])
  assert float(delta) == ref.step("e5m2_b64", np.abs(v).max()) == 1
  np.testing.assert_array_equal(
    np.asarray(q, np.float64).reshape(-1, 12), ref.rtne_codes("e5m2_b64", v.reshape(-1, 12))
  )
  _, vjp = jax.vjp(lambda a, b: s3r.qmatmul(a, b, key=jax.random.key(0), recipe="s3r_ec_dx@e5m2_b64"), x, w)
  assert all(bool(jnp.isfinite(d).all()) for d in vjp(g))


def test_a_new_topology_is_one_class_and_its_registry_entry(monkeypatch):
  import dataclasses
  import math
  from typing import ClassVar

  import jax
  import jax.numpy as jnp
  import numpy as np

  import s3r
  from labtools.analysis import jaxpr as jaxpr_analysis
  from s3r.quant import thresholds

  @dataclasses.dataclass(frozen=True)
  class PerChannel(thresholds.Topology):
    """One compact threshold per output channel, shared by every token."""

    name: ClassVar[str] = "channel"
    shared: ClassVar[bool] = True

    def words(self, batch, seq, channels):
      return thresholds.words_needed(channels)

    def dense(self, key, shape_BxSxN):
      return thresholds.compact_uniform(key, shape_BxSxN[2]).reshape(1, 1, -1)

    def grouped(self, key, rows):
      return thresholds.compact_uniform(key, rows.channels).reshape(1, -1)

  monkeypatch.setitem(thresholds.TOPOLOGIES, "channel", PerChannel())
  recipe = s3r.Recipe(name="s3r_channel", rounding="shared", dx_topology="channel", dw_topology="channel")
  x, w, g = _problem()
  key = jax.random.key(0)
  q, _, delta = s3r.gradient_codes(x, w, g, key=key, recipe=recipe)
  # a threshold u[n] per channel: every code is floor(v + u[n]) of the scaled gradient v = G'/Δ
  u = np.asarray(thresholds.compact_uniform(key, 12))
  v = np.asarray(s3r.quant.matmul.quantize_gradient(recipe, *_scales(x, w), g, key)[1])
  np.testing.assert_array_equal(np.asarray(q), np.clip(np.floor(v + u), -127, 127))
  words = jaxpr_analysis.random_words(
    jax.make_jaxpr(lambda a, b: jax.vjp(lambda a, b: s3r.qmatmul(a, b, key=key, recipe=recipe), a, b)[1](g))(x, w)
  )
  assert words == PerChannel().words(2, 8, 12) == math.ceil(12 / 4)
  sizes = jnp.asarray([5, 3], jnp.int32)
  dx = jax.grad(lambda a: jnp.sum(s3r.grouped_qmatmul(a, jnp.stack([w, w]), sizes, key=key, recipe=recipe)))(x[0])
  assert bool(jnp.isfinite(dx).all()) and float(delta) > 0


def _scales(x, w):
  from s3r.quant import numerics

  return numerics.absmax_scale(x, axis=2), numerics.absmax_scale(w, axis=0)


# --- the steps docs/extending.md gives for a new model family -----------------------------------------


def test_every_registered_family_has_its_presets_a_checkpoint_fixture_of_each_architecture_and_its_test_facts():
  import importlib
  import json

  import s3r.model as M
  from s3r.model import families

  fixtures = REPO / "tests" / "model" / "fixtures_hf"
  archs = {json.loads((d / "config.json").read_text())["architectures"][0] for d in fixtures.iterdir() if d.is_dir()}
  assert archs == set(families.readers()), "one fixture per architecture a family reads"
  assert {p.family for p in M.PRESETS.values()} == set(M.FAMILIES)
  for family in M.FAMILIES.values():
    assert families.family_of(family.config) is family and family.name == family.config.family
    module = importlib.import_module(f"s3r.model.families.{family.name}")
    assert module.FAMILY is family, "the family's module is named as the family"
    facts = importlib.import_module(f"tests.model.families.{family.name}")
    for field in (
      "PUBLISHED",
      "HUB_CONFIGS",
      "REFUSED",
      "TOKENIZER",
      "INVALID",
      "CLI_RECIPE",
      "CLI_IN_DEFAULT_SUITE",
      "LAYERS_DIFFER",
    ):
      assert hasattr(facts, field), f"tests/model/families/{family.name}.py has no {field}"


# A new family as docs/extending.md writes it: one module (here the Llama block with a linear gate in place of
# SiLU, a change the decoder's numbers show), registered in the registry.
FAMILY_MODULE = """
import dataclasses
from typing import ClassVar

from s3r.model.config import ModelConfig
from s3r.model.families import llama
from s3r.model.families.base import Family
from s3r.model.layers import Block


@dataclasses.dataclass(frozen=True, kw_only=True)
class SwappedConfig(ModelConfig):
  family: ClassVar[str] = "swapped"


class SwappedBlock(Block[SwappedConfig]):
  def _act(self, gate_BxSxF):
    return gate_BxSxF  # a linear gate: the block's output differs from the Llama block's


def read(f):
  cfg = llama.read(f)
  return SwappedConfig(**{field.name: getattr(cfg, field.name) for field in dataclasses.fields(cfg)})


def write(cfg):
  return {**llama.write(cfg), "architectures": ["SwappedForCausalLM"], "model_type": "swapped"}


PRESETS = {
  "swapped-tiny": SwappedConfig(
    vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=48, max_seq_len=16, recipe="bf16"
  )
}

FAMILY = Family(
  config=SwappedConfig,
  block=SwappedBlock,
  readers={"SwappedForCausalLM": read},
  writer=write,
  block_tensors=llama.block_tensors,
  presets=PRESETS,
  sibling="swapped-tiny",
)
"""


def test_a_new_family_is_one_module_that_every_dispatch_uses(monkeypatch, tmp_path):
  """A family written as one module (its config, block, Hugging Face conversion, presets and `Family`) and
  registered builds, generates, round-trips through a config file and through a Hugging Face checkpoint."""
  import dataclasses
  import importlib.util

  import jax
  import numpy as np

  import s3r.model as M
  from s3r.model import registry, transformer

  (tmp_path / "swapped.py").write_text(FAMILY_MODULE)
  spec = importlib.util.spec_from_file_location("swapped", tmp_path / "swapped.py")
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  monkeypatch.setitem(registry.FAMILIES, module.FAMILY.name, module.FAMILY)  # registered for this test only

  cfg = M.preset("swapped-tiny")  # the presets come from the registry
  assert isinstance(cfg, module.SwappedConfig) and "swapped-tiny" in M.PRESETS
  assert transformer.block_class(cfg) is module.SwappedBlock
  assert M.ModelConfig.from_dict(cfg.to_dict()) == cfg
  params = M.init_params(cfg, jax.random.key(0))
  tokens = jax.numpy.asarray([[1, 2, 3]])
  llama = M.ModelConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})  # same fields, Llama block
  assert not np.allclose(
    M.apply(M.graphdef(cfg), params, tokens, key=None), M.apply(M.graphdef(llama), params, tokens, key=None)
  )
  out = M.generate(cfg, params, [[1, 2, 3]], max_new_tokens=2)
  assert out.shape == (1, 2)
  path = M.save_hf(tmp_path / "swapped", cfg, params, dtype=np.float32)
  back_cfg, back = M.load_hf(path, recipe="bf16")  # training fields are not in config.json
  assert back_cfg == cfg
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), back, params))


def test_a_family_record_refuses_a_wrong_field_naming_it():
  import dataclasses
  from typing import Any, cast

  import pytest

  import s3r.model as M
  from s3r.model.families import llama

  with pytest.raises(TypeError, match="Family.block"):
    dataclasses.replace(llama.FAMILY, block=cast(Any, M.Transformer))  # not a Block, on purpose
  with pytest.raises(ValueError, match="Family.readers"):
    dataclasses.replace(llama.FAMILY, readers={})
  with pytest.raises(ValueError, match="Family.sibling"):
    dataclasses.replace(llama.FAMILY, sibling="qwen3-tiny")  # a preset of another family
  with pytest.raises(TypeError, match="Family.presets"):
    dataclasses.replace(llama.FAMILY, presets={**llama.PRESETS, "qwen3-tiny": M.PRESETS["qwen3-tiny"]})
  with pytest.raises(ValueError, match=r"Family.inference .* no field \['capacity_factor'\]"):
    dataclasses.replace(llama.FAMILY, inference={"capacity_factor": None})  # a field of the MoE configs only
