"""Read back what `s3r train` wrote: configs, the latest checkpoint, the validation data."""

from __future__ import annotations

import dataclasses

import numpy as np

from s3r import data as s3r_data
from s3r.train.loop import build, make_mesh, open_run, prepare_data


def _adam_nu(opt_state):
  """The second-moment tree `nu` inside an optax state (ScaleByAdamState)."""
  found = []

  def visit(node):
    if hasattr(node, "nu") and hasattr(node, "mu"):
      found.append(node.nu)
    elif isinstance(node, (tuple, list)):
      for child in node:
        visit(child)

  visit(opt_state)
  if len(found) != 1:
    raise ValueError(f"expected one Adam state in the optimizer state, found {len(found)}")
  return found[0]


def load_run(path: str, *, log=print) -> dict:
  """The latest checkpoint of a run: model config, params, Adam's ν, the init params of the
  same seed, the step and the first validation batches (host numpy)."""
  ckpt, cfg, _ = open_run(path)
  corpus = prepare_data(cfg, log)
  setup = build(cfg, corpus.tokenizer.vocab_size, make_mesh(dataclasses.replace(cfg, mesh=None)))
  state, _ = ckpt.restore(setup.abstract_state)
  ckpt.close()
  val_batch = next(s3r_data.eval_batches(corpus.val_tokens["val"], batch_size=cfg.batch, seq_len=cfg.seq,
                                         max_batches=1))
  init = setup.init_state(setup.keys["init"])
  return {"train_config": cfg, "model_cfg": setup.model_cfg, "params": state.params,
          "nu": _adam_nu(state.opt_state), "init_params": init.params, "step": int(state.step),
          "val_batch": np.asarray(val_batch)}
