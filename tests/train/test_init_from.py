"""Continuing a Hugging Face checkpoint (`s3r train --init-from`), evaluating one (`s3r eval --init-from`) and
exporting a run (`s3r export`), on the committed Llama fixture (the only one with a tokenizer).

The fast tests check each piece (config, tokenizer, imported initial state, refusals) and run the shortest
flow through the command line (train, export, generate); the slow one runs the whole flow: train 5 steps
with s3r_ec_dx, resume (without reading the weights again), export in f32, and evaluate the import and the
export, whose losses must be the run's own step-0 and final validation losses (the same batches, the same
weights: equal to the printed 4 decimals), then generate from the export and from the run (the Python
API's greedy tokens on the exported weights).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import numpy as np
import pytest

from s3r import cli
from s3r import model as M
from s3r.train import builder
from s3r.train.config import ConfigError, TrainConfig
from tests.model.test_hf_import import FIXTURES

LLAMA = FIXTURES / "llama"


def _config(tmp_path: pathlib.Path, corpus_dir, cache_dir, **fields) -> TrainConfig:
  base: dict[str, Any] = {"out": str(tmp_path / "run"), "init_from": str(LLAMA), "data": str(corpus_dir)}
  base |= {"cache_dir": str(cache_dir), "batch": 2, "seq": 32, "eval_batches": 2}
  return TrainConfig(**(base | fields))


def test_the_model_config_is_the_checkpoints_with_the_runs_recipe_and_layers(tmp_path, corpus_dir, cache_dir):
  cfg = _config(tmp_path, corpus_dir, cache_dir, recipe="int8_sr", init_layers=1)
  model = cfg.model_config(vocab_size=100)
  assert model == M.hf_config(LLAMA, recipe="int8_sr", n_layers=1)
  with pytest.raises(ConfigError, match=r"the tokenizer has 300 ids, the model 128"):
    cfg.model_config(vocab_size=300)


def test_init_layers_without_init_from_is_refused_naming_both_flags(tmp_path):
  with pytest.raises(ConfigError, match=r"--init-layers must be unset without --init-from, got 1"):
    TrainConfig(out=str(tmp_path), init_layers=1)
  with pytest.raises(ConfigError, match=r"--init-layers must be an integer >= 1"):
    TrainConfig(out=str(tmp_path), init_from=str(LLAMA), init_layers=0)


def test_the_data_is_encoded_with_the_checkpoints_tokenizer_its_eos_after_every_document(
  tmp_path, corpus_dir, cache_dir, monkeypatch
):
  (tmp_path / "empty-root").mkdir()
  monkeypatch.setenv("S3R_DATA", str(tmp_path / "empty-root"))  # no c4 validation set to encode
  corpus = builder.prepare_data(_config(tmp_path, corpus_dir, cache_dir), log=lambda *_: None)
  hf = M.load_hf_tokenizer(LLAMA)
  assert corpus.tokenizer.eot_id == hf.eos_id and corpus.tokenizer.vocab_size == hf.vocab_size
  tokens = np.asarray(corpus.val_tokens["val"])
  first = tokens[: int(np.argmax(tokens == hf.eos_id)) + 1]
  docs = (corpus_dir / "part0.txt").read_text().split("\n\n\n")
  assert any(list(first) == hf.encode(d, add_special_tokens=False) + [hf.eos_id] for d in docs)


def test_the_initial_state_holds_the_imported_weights_and_a_fresh_optimizer(tmp_path, corpus_dir, cache_dir):
  cfg = _config(tmp_path, corpus_dir, cache_dir, init_layers=1)
  setup = builder.build(cfg, M.load_hf_tokenizer(LLAMA).vocab_size, builder.make_mesh(cfg))
  state = setup.init_state(setup.keys["init"])
  _, want = M.load_hf(LLAMA, n_layers=1)
  assert int(state.step) == 0 and state.params["layers"]["q"].shape[0] == 1
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), state.params, want)
  assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0)


def test_the_recipe_is_checked_against_the_imported_config_not_the_unused_preset(tmp_path):
  moe = FIXTURES / "qwen3_moe"  # layer 0 dense, layers 1-2 MoE
  with pytest.raises(ConfigError, match=r"--recipe must be a recipe the qwen3_moe \(imported\) model can run"):
    TrainConfig(out=str(tmp_path), init_from=str(moe), recipe="s3r@nvfp4")
  assert TrainConfig(out=str(tmp_path), init_from=str(moe), recipe="s3r@nvfp4", init_layers=1).init_layers == 1
  assert TrainConfig(out=str(tmp_path), init_from=str(LLAMA), recipe="s3r@nvfp4", preset="moe-tiny").preset
  with pytest.raises(ConfigError, match=r"--recipe must be a recipe the moe-tiny model can run"):
    TrainConfig(out=str(tmp_path), recipe="s3r@nvfp4", preset="moe-tiny")


@pytest.mark.parametrize(
  "args, message",
  [
    (["eval"], "give a run (CHECKPOINT_DIR) or --init-from HF_DIR, not both"),
    (["eval", "run", "--init-from", str(LLAMA)], "not both"),
    (["eval", "run", "--seq", "16"], "--seq: only with --init-from"),
    (["eval", "--init-from", "no/such/checkpoint"], "no/such/checkpoint/tokenizer.json: no such file"),
    (["train", "--init-from", str(FIXTURES / "qwen3"), "--out", "run"], "the checkpoint has no tokenizer"),
    (["train", "--init-layers", "2", "--out", "run"], "--init-layers must be unset without --init-from"),
  ],
)
def test_bad_input_exits_2_in_one_line(args, message, tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  assert cli.main(args) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and "\n" not in err and not (tmp_path / "run").exists()


def test_export_into_a_non_empty_folder_exits_2_before_reading_the_run(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "keep.txt").write_text("mine")
  assert cli.main(["export", "no-run-here", "--out", "out"]) == 2
  assert "--out out exists and is not an empty folder" in capsys.readouterr().err
  assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


@pytest.mark.parametrize(
  "args, called, dtype",
  [
    (["eval", "--init-from", str(LLAMA)], "evaluate_pretrained", "bfloat16"),  # as training evaluates
    (["eval", "--init-from", str(LLAMA), "--dtype", "float32"], "evaluate_pretrained", "float32"),
    (["eval", "run"], "evaluate_checkpoint", "bfloat16"),
    (["eval", "run", "--dtype", "float32"], "evaluate_checkpoint", "float32"),
  ],
)
def test_eval_dtype_sets_the_activation_dtype_of_the_evaluation_bfloat16_by_default(args, called, dtype, monkeypatch):
  from s3r.train import evaluate

  seen = []
  monkeypatch.setattr(evaluate, called, lambda *_, act_dtype, **__: seen.append(act_dtype) or {"val": 1.0})
  assert cli.main(args) == 0 and seen == [dtype]


def test_float32_eval_of_a_fixture_is_its_float32_loss_and_bf16_eval_differs_only_at_bf16_precision(
  tmp_path, corpus_dir, cache_dir, monkeypatch
):
  from s3r.train import evaluate
  from s3r.train.step import loss_fn

  (tmp_path / "empty-root").mkdir()
  monkeypatch.setenv("S3R_DATA", str(tmp_path / "empty-root"))  # no c4 validation set to encode
  cfg = _config(tmp_path, corpus_dir, cache_dir, recipe="bf16")  # unquantized: the dtype is the only difference
  fields = {"batch": cfg.batch, "seq": cfg.seq, "eval_batches": cfg.eval_batches, "recipe": "bf16"}
  shown = {"cache_dir": str(cache_dir), "log": lambda *_: None}
  loss = {
    dtype: evaluate.evaluate_pretrained(str(LLAMA), data=str(corpus_dir), act_dtype=dtype, **fields, **shown)["val"]
    for dtype in ("bfloat16", "float32")
  }
  batches = evaluate.validation_batches(builder.prepare_data(cfg, log=lambda *_: None).val_tokens, cfg)["val"]
  model, params = M.load_hf(LLAMA, recipe="bf16", act_dtype="float32")
  step = jax.jit(lambda p, b: loss_fn(p, M.graphdef(model), b, None))
  want = float(np.mean([step(params, b) for b in batches]))
  f32, bf16 = np.finfo(np.float32).eps, float(jax.numpy.finfo(jax.numpy.bfloat16).eps)
  assert abs(loss["float32"] - want) <= 8 * f32 * want  # the float32 function: f32 rounding of the sums only
  assert 8 * f32 * want < abs(loss["bfloat16"] - want) <= bf16 * want  # within one bf16 step of the loss


def _val_line(text: str) -> str:
  return next(line for line in text.splitlines() if line.startswith("val:"))


def test_train_init_from_then_export_and_generate_from_the_command_line(
  tmp_path, corpus_dir, cache_dir, monkeypatch, capsys
):
  """The flow in its shortest form (the slow test below adds resume and the evaluations): 5 steps of
  s3r_ec_dx from the fixture, an export in f32 that `load_hf` reads back as the run's last
  parameters, and `generate` from the export with the Python API's greedy tokens."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "empty-root").mkdir()
  monkeypatch.setenv("S3R_DATA", str(tmp_path / "empty-root"))  # no c4 validation set to encode
  argv = ["train", "--init-from", str(LLAMA), "--recipe", "s3r_ec_dx", "--steps", "5", "--batch", "2", "--seq", "32"]
  argv += ["--eval-batches", "1", "--data", str(corpus_dir), "--cache-dir", str(cache_dir), "--out", "run"]
  assert cli.main([*argv, "--no-progress"]) == 0
  assert cli.main(["export", "run", "--out", "exported", "--dtype", "f32"]) == 0
  capsys.readouterr()
  _, before = M.load_hf(LLAMA, recipe="bf16", act_dtype="float32")
  cfg, after = M.load_hf(tmp_path / "exported", recipe="bf16", act_dtype="float32")
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), before, after))
  assert all(moved), "every tensor of the export is the trained one, not the fixture's"
  tok = M.load_hf_tokenizer(tmp_path / "exported")
  assert cli.main(["generate", "exported", "--prompt", "the lazy dog", "--max-new-tokens", "6", "--json"]) == 0
  (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  want = M.generate(cfg, after, [tok.encode("the lazy dog")], max_new_tokens=6)[0].tolist()
  want = want[: want.index(tok.eos_id) + 1] if tok.eos_id in want else want
  assert row["tokens"] == want and row["text"] == tok.decode([t for t in want if t != tok.eos_id])


@pytest.mark.slow
def test_train_init_from_then_resume_export_and_eval_from_the_command_line(
  tmp_path, corpus_dir, cache_dir, monkeypatch, capsys
):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "empty-root").mkdir()
  monkeypatch.setenv("S3R_DATA", str(tmp_path / "empty-root"))  # no c4 validation set to encode
  shape = ["--batch", "2", "--seq", "32", "--eval-batches", "2"]
  argv = ["train", "--init-from", str(LLAMA), "--recipe", "s3r_ec_dx", "--steps", "5", *shape]
  argv += ["--data", str(corpus_dir), "--cache-dir", str(cache_dir), "--out", "run", "--no-progress"]
  assert cli.main(argv) == 0
  run = tmp_path / "run"
  saved = json.loads((run / "config.json").read_text())
  assert saved["train"]["init_from"] == str(LLAMA) and saved["model"]["n_layers"] == 2
  assert (run / "tokenizer" / "tokenizer.json").read_bytes() == (LLAMA / "tokenizer.json").read_bytes()

  def no_import(*_):
    raise AssertionError("--resume read the imported weights again")

  monkeypatch.setattr(builder, "imported_params", no_import)
  assert cli.main(["train", "--out", "run", "--resume", "--steps", "7", "--no-progress"]) == 0
  records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == list(range(8)) and records[-1]["loss"] < records[0]["loss"]
  monkeypatch.undo()
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("S3R_DATA", str(tmp_path / "empty-root"))
  capsys.readouterr()

  assert cli.main(["export", "run", "--out", "exported", "--dtype", "f32"]) == 0
  exported = tmp_path / "exported"
  assert M.hf_config(exported) == M.hf_config(LLAMA)
  for name in ("tokenizer.json", "tokenizer_config.json"):
    assert (exported / name).read_bytes() == (LLAMA / name).read_bytes()
  capsys.readouterr()

  data = ["--data", str(corpus_dir), *shape]
  assert cli.main(["eval", "--init-from", str(LLAMA), *data]) == 0
  assert f"loss {records[0]['val_loss']:.4f}" in _val_line(capsys.readouterr().out)  # before: the run's step 0
  assert cli.main(["eval", "--init-from", "exported", *data]) == 0
  assert f"loss {records[-1]['val_loss']:.4f}" in _val_line(capsys.readouterr().out)  # after: its last step
  assert cli.main(["eval", "run", "--dtype", "float32"]) == 0  # the run's own recipe, float32 activations
  loss = float(_val_line(capsys.readouterr().out).split("loss ")[1].split(",")[0])
  assert abs(loss - records[-1]["val_loss"]) <= float(jax.numpy.finfo(jax.numpy.bfloat16).eps) * loss

  # generate from the export and from the run (with the export's bf16 recipe): the same prompt ids (the
  # fixture's family adds no BOS: "Tokenization" in docs/models.md), the API's greedy tokens, up to EOS
  cfg, params = M.load_hf(exported, recipe="bf16", act_dtype="float32")
  tok = M.load_hf_tokenizer(exported)
  ask = ["--prompt", "the lazy dog", "--max-new-tokens", "6", "--json"]
  for folder, extra, prompt in (("exported", [], []), ("run", ["--recipe", "bf16"], [])):
    assert cli.main(["generate", folder, *ask, *extra]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = M.generate(cfg, params, [prompt + tok.encode("the lazy dog")], max_new_tokens=6)[0].tolist()
    want = want[: want.index(tok.eos_id) + 1] if tok.eos_id in want else want
    assert row["tokens"] == want and (len(want) == 6 or want[-1] == tok.eos_id)
    assert row["text"] == tok.decode([t for t in want if t != tok.eos_id])
  assert cli.main(["generate", "run", "--prompt", "the lazy dog", "--max-new-tokens", "6"]) == 0  # its own recipe
  assert capsys.readouterr().out.startswith("the lazy dog")
