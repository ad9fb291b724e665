"""Validation: fixed validation batches, their mean loss, and the evaluation of a saved run.

`evaluate_checkpoint(path)` restores the newest readable checkpoint of a run (falling back
past damaged ones, and saying so), or the one of a given step (`step=`, or `path` naming one
checkpoint's folder), and computes its validation losses: on the run's own
validation sets, or on another corpus, named exactly as `s3r train --data` names it, with
a warning when that corpus holds training documents of the run. `evaluate_pretrained(HF_DIR)` does
the same for a Hugging Face checkpoint (`s3r eval --init-from`), before any fine-tuning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pathlib
import sys
from typing import NamedTuple

import jax
import numpy as np
import tokenizers

from s3r import data as s3r_data
from s3r.data import cache as s3r_cache
from s3r.data import corpus as s3r_corpus
from s3r.train.builder import Setup, build, compile_eval_step, imported_params, make_mesh, prepare_data
from s3r.train.config import ConfigError, TrainConfig
from s3r.train.run import checkpoint, logs
from s3r.train.run.placement import Batches
from s3r.train.step import TrainState


def validation_batches(corpus_val: dict, cfg: TrainConfig, log=print) -> dict[str, list[np.ndarray]]:
  """Up to `eval_batches` fixed batches per validation set; sets too small for one batch are skipped."""
  out = {}
  for name, tokens in corpus_val.items():
    try:
      out[name] = list(
        s3r_data.eval_batches(tokens, batch_size=cfg.batch, seq_len=cfg.seq_len, max_batches=cfg.eval_batches)
      )
    except s3r_data.DataError as e:
      if name == "val":
        raise
      log(f"validation set {name!r} skipped: {e}")
  return out


def evaluate(setup: Setup, params, val_sets: dict[str, list[np.ndarray]], *, eval_step=None) -> dict[str, float]:
  """Mean token loss on each validation set (whole batches, present in every process), with `eval_step`
  (default: setup.eval_step; e.g. `compile_eval_step`'s, compiled for these batches)."""
  eval_step = eval_step or setup.eval_step
  losses = {}
  for name, batches in val_sets.items():
    place = Batches(setup.batch_sharding, batches[0].shape)
    per_batch = [eval_step(params, place.from_global(b), setup.keys["eval"]) for b in batches]
    losses[name] = float(np.mean(jax.device_get(per_batch)))
  return losses


def checkpoint_location(path: str, step: int | None = None) -> tuple[pathlib.Path, int | None]:
  """(checkpoint folder, step or None for the newest readable) that `path` and `step` name: `path` is a run
  directory, its checkpoints/ folder, or one checkpoint's folder (checkpoints/25: step 25)."""
  given = pathlib.Path(path).absolute()
  directory = checkpoint.find_checkpoint_dir(given)
  if directory == given and given.name.isdigit() and given.is_dir() and not _holds_steps(given):
    if step is not None and step != int(given.name):
      raise ConfigError(f"{path} is the checkpoint of step {int(given.name)} but --step {step} was given; give one")
    return given.parent, int(given.name)
  return directory, step


def _holds_steps(directory: pathlib.Path) -> bool:
  return any(p.is_dir() and p.name.isdigit() for p in directory.iterdir())


def open_run(path: str, log=print, *, step: int | None = None) -> tuple[checkpoint.Checkpointer, TrainConfig, dict]:
  """(checkpointer, run config, checkpoint meta) of checkpoint `step` (default: the newest with a readable meta)
  under `path` (see `checkpoint_location`); ConfigError if there is none, or that step is missing or unreadable."""
  directory, step = checkpoint_location(path, step)
  if not directory.is_dir():
    raise ConfigError(f"no checkpoint directory at {path}")
  ckpt = checkpoint.Checkpointer(directory, create=False)
  try:
    if ckpt.latest_step() is None:
      raise ConfigError(f"no checkpoint in {directory}")
    if step is None:
      try:
        _, meta = ckpt.read_latest_meta(log)
      except checkpoint.CorruptCheckpoint as e:
        raise ConfigError(str(e)) from None
    else:
      meta = _read_step(ckpt, step, ckpt.read_meta)
  except BaseException:
    ckpt.close()
    raise
  return ckpt, TrainConfig.from_dict(meta["train_config"]), meta


def _read_step(ckpt: checkpoint.Checkpointer, step: int, read):
  """`read(step)` (a meta, or a (state, meta) pair) of the checkpoint of `step`; ConfigError naming the steps that
  exist if it is missing, and why if it cannot be read."""
  steps = sorted(ckpt.all_steps())
  if step not in steps:
    raise ConfigError(
      f"no checkpoint of step {step} in {ckpt.directory}; its checkpoints are steps {', '.join(map(str, steps))}"
    )
  try:
    value = read(step)
  except Exception as e:  # orbax, JSON and file-system errors of a damaged checkpoint
    why = f"{type(e).__name__}: {(str(e).strip().splitlines() or ['unreadable'])[0][:160]}"
    raise ConfigError(f"the checkpoint of step {step} in {ckpt.directory} is unreadable ({why})") from None
  meta = value[1] if isinstance(value, tuple) else value
  if not isinstance(meta, dict) or "train_config" not in meta:
    raise ConfigError(f"the checkpoint of step {step} in {ckpt.directory} has no train_config in its meta")
  return value


def tokenizer_change(corpus: s3r_data.Corpus, cfg: TrainConfig, meta: dict) -> str | None:
  """What differs between the tokenizer prepared for the run's corpus and the one in its checkpoint `meta`
  (the corpus changed since), or None."""
  if corpus.tokenizer.hf.to_str() == meta["tokenizer"]:
    return None
  return f"the tokenizer prepared for {cfg.data or 'the default corpus'} differs from the run's"


def _same_corpus(data: str, cfg: TrainConfig) -> bool:
  if data == cfg.data:
    return True
  if cfg.data is None:
    return data == s3r_corpus.ENWIKI_NAME
  try:
    mine, theirs = s3r_corpus.resolve_data_path(data), s3r_corpus.resolve_data_path(cfg.data)
  except s3r_data.DataError:
    return False
  return os.path.realpath(mine) == os.path.realpath(theirs)


def training_overlap(docs: list[str], cfg: TrainConfig) -> int:
  """How many of `docs` are (exact) training documents of the run `cfg`."""
  digest = lambda d: hashlib.blake2b(d.encode("utf-8", "surrogatepass"), digest_size=16).digest()
  train = {
    digest(d)
    for d in s3r_corpus.select_documents(
      cfg.data, max_train_docs=cfg.max_train_docs, text_column=cfg.text_column, log=lambda *_: None
    ).train
  }
  return sum(digest(d) in train for d in docs)


def _warn(message: str) -> None:
  print(f"s3r: warning: {message}", file=sys.stderr)


def evaluate_checkpoint(
  path: str,
  *,
  step: int | None = None,
  data: str | None = None,
  max_batches: int | None = None,
  act_dtype: str = "bfloat16",
  cache_dir: str | None = None,
  log=print,
  warn=_warn,
) -> dict[str, float]:
  """Validation losses of checkpoint `step` (default: the newest readable one) under `path` (a run, its
  checkpoints/ folder, or one checkpoint's folder such as checkpoints/25).

  Without `data` (or with the run's own corpus), the run's validation sets ("val", "c4");
  otherwise every document of `data` (a path, or a name such as "shakespeare" or "python-stdlib"
  resolved as `s3r train --data` does), encoded with the run's tokenizer; `warn` reports how many
  of them are training documents of the run. `act_dtype`: the activations' (s3r.model.ModelConfig.act_dtype;
  bfloat16, as training evaluates: the run's own numbers). `cache_dir`: the tokenizer and token cache
  (default: the run's).
  """
  restored = restore_run(path, step=step, log=log, act_dtype=act_dtype)
  cfg, setup, step, state, meta, tok, _ = restored
  if max_batches is not None:
    cfg = dataclasses.replace(cfg, eval_batches=max_batches)
  if cache_dir is not None:
    cfg = dataclasses.replace(cfg, cache_dir=os.path.abspath(os.path.expanduser(cache_dir)))
  if data is None or _same_corpus(data, cfg):
    corpus = prepare_data(cfg, log)
    if changed := tokenizer_change(corpus, cfg, meta):
      raise ConfigError(changed)
    val = corpus.val_tokens
  else:
    docs = _eval_documents(data, log, cfg.text_column)
    if overlap := training_overlap(docs, cfg):
      warn(
        f"{overlap} of the {len(docs)} documents of {data} are training documents of this run: "
        f"the loss on them is optimistic"
      )
    ids = s3r_cache.encode_long(tok, docs)
    val = {"val": np.concatenate([np.asarray(tok.document(x), np.int32) for x in ids])}
  val_sets = validation_batches(val, cfg, log)
  log(f"eval: step {step} of {restored.directory}")
  return evaluate(setup, state.params, val_sets, eval_step=compile_eval_step(setup, cfg, log))


class Restored(NamedTuple):
  """A run's checkpoint restored (`restore_run`) on one device."""

  config: TrainConfig
  setup: Setup
  step: int
  state: TrainState
  meta: dict
  tokenizer: s3r_data.Tokenizer
  directory: pathlib.Path  # the checkpoints/ folder


def restore_run(path: str, *, step: int | None = None, log=print, **model_overrides) -> Restored:
  """Checkpoint `step` (default: the newest readable) under `path` (a run, its checkpoints/ folder, or one
  checkpoint's folder) with its config, compiled pieces and tokenizer; `model_overrides` replace fields of the
  run's model config that leave its parameters as they are (e.g. act_dtype="float32")."""
  directory, step = checkpoint_location(path, step)
  with _library_logs_of(directory):
    return _restore_run(path, directory, step, log, model_overrides)


@contextlib.contextmanager
def _library_logs_of(directory: pathlib.Path):
  """While reading the checkpoints in `directory`, the libraries' logs and the tracebacks their callbacks
  report (tensorstore's "Event loop is closed" after a damaged checkpoint) go to the run's log file
  (train.log beside checkpoints/; nowhere if the run cannot be written), not to the console."""
  run_dir = directory.parent
  path = run_dir / logs.LOG_FILE if os.access(run_dir, os.W_OK) else pathlib.Path(os.devnull)
  with logs.library_logs(path, verbose=False):
    yield


def _restore_run(path: str, directory: pathlib.Path, step: int | None, log, model_overrides: dict) -> Restored:
  ckpt, cfg, meta = open_run(path if step is None else str(directory), log=lambda *_: None, step=step)
  try:
    tok = checkpoint_tokenizer(meta)
    setup = build(cfg, tok.vocab_size, make_mesh(dataclasses.replace(cfg, mesh=None)), **model_overrides)
    step, state, meta = _restore(ckpt, setup, step, log)
  finally:
    ckpt.close()
  return Restored(cfg, setup, step, state, meta, tok, ckpt.directory)


def checkpoint_tokenizer(meta: dict) -> s3r_data.Tokenizer:
  """The tokenizer a checkpoint's meta records, with its end-of-text token (`<|endoftext|>` when none is named)
  and the BOS token that starts every document, if any (`s3r_data.Tokenizer`)."""
  hf = tokenizers.Tokenizer.from_str(meta["tokenizer"])
  released = meta.get("train_config", {}).get("init_from") is not None
  return s3r_data.Tokenizer(hf, meta.get("eot", s3r_data.EOT), bos=meta.get("bos"), released=released)


def evaluate_pretrained(
  init_from: str, *, data: str | None = None, act_dtype: str = "bfloat16", log=print, **fields
) -> dict[str, float]:
  """Validation losses of the Hugging Face checkpoint folder `init_from` on the validation sets that
  `s3r train --init-from init_from --data data` holds out (the same numbers as that run's step-0 validation
  with the same `fields`: batch, seq, eval_batches, init_layers, cache_dir, mesh; and the default `act_dtype`,
  bfloat16, as training evaluates)."""
  cfg = TrainConfig(out=init_from, init_from=init_from, data=data, **fields)
  corpus = prepare_data(cfg, log)
  setup = build(cfg, corpus.tokenizer.vocab_size, make_mesh(cfg), act_dtype=act_dtype)
  params = imported_params(cfg, jax.tree.map(lambda x: x.sharding, setup.abstract_state.params))
  val_sets = validation_batches(corpus.val_tokens, cfg, log)
  log(f"eval: {init_from} ({type(setup.model_cfg).__name__}, {setup.model_cfg.n_layers} layers)")
  return evaluate(setup, params, val_sets, eval_step=compile_eval_step(setup, cfg, log))


def _restore(ckpt: checkpoint.Checkpointer, setup: Setup, step: int | None, log) -> tuple[int, TrainState, dict]:
  """(step, state, meta) of checkpoint `step`, or of the newest that restores when `step` is None."""
  fallback = checkpoint.per_layer_fallback(setup.model_cfg)  # runs saved before the blocks were stacked
  if step is not None:
    state, meta = _read_step(ckpt, step, lambda s: ckpt.restore(setup.abstract_state, s, fallback=fallback))
    return step, state, meta
  try:
    return ckpt.restore_latest(setup.abstract_state, log, fallback=fallback)
  except checkpoint.CorruptCheckpoint as e:
    raise ConfigError(str(e)) from None


def _eval_documents(data: str, log, text_column: str | None = None) -> list[str]:
  """The documents of `data` (a Parquet, Arrow or JSON-lines corpus: its column `text_column`, the run's)."""
  if data == s3r_corpus.STDLIB_NAME:
    return list(s3r_corpus.select_documents(data, log=log).val["val"])
  return list(s3r_data.read_documents(s3r_corpus.resolve_data_path(data), text_column))
