"""Exporting s3r models as Hugging Face checkpoints (s3r.model.save_hf) against the committed fixtures.

Import then export must give back each fixture's tensors bit for bit (names, dtypes, bytes; the
single-file fixtures come back as the very same file), and `config.json` must import as the same
s3r config. Whether `transformers` computes the recorded logits from the export, and reads the exported
tokenizer with its BOS and EOS tokens, is checked when `transformers` is importable (it is not a
dependency of s3r).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s3r import model as M
from s3r.model.hf import save, tokenizer
from s3r.model.hf.checkpoint import INDEX, Checkpoint
from tests.model.test_hf_import import FIXTURES, NAMES

MULTIMODAL_PREFIX = "language_model."  # the text tower's names in the multimodal fixture; exported as the causal LM


def _export(name: str, tmp_path: pathlib.Path, **kwargs) -> tuple[M.ModelConfig, dict, pathlib.Path]:
  cfg, params = M.load_hf(FIXTURES / name)
  return cfg, params, M.save_hf(tmp_path / "export", cfg, params, **kwargs)


def _text_tensors(ckpt: Checkpoint) -> dict[str, str]:
  """{name in the export: name in `ckpt`} of the text model's tensors."""
  prefix = MULTIMODAL_PREFIX if any(n.startswith(MULTIMODAL_PREFIX) for n in ckpt.names) else ""
  return {n.removeprefix(prefix): n for n in ckpt.names if n.removeprefix(prefix).startswith(("model.", "lm_head."))}


@pytest.mark.parametrize("name", NAMES)
def test_import_then_export_gives_back_every_tensor_bit_for_bit(name, tmp_path):
  cfg, _, out = _export(name, tmp_path)
  source, exported = Checkpoint(FIXTURES / name), Checkpoint(out)
  names = _text_tensors(source)
  assert exported.names == set(names)
  for mine, theirs in names.items():
    a, b = exported.read(mine), source.read(theirs)
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), mine
  assert M.hf_config(out) == cfg
  if (FIXTURES / name / "model.safetensors").is_file():  # laid out as the safetensors package lays it out
    assert (out / "model.safetensors").read_bytes() == (FIXTURES / name / "model.safetensors").read_bytes()


def test_the_round_trip_check_sees_a_changed_tensor(tmp_path):
  cfg, params = M.load_hf(FIXTURES / "llama")
  params["layers"]["q"] = params["layers"]["q"].at[1, 3, 5].add(2.0**-6)  # layer 1: one bf16 step of a weight near 1
  out = M.save_hf(tmp_path / "export", cfg, params)
  assert (out / "model.safetensors").read_bytes() != (FIXTURES / "llama" / "model.safetensors").read_bytes()
  name = "model.layers.1.self_attn.q_proj.weight"
  assert Checkpoint(out).read(name).tobytes() != Checkpoint(FIXTURES / "llama").read(name).tobytes()


def test_float32_export_is_exact_and_bfloat16_export_rounds_to_nearest_even(tmp_path):
  cfg, params = M.load_hf(FIXTURES / "qwen3_moe")
  noisy = jax.tree.map(lambda x: x + 1e-3 * jax.random.normal(jax.random.key(0), x.shape), params)
  _, f32 = M.load_hf(M.save_hf(tmp_path / "f32", cfg, noisy, dtype=jnp.float32))
  _, bf16 = M.load_hf(M.save_hf(tmp_path / "bf16", cfg, noisy, dtype="bfloat16"))
  for want, got32, got16 in zip(jax.tree.leaves(noisy), jax.tree.leaves(f32), jax.tree.leaves(bf16)):
    np.testing.assert_array_equal(np.asarray(got32), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got16), np.asarray(want).astype(jnp.bfloat16).astype(np.float32))
  assert json.loads((tmp_path / "f32" / "config.json").read_text())["dtype"] == "float32"


def test_weights_above_the_shard_size_are_sharded_with_an_index(tmp_path):
  cfg, params = M.load_hf(FIXTURES / "gemma3")
  limit = 40_000  # bytes; the fixture's bf16 weights are ~240 kB
  out = M.save_hf(tmp_path / "export", cfg, params, dtype=jnp.float32, max_shard_bytes=limit)
  index = json.loads((out / INDEX).read_text())
  files = sorted(out.glob("*.safetensors"))
  assert len(files) > 2 and set(index["weight_map"].values()) == {f.name for f in files}
  assert files[0].name == f"model-00001-of-{len(files):05d}.safetensors"
  ckpt = Checkpoint(out)
  sizes = {f.name: 0 for f in files}
  for name, file in index["weight_map"].items():
    sizes[file] += ckpt.read(name).nbytes
  assert index["metadata"]["total_size"] == sum(sizes.values())
  assert all(size <= limit for size in sizes.values())
  _, again = M.load_hf(out)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), again, params)


def test_an_existing_non_empty_folder_is_refused_and_left_as_it_was(tmp_path):
  cfg, params = M.load_hf(FIXTURES / "llama")
  (tmp_path / "export").mkdir()
  (tmp_path / "export" / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match=r"export exists and is not an empty folder") as e:
    M.save_hf(tmp_path / "export", cfg, params)
  assert "\n" not in str(e.value)
  assert [p.name for p in (tmp_path / "export").iterdir()] == ["notes.txt"]
  (tmp_path / "empty").mkdir()
  assert (M.save_hf(tmp_path / "empty", cfg, params) / "model.safetensors").is_file()  # an empty folder is fine


def test_a_failed_export_leaves_nothing_behind(tmp_path, monkeypatch):
  cfg, params = M.load_hf(FIXTURES / "qwen3")
  calls = []

  def failing(self, name, array):
    calls.append(name)
    if len(calls) == 5:
      raise OSError(28, "No space left on device")
    return original(self, name, array)

  original = save.SafetensorsWriter.write
  monkeypatch.setattr(save.SafetensorsWriter, "write", failing)
  with pytest.raises(OSError, match="No space"):
    M.save_hf(tmp_path / "export", cfg, params)
  assert len(calls) == 5 and list(tmp_path.iterdir()) == []


def test_params_that_do_not_match_the_config_are_refused_naming_the_parameter(tmp_path):
  cfg, params = M.load_hf(FIXTURES / "llama")
  q = params["layers"]["q"]
  params["layers"]["q"] = q[:, :, :32]
  with pytest.raises(ValueError, match=r"params layers/q has shape \[2, 64, 32\]; the config implies \[2, 64, 64\]"):
    M.save_hf(tmp_path / "a", cfg, params)
  params["layers"]["q"] = q
  del params["layers"]["mlp_norm"]
  with pytest.raises(ValueError, match=r"params have no layers/mlp_norm/scale"):
    M.save_hf(tmp_path / "b", cfg, params)
  assert list(tmp_path.iterdir()) == []


def test_a_config_transformers_cannot_compute_is_refused_naming_the_field(tmp_path):
  cfg, params = M.load_hf(FIXTURES / "qwen3_moe")
  assert isinstance(cfg, M.Qwen3MoeConfig)
  with pytest.raises(ValueError, match=r"Qwen3MoeConfig.n_shared=1 cannot be exported: .*no shared experts"):
    M.save_hf(tmp_path / "export", dataclasses.replace(cfg, n_shared=1), params)


def test_a_checkpoints_tokenizer_files_are_copied(tmp_path):
  _, _, out = _export("llama", tmp_path, tokenizer=FIXTURES / "llama")
  for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    assert (out / name).read_bytes() == (FIXTURES / "llama" / name).read_bytes()
  config = json.loads((out / "config.json").read_text())
  source = M.load_hf_tokenizer(FIXTURES / "llama")
  assert (config["bos_token_id"], config["eos_token_id"]) == (source.bos_id, source.eos_id) != (None, None)


def test_an_s3r_tokenizer_is_written_with_its_bos_and_eos_tokens(tmp_path):
  from s3r.data import Tokenizer

  texts = ["def f(x):\n  return x + 1\n", "class A:\n  pass\n"] * 20
  own = Tokenizer.train(texts, 300)
  tok = tokenizer.HFTokenizer(hf=own.hf, bos_id=own.eot_id, eos_id=own.eot_id)
  cfg = dataclasses.replace(M.hf_config(FIXTURES / "qwen3"), vocab_size=own.vocab_size)
  params = M.init_params(cfg, jax.random.key(0))
  out = M.save_hf(tmp_path / "export", cfg, params, tokenizer=tok)
  back = M.load_hf_tokenizer(out)
  assert back.encode(texts[0], add_special_tokens=False) == own.encode(texts[0])
  assert back.bos_id == back.eos_id == own.eot_id
  assert json.loads((out / "config.json").read_text())["eos_token_id"] == own.eot_id


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
@pytest.mark.parametrize("name", NAMES)
def test_transformers_loads_the_export_and_computes_the_recorded_logits(name, tmp_path):
  import torch
  import transformers

  _, _, out = _export(name, tmp_path, dtype=jnp.float32, max_shard_bytes=100_000)
  model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
  ref = np.load(FIXTURES / name / "reference.npz")
  with torch.no_grad():
    logits = model(torch.tensor(ref["tokens"])).logits.numpy()
  np.testing.assert_allclose(logits, ref["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_transformers_reads_the_exported_tokenizers_with_their_bos_and_eos(tmp_path):
  import transformers

  from s3r.data import Tokenizer

  _, _, copied = _export("llama", tmp_path, tokenizer=FIXTURES / "llama")
  texts = ["def f(x):\n  return x + 1\n", "class A:\n  pass\n"] * 20
  own = Tokenizer.train(texts, 300)
  cfg = dataclasses.replace(M.hf_config(FIXTURES / "qwen3"), vocab_size=own.vocab_size)
  tok = tokenizer.HFTokenizer(hf=own.hf, bos_id=own.eot_id, eos_id=own.eot_id)
  written = M.save_hf(tmp_path / "own", cfg, M.init_params(cfg, jax.random.key(0)), tokenizer=tok)
  for out, text in ((copied, "the lazy dog"), (written, texts[0])):
    theirs, ours = transformers.AutoTokenizer.from_pretrained(out), M.load_hf_tokenizer(out)
    assert (theirs.bos_token_id, theirs.eos_token_id) == (ours.bos_id, ours.eos_id) != (None, None)
    ids = theirs(text, add_special_tokens=False)["input_ids"]
    assert ids == ours.encode(text, add_special_tokens=False) and theirs.decode(ids) == text


@pytest.mark.parametrize("name", NAMES)
def test_an_export_of_an_imported_model_carries_its_config_through_unchanged(name, tmp_path):
  """With `source=`, config.json is the source's, field for field (the multimodal fixture: its text
  model's, as the causal LM); without, it is written in the same form (rope_parameters, ...)."""
  cfg, params = M.load_hf(FIXTURES / name)
  source = json.loads((FIXTURES / name / "config.json").read_text())
  if "text_config" in source:
    text = source["text_config"]
    top = {k: source[k] for k in ("transformers_version", "dtype")}
    source = {**text, **top, "architectures": ["Gemma3ForCausalLM"]}
  out = M.save_hf(tmp_path / "export", cfg, params, source=FIXTURES / name)
  assert json.loads((out / "config.json").read_text()) == source
  assert M.hf_config(out) == cfg
  alone = save.hub_config(cfg, dtype="bfloat16")
  for key in ("rope_parameters", "num_local_experts", "layer_types"):
    if key in alone:
      assert alone[key] == source[key], key  # the form transformers writes, computed from the config alone


@pytest.mark.parametrize("name", ["gemma3", "qwen3_moe", "qwen3"])
def test_an_export_carries_the_fields_training_changed_and_cuts_the_layer_list(name, tmp_path):
  cfg, params = M.load_hf(FIXTURES / name, n_layers=1, max_seq_len=512)  # --init-layers 1, room for --seq 512
  out = M.save_hf(tmp_path / "export", cfg, params, dtype=jnp.float32, source=FIXTURES / name)
  source = json.loads((FIXTURES / name / "config.json").read_text())
  written = json.loads((out / "config.json").read_text())
  changed = {k for k in source if written.get(k) != source[k]}
  assert {"num_hidden_layers", "max_position_embeddings", "dtype"} <= changed
  assert changed <= {"num_hidden_layers", "max_position_embeddings", "dtype", "layer_types", "mlp_only_layers"}
  assert written["num_hidden_layers"] == 1 and written["max_position_embeddings"] == 512
  assert written["dtype"] == "float32" and set(written) == set(source)
  if "layer_types" in source:
    assert written["layer_types"] == source["layer_types"][:1]
  assert M.hf_config(out) == cfg


def test_an_older_spelling_of_the_source_is_written_in_the_current_form(tmp_path):
  """A source config.json with rope_theta + rope_scaling (transformers 4.x) and Qwen3-MoE's num_experts:
  the export writes rope_parameters and num_local_experts, as transformers 5 does; the rest unchanged."""
  for name in ("llama", "qwen3_moe"):
    current = json.loads((FIXTURES / name / "config.json").read_text())
    rope = dict(current["rope_parameters"])
    legacy = {k: v for k, v in current.items() if k not in ("rope_parameters", "num_local_experts")}
    legacy["rope_theta"] = rope.pop("rope_theta")
    legacy["rope_scaling"] = rope if rope["rope_type"] != "default" else None
    if "num_local_experts" in current:
      legacy["num_experts"] = current["num_local_experts"]
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(legacy))
    cfg, params = M.load_hf(FIXTURES / name)
    assert M.hf_config(folder) == cfg
    out = M.save_hf(tmp_path / f"{name}-export", cfg, params, source=folder)
    assert json.loads((out / "config.json").read_text()) == current, name
