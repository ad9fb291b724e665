"""Validation: fixed validation batches, their mean loss, and the evaluation of a saved run.

`evaluate_checkpoint(path)` restores the newest readable checkpoint of a run (falling back
past damaged ones, and saying so) and computes its validation losses: on the run's own
validation sets, or on another corpus, named exactly as `s3r train --data` names it, with
a warning when that corpus holds training documents of the run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys

import jax
import numpy as np
import tokenizers

from s3r import data as s3r_data
from s3r.data import cache as s3r_cache
from s3r.data import corpus as s3r_corpus
from s3r.train import checkpoint
from s3r.train.builder import Setup, build, make_mesh, prepare_data
from s3r.train.config import ConfigError, TrainConfig
from s3r.train.placement import Batches


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


def evaluate(setup: Setup, params, val_sets: dict[str, list[np.ndarray]]) -> dict[str, float]:
  """Mean token loss on each validation set (whole batches, present in every process)."""
  losses = {}
  for name, batches in val_sets.items():
    place = Batches(setup.batch_sharding, batches[0].shape)
    per_batch = [setup.eval_step(params, place.from_global(b), setup.keys["eval"]) for b in batches]
    losses[name] = float(np.mean(jax.device_get(per_batch)))
  return losses


def open_run(path: str, log=print) -> tuple[checkpoint.Checkpointer, TrainConfig, dict]:
  """(checkpointer, run config, checkpoint meta) of the newest checkpoint with a readable meta under
  `path` (a run directory or its checkpoints/ folder); ConfigError if there is none."""
  directory = checkpoint.find_checkpoint_dir(path)
  if not directory.is_dir():
    raise ConfigError(f"no checkpoint directory at {path}")
  ckpt = checkpoint.Checkpointer(directory, create=False)
  if ckpt.latest_step() is None:
    raise ConfigError(f"no checkpoint in {directory}")
  try:
    _, meta = ckpt.read_latest_meta(log)
  except checkpoint.CorruptCheckpoint as e:
    raise ConfigError(str(e)) from None
  return ckpt, TrainConfig.from_dict(meta["train_config"]), meta


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
    for d in s3r_corpus.select_documents(cfg.data, max_train_docs=cfg.max_train_docs, log=lambda *_: None).train
  }
  return sum(digest(d) in train for d in docs)


def _warn(message: str) -> None:
  print(f"s3r: warning: {message}", file=sys.stderr)


def evaluate_checkpoint(
  path: str, *, data: str | None = None, max_batches: int | None = None, log=print, warn=_warn
) -> dict[str, float]:
  """Validation losses of the newest readable checkpoint under `path` (a run or its checkpoints/ folder).

  Without `data` (or with the run's own corpus), the run's validation sets ("val", "c4");
  otherwise every document of `data` (a path, or a name such as "shakespeare" or "python-stdlib"
  resolved as `s3r train --data` does), encoded with the run's tokenizer; `warn` reports how many
  of them are training documents of the run.
  """
  ckpt, cfg, meta = open_run(path, log=lambda *_: None)
  if max_batches is not None:
    cfg = dataclasses.replace(cfg, eval_batches=max_batches)
  try:
    tok = s3r_data.Tokenizer(tokenizers.Tokenizer.from_str(meta["tokenizer"]))
    setup = build(cfg, tok.vocab_size, make_mesh(dataclasses.replace(cfg, mesh=None)))
    try:
      step, state, meta = ckpt.restore_latest(setup.abstract_state, log)
    except checkpoint.CorruptCheckpoint as e:
      raise ConfigError(str(e)) from None
  finally:
    ckpt.close()
  if data is None or _same_corpus(data, cfg):
    corpus = prepare_data(cfg, log)
    if changed := tokenizer_change(corpus, cfg, meta):
      raise ConfigError(changed)
    val = corpus.val_tokens
  else:
    docs = _eval_documents(data, log)
    if overlap := training_overlap(docs, cfg):
      warn(
        f"{overlap} of the {len(docs)} documents of {data} are training documents of this run: "
        f"the loss on them is optimistic"
      )
    ids = s3r_cache.encode_long(tok, docs)
    val = {"val": np.concatenate([np.asarray(x + [tok.eot_id], np.int32) for x in ids])}
  log(f"eval: step {step} of {ckpt.directory}")
  return evaluate(setup, state.params, validation_batches(val, cfg, log))


def _eval_documents(data: str, log) -> list[str]:
  if data == s3r_corpus.STDLIB_NAME:
    return s3r_corpus.select_documents(data, log=log).val["val"]
  return list(s3r_data.read_documents(s3r_corpus.resolve_data_path(data)))
