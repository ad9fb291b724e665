"""Importing Hugging Face checkpoints (s3r.model.load_hf) against the committed fixtures.

Each fixture under tests/model/fixtures_hf/ is a tiny random checkpoint written by `transformers`'
`save_pretrained` (scripts/make_hf_fixtures.py) with the float32 logits `transformers` computes from
it (eager attention). The import is checked exactly with the independent float64 forward of
tests/model/reference.py on the imported parameters (1e-5 relative: the fixtures agree to ~1e-6),
and so is s3r's own forward with float32 activations (act_dtype="float32", the `bf16` recipe then
multiplying in f32). With its default bf16 activations (docs/models.md) the logits are checked to
bf16 rounding: 3e-2 relative, about 8 units of bf16 rounding (2^-8) accumulated over the 2-3 layers.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s3r import model as M
from s3r.model.config import MoeFields
from s3r.model.hf import checkpoint, configs, layouts, safetensors, tensors
from tests.model import family_facts, reference

FIXTURES = pathlib.Path(__file__).parent / "fixtures_hf"
NAMES = sorted(d.name for d in FIXTURES.iterdir() if (d / "config.json").is_file())  # every fixture checkpoint
EXACT = 1e-5  # float64 reference, or s3r's float32 forward, on the imported weights vs transformers' float32 logits
BF16 = 3e-2  # s3r's bf16 forward vs transformers' float32 logits
ROUTING_TIE = 0.002  # router-probability gap below which bf16 activations may flip a top-k choice


def _recorded(name: str):
  ref = np.load(FIXTURES / name / "reference.npz")
  return ref["tokens"], ref["logits"]


def _reference_error(cfg, params, name: str) -> float:
  tokens, want = _recorded(name)
  p64 = jax.tree.map(np.asarray, params)
  got = np.stack([reference.forward(cfg, p64, row) for row in tokens])
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("name", NAMES)
def test_imported_weights_give_the_recorded_logits_in_an_independent_float64_forward(name):
  cfg, params = M.load_hf(FIXTURES / name)
  assert _reference_error(cfg, params, name) < EXACT


def _s3r_error(cfg, params, name: str) -> float:
  tokens, want = _recorded(name)
  got = np.asarray(jax.jit(M.apply, static_argnums=0)(M.graphdef(cfg), params, jnp.asarray(tokens), key=None))
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


TEXT = [n for n in NAMES if n != "gemma3_multimodal"]  # gemma3_multimodal: the same weights as gemma3


@pytest.mark.parametrize("name", TEXT)
def test_s3r_float32_forward_of_the_import_gives_the_recorded_logits_exactly(name):
  cfg, params = M.load_hf(FIXTURES / name, recipe="bf16", act_dtype="float32")
  assert _s3r_error(cfg, params, name) < EXACT


@pytest.mark.parametrize("name", TEXT)
def test_s3r_forward_of_the_import_gives_the_recorded_logits_to_bf16_rounding(name):
  cfg, params = M.load_hf(FIXTURES / name, recipe="bf16")
  tokens, want = _recorded(name)
  got = np.asarray(jax.jit(M.apply, static_argnums=0)(M.graphdef(cfg), params, jnp.asarray(tokens), key=None))
  clear = np.ones(tokens.shape, bool)
  if isinstance(cfg, MoeFields):  # a token whose k-th and (k+1)-th router probabilities nearly tie may route
    p64 = jax.tree.map(np.asarray, params)  # to another expert in bf16: such tokens are left out
    for b, row in enumerate(tokens):
      margins = []
      reference.forward(cfg, p64, row, margins)
      clear[b] = np.min(margins, axis=0) > ROUTING_TIE
    assert clear.mean() > 0.25
  rel = np.linalg.norm(got[clear] - want[clear]) / np.linalg.norm(want[clear])
  assert rel < BF16, f"{name}: relative error {rel:.4f}"


CHANGED = [  # (fixture, field, value): one feature of the fixture changed
  ("llama", "rope_theta", 20_000.0),
  ("llama", "rope_scaling", None),
  ("qwen3", "norm_eps", 1e-1),
  ("gemma3", "sliding_window", 16),
  ("gemma3", "local_rope_theta", 100_000.0),
  ("gemma3", "query_pre_attn_scalar", 24.0),
  ("qwen3_moe", "renormalize", False),
  ("deepseek_v2", "routed_scaling_factor", 1.0),
  ("deepseek_v2", "rope_scaling", None),
  ("deepseek_v2_qlora", "rope_scaling", M.RopeScaling(kind="yarn", factor=4.0, original_max_seq_len=16)),
]


@pytest.mark.parametrize("name, field, value", CHANGED)
def test_the_logits_comparison_fails_when_one_feature_is_changed(name, field, value):
  cfg, params = M.load_hf(FIXTURES / name, recipe="bf16", act_dtype="float32")
  changed = dataclasses.replace(cfg, **{field: value})
  assert _reference_error(changed, params, name) > 100 * EXACT
  assert _s3r_error(changed, params, name) > 100 * EXACT


def test_the_text_tower_of_gemma3_for_conditional_generation_imports_as_the_causal_lm():
  text_cfg, text = M.load_hf(FIXTURES / "gemma3")
  cfg, params = M.load_hf(FIXTURES / "gemma3_multimodal")  # sharded, with model.safetensors.index.json
  assert cfg == text_cfg
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), params, text))


def _of[C: M.ModelConfig](cls: type[C], cfg: M.ModelConfig) -> C:
  """`cfg`, checked to be of the family `cls`."""
  assert isinstance(cfg, cls), type(cfg).__name__
  return cfg


def test_imported_config_has_the_fixture_features():
  cfg = _of(M.Gemma3Config, M.hf_config(FIXTURES / "gemma3"))
  assert (cfg.sliding_window, cfg.global_every, cfg.local_rope_theta, cfg.query_pre_attn_scalar) == (8, 2, 1e4, 20.0)
  assert cfg.rope_scaling == M.RopeScaling(kind="linear", factor=2.0) and cfg.tie_embeddings
  ds = _of(M.DeepSeekV2Config, M.hf_config(FIXTURES / "deepseek_v2"))
  assert (ds.routed_scaling_factor, ds.dense_layers, ds.n_shared, ds.renormalize) == (2.5, 1, 1, False)
  assert _of(M.Qwen3MoeConfig, M.hf_config(FIXTURES / "qwen3_moe")).dense_layers == 1


def _entries(name: str):
  ckpt = checkpoint.Checkpoint(FIXTURES / name)
  return ckpt, tensors.tensor_map(M.hf_config(FIXTURES / name), ckpt.names)


@pytest.mark.parametrize("name", NAMES)
def test_every_layout_gives_back_the_stored_tensors(name):
  ckpt, entries = _entries(name)
  for entry in entries:
    stored = [ckpt.read(n) for n in entry.hub]
    back = entry.layout.to_hub(entry.layout.to_s3r(stored, np.float32))
    assert all(np.array_equal(b, s.astype(np.float32)) for b, s in zip(back, stored)), entry.path


def test_deepseek_rope_dims_are_reordered_from_interleaved_pairs_to_halves():
  layout = layouts.RopeLinear(group=5, r=4)  # one head: 1 dim without position, 4 RoPE dims stored as pairs
  w = np.arange(5)[:, None] * np.ones((5, 2))  # row i holds i
  assert layout.to_s3r([w], np.float32)[0].tolist() == [0, 1, 3, 2, 4]


def write_safetensors(path: pathlib.Path, named: dict[str, np.ndarray]) -> None:
  """A safetensors file as the format specifies it (header padded to 8 bytes)."""
  codes = {np.dtype(v): k for k, v in safetensors.DTYPES.items()}
  header, offset = {}, 0
  for name, x in named.items():
    header[name] = {"dtype": codes[x.dtype], "shape": list(x.shape), "data_offsets": [offset, offset + x.nbytes]}
    offset += x.nbytes
  raw = json.dumps(header).encode()
  raw += b" " * (-len(raw) % 8)
  with path.open("wb") as f:
    f.write(len(raw).to_bytes(8, "little") + raw)
    for x in named.values():
      f.write(np.ascontiguousarray(x).tobytes())


def test_experts_in_the_fused_module_layout_import_as_the_per_expert_layout(tmp_path):
  ckpt = checkpoint.Checkpoint(FIXTURES / "qwen3_moe")
  named, e = {}, ckpt.config["num_local_experts"]
  for name in sorted(ckpt.names):
    if ".experts." not in name:
      named[name] = np.array(ckpt.read(name))
  for layer in (1, 2):
    p = f"model.layers.{layer}.mlp.experts"
    per = lambda n: np.stack([ckpt.read(f"{p}.{i}.{n}_proj.weight") for i in range(e)])
    named[f"{p}.gate_up_proj"] = np.concatenate([per("gate"), per("up")], axis=1)
    named[f"{p}.down_proj"] = per("down")
  shutil.copy(FIXTURES / "qwen3_moe" / "config.json", tmp_path)
  write_safetensors(tmp_path / "model.safetensors", named)
  _, fused = M.load_hf(tmp_path)
  _, per_expert = M.load_hf(FIXTURES / "qwen3_moe")
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), fused, per_expert))


def test_load_places_each_parameter_on_its_sharding_in_the_asked_dtype():
  cfg = M.hf_config(FIXTURES / "llama")
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
  shape_tree = jax.eval_shape(lambda: M.init_params(cfg, jax.random.key(0)))
  shardings = jax.tree.map(lambda _: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), shape_tree)
  _, params = M.load_hf(FIXTURES / "llama", dtype=jnp.bfloat16, shardings=shardings)
  leaves = jax.tree.leaves(params)
  assert all(x.dtype == jnp.bfloat16 and x.sharding == shardings["embed"] for x in leaves)
  stored = checkpoint.Checkpoint(FIXTURES / "llama").read("model.embed_tokens.weight")
  assert np.array_equal(np.asarray(params["embed"]), stored)  # bf16 in, bf16 out: exact


def test_n_layers_override_reads_the_first_layers_only():
  cfg, params = M.load_hf(FIXTURES / "deepseek_v2", n_layers=2)
  _, full = M.load_hf(FIXTURES / "deepseek_v2")
  layers, full_layers = (
    M.stack.unstack(params, cfg)["blocks"],
    M.stack.unstack(full, M.hf_config(FIXTURES / "deepseek_v2"))["blocks"],
  )
  assert cfg.n_layers == 2 and sorted(layers) == [0, 1]
  assert np.array_equal(layers[1]["moe"]["gate"], full_layers[1]["moe"]["gate"])


# Bad input: one-line errors naming the file, tensor or field.


def _copy(name: str, tmp_path: pathlib.Path) -> pathlib.Path:
  return pathlib.Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def _fails(folder, match: str, error=M.HFError):
  with pytest.raises(error, match=match) as info:
    M.load_hf(folder)
  assert "\n" not in str(info.value)


def test_a_folder_without_config_json_is_refused_naming_the_file(tmp_path):
  folder = _copy("llama", tmp_path)
  (folder / "config.json").unlink()
  _fails(folder, "config.json: no such file")


def test_an_unknown_architecture_is_refused_naming_it(tmp_path):
  folder = _copy("llama", tmp_path)
  config = json.loads((folder / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps({**config, "architectures": ["MistralForCausalLM"]}))
  _fails(folder, "MistralForCausalLM", M.HFConfigError)


def test_an_index_naming_a_missing_shard_is_refused_naming_the_shard(tmp_path):
  folder = _copy("gemma3_multimodal", tmp_path)
  (folder / "model-00002-of-00003.safetensors").unlink()
  _fails(folder, r"names model-00002-of-00003\.safetensors")


def test_a_truncated_shard_is_refused_naming_the_file_and_tensor(tmp_path):
  folder = _copy("gemma3_multimodal", tmp_path)
  shard = folder / "model-00003-of-00003.safetensors"
  shard.write_bytes(shard.read_bytes()[:-100])
  _fails(folder, r"model-00003-of-00003\.safetensors: truncated: tensor \S+ ends at")


def test_a_file_shorter_than_its_header_is_refused(tmp_path):
  folder = _copy("llama", tmp_path)
  (folder / "model.safetensors").write_bytes(b"\x00" * 4)
  _fails(folder, "model.safetensors: not a safetensors file")


def _rewrite(folder: pathlib.Path, edit) -> None:
  ckpt = checkpoint.Checkpoint(folder)
  named = {n: np.array(ckpt.read(n)) for n in sorted(ckpt.names)}  # copies: the file is rewritten below
  edit(named)
  write_safetensors(folder / "model.safetensors", named)


def test_a_tensor_with_the_wrong_shape_is_refused_naming_it_and_both_shapes(tmp_path):
  folder = _copy("llama", tmp_path)
  name = "model.layers.1.self_attn.k_proj.weight"
  _rewrite(folder, lambda named: named.update({name: named[name][:16]}))
  _fails(folder, rf"tensor {name} has shape \[16, 64\]; config.json implies \[32, 64\]")


def test_a_missing_tensor_is_refused_naming_it(tmp_path):
  folder = _copy("qwen3", tmp_path)
  _rewrite(folder, lambda named: named.pop("model.layers.0.self_attn.q_norm.weight"))
  _fails(folder, r"has no tensor model\.layers\.0\.self_attn\.q_norm\.weight")


def test_a_tensor_the_model_has_no_place_for_is_refused_naming_it(tmp_path):
  folder = _copy("llama", tmp_path)
  bias = "model.layers.0.self_attn.q_proj.bias"
  _rewrite(folder, lambda named: named.update({bias: np.zeros(64, jnp.bfloat16)}))
  _fails(folder, rf"tensor {bias} has no place", M.HFConfigError)


def _config(name: str, **changes) -> dict:
  config = json.loads((FIXTURES / name / "config.json").read_text())
  for key, value in changes.items():
    target = config
    *parents, last = key.split(".")
    for parent in parents:
      target = target[parent]
    target[last] = value
  return config


REFUSED = family_facts.gathered("REFUSED")  # (fixture, changed field (dotted: nested), value, field the message names)


@pytest.mark.parametrize("name, field, value, named", REFUSED)
def test_a_config_field_s3r_does_not_compute_is_refused_naming_field_and_value(name, field, value, named):
  with pytest.raises(M.HFConfigError, match=named) as info:
    configs.model_config(_config(name, **{field: value}), "config.json")
  assert "\n" not in str(info.value)


def test_a_dense_prefix_of_mlp_only_layers_is_honoured():
  two = configs.model_config(_config("qwen3_moe", mlp_only_layers=[0, 1]), "c")
  none = configs.model_config(_config("qwen3_moe", mlp_only_layers=[]), "c")
  assert _of(M.Qwen3MoeConfig, two).dense_layers == 2 and _of(M.Qwen3MoeConfig, none).dense_layers == 0


def _without(name: str, *fields: str) -> dict:
  config = _config(name)
  for field in fields:
    del config[field]
  return config


def test_absent_fields_take_the_defaults_of_the_transformers_config_class():
  assert configs.model_config(_without("qwen3_moe", "head_dim"), "c").d_head == 64 // 4  # width / heads
  ds = _of(M.DeepSeekV2Config, configs.model_config(_without("deepseek_v2", "q_lora_rank", "n_shared_experts"), "c"))
  assert (ds.q_lora_rank, ds.n_shared) == (1536, 2)
  nulls = _of(
    M.DeepSeekV2Config, configs.model_config(_config("deepseek_v2", q_lora_rank=None, n_shared_experts=None), "c")
  )
  assert (nulls.q_lora_rank, nulls.n_shared) == (None, 0)  # null: no query compression, no shared expert


def test_yarn_mscale_without_mscale_all_dim_is_ignored_as_the_reference_ignores_it():
  config = _config("deepseek_v2", **{"rope_parameters.mscale_all_dim": None, "rope_parameters.mscale": 0.707})
  scaling = configs.model_config(config, "c").rope_scaling
  assert scaling is not None and (scaling.mscale, scaling.mscale_all_dim) == (
    1.0,
    0.0,
  )  # cos/sin x (0.1 ln(factor) + 1), no softmax term


PUBLISHED = family_facts.merged("HUB_CONFIGS")  # config.json of the published checkpoints (older spelling)


@pytest.mark.parametrize("preset", list(PUBLISHED))
def test_published_config_translates_to_the_preset_of_the_same_model(preset):
  assert configs.model_config(PUBLISHED[preset], "config.json") == M.PRESETS[preset]


def test_tokenizer_comes_with_bos_and_eos_of_tokenizer_config():
  tok = M.load_hf_tokenizer(FIXTURES / "llama")
  assert (tok.bos_id, tok.eos_id) == (tok.hf.token_to_id("<s>"), tok.hf.token_to_id("</s>"))
  assert tok.vocab_size <= M.hf_config(FIXTURES / "llama").vocab_size
  ids = tok.encode("the lazy dog", add_special_tokens=False)
  assert tok.decode(ids) == "the lazy dog" and len(ids) < len("the lazy dog")


def test_tokenizer_refuses_an_eos_token_outside_its_vocabulary(tmp_path):
  folder = _copy("llama", tmp_path)
  config = json.loads((folder / "tokenizer_config.json").read_text())
  (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|eot|>"}))
  with pytest.raises(M.HFError, match="eos_token='<\\|eot\\|>' is not in the vocabulary"):
    M.load_hf_tokenizer(folder)


def test_a_checkpoint_without_tokenizer_json_is_refused_naming_the_file(tmp_path):
  folder = _copy("qwen3", tmp_path)
  with pytest.raises(M.HFError, match="tokenizer.json: no such file"):
    M.load_hf_tokenizer(folder)


def test_loaded_parameters_are_copies_not_views_of_the_mapped_file(tmp_path):
  folder = _copy("llama", tmp_path)
  _rewrite(folder, lambda named: named.update({n: x.astype(np.float32) for n, x in named.items()}))
  _, params = M.load_hf(folder)  # float32 stored, float32 asked: no cast that would copy anyway
  before = np.array(params["final_norm"]["scale"])
  data = np.memmap(folder / "model.safetensors", dtype=np.uint8, mode="r+")
  data[4096:] = 0  # the tensors' bytes overwritten in place
  data.flush()
  assert np.array_equal(np.asarray(params["final_norm"]["scale"]), before) and before.any()
