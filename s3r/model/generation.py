"""Autoregressive generation with a key/value cache (s3r.model.cache) for every decoder family.

`generate(cfg, params, prompts, max_new_tokens=..., temperature=..., top_k=..., key=...)` runs one
prefill over the left-padded prompts and then one jitted decode step per new token. The numerics
are the config's: its recipe's forward (INT8 recipes quantize per token, so cached and full
forwards agree) and its `act_dtype` (pass `dataclasses.replace(cfg, act_dtype="float32")` for a
float32 generation). MoE layers route dropless (capacity_factor=None, as in inference: a capacity
would depend on how many tokens a step holds). A `Decoder` exposes the prefill and the steps.

Positions: each prompt's tokens sit at 0..n-1 whatever its padding; padding slots are masked
out of attention. Sampling: greedy (temperature 0), or softmax(logits / temperature) over all
tokens or the `top_k` most likely ones. Keys: `key` is split by purpose with fold_in ("sample",
then the step index), so a seed gives the same tokens on every run.

Dimension letters: B prompts, S padded prompt length, L = S + max_new_tokens cache slots, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from s3r.model import cache as kv
from s3r.model import families
from s3r.model.config import ModelConfig
from s3r.model.transformer import graphdef

PURPOSES = ("sample", "forward")  # fold_in data of the generation key's uses


def _purpose(key: jax.Array, name: str) -> jax.Array:
  return jax.random.fold_in(key, PURPOSES.index(name))


def inference_config(cfg: ModelConfig) -> ModelConfig:
  """`cfg` as generation runs it: no rematerialization, and the family's inference settings
  (`Family.inference`: the MoE families route dropless)."""
  return dataclasses.replace(cfg, remat=False, **families.family_of(cfg).inference)


@functools.partial(jax.jit, static_argnums=0)
def _forward(gdef, params, cache: kv.Cache, tokens_BxS, positions_BxS, valid_BxS, index, key):
  """(f32 logits of the last new token [B, V], the cache with the new tokens written)."""
  step = kv.Step(cache, index, positions_BxS, valid_BxS)
  logits_BxSxV = nnx.merge(gdef, params)(tokens_BxS, key=key, cache=step)
  return logits_BxSxV[:, -1], step.cache()


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [B, S] int32, valid [B, S] bool): the prompts right-aligned, padding `pad_id` before them."""
  s = max(len(p) for p in prompts)
  tokens = np.full((len(prompts), s), pad_id, np.int32)
  valid = np.zeros((len(prompts), s), bool)
  for b, p in enumerate(prompts):
    if len(p):
      tokens[b, s - len(p) :], valid[b, s - len(p) :] = p, True
  return tokens, valid


class Decoder:
  """A prefill over left-padded prompts, then one decode step per token (all examples together)."""

  def __init__(self, cfg: ModelConfig, params: dict, prompts: Sequence[Sequence[int]], *, max_new_tokens: int):
    check_count(max_new_tokens)
    prompts = check_prompts(prompts, cfg.vocab_size)
    self.cfg = inference_config(cfg)
    self.length = max(len(p) for p in prompts) + max_new_tokens
    if self.length > cfg.max_seq_len:
      raise ValueError(
        f"the longest prompt ({self.length - max_new_tokens} tokens) plus max_new_tokens ({max_new_tokens}) "
        f"exceeds the model's max_seq_len ({cfg.max_seq_len})"
      )
    self.params, self.gdef = params, graphdef(self.cfg)
    self.tokens_BxS, self.valid_BxS = left_pad(prompts)
    self.index = 0  # the next slot to write
    self.next_pos_B = jnp.asarray(self.valid_BxS.sum(axis=1), jnp.int32)
    self.cache = kv.empty(self.cfg, len(prompts), self.length)

  def _run(self, tokens_BxS, positions_BxS, valid_BxS, key) -> jax.Array:
    if key is None and self.cfg.recipe.stochastic:
      key = jax.random.key(0)  # stochastic recipes want a key; their forward (RTNE) never reads it
    args = (jnp.asarray(tokens_BxS), positions_BxS, jnp.asarray(valid_BxS), jnp.int32(self.index), key)
    logits_BxV, self.cache = _forward(self.gdef, self.params, self.cache, *args)
    self.index += tokens_BxS.shape[1]
    return logits_BxV

  def prefill(self, key: jax.Array | None = None) -> jax.Array:
    """f32 logits [B, V] after each whole prompt (of its next token)."""
    if self.index:
      raise RuntimeError("Decoder.prefill runs once, first")
    positions_BxS = jnp.maximum(jnp.cumsum(jnp.asarray(self.valid_BxS), axis=1, dtype=jnp.int32) - 1, 0)
    return self._run(self.tokens_BxS, positions_BxS, self.valid_BxS, key)

  def step(self, tokens_B, key: jax.Array | None = None) -> jax.Array:
    """Appends one token per example; f32 logits [B, V] of the token after it."""
    if not self.index:
      raise RuntimeError("Decoder.step needs the prefill first")
    if self.index >= self.length:
      raise ValueError(f"the cache is full: {self.length} slots")
    tokens_Bx1 = jnp.asarray(tokens_B, jnp.int32).reshape(-1, 1)
    logits_BxV = self._run(tokens_Bx1, self.next_pos_B[:, None], np.ones(tokens_Bx1.shape, bool), key)
    self.next_pos_B = self.next_pos_B + 1
    return logits_BxV


def sample(logits_BxV: jax.Array, key: jax.Array | None, *, temperature: float, top_k: int | None) -> jax.Array:
  """Next tokens [B] int32: the argmax for temperature 0, else drawn from softmax(logits / temperature)
  restricted to the `top_k` largest logits (all of them for None)."""
  if temperature == 0:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  if key is None:
    raise ValueError("sample: temperature > 0 needs a key")
  if top_k is None:
    return jax.random.categorical(key, logits_BxV / temperature, axis=-1).astype(jnp.int32)
  top_BxK, index_BxK = jax.lax.top_k(logits_BxV, top_k)
  choice_B = jax.random.categorical(key, top_BxK / temperature, axis=-1)
  return jnp.take_along_axis(index_BxK, choice_B[:, None], axis=-1)[:, 0].astype(jnp.int32)


def generate(
  cfg: ModelConfig,
  params: dict,
  prompts: Sequence[Sequence[int]],
  *,
  max_new_tokens: int,
  temperature: float = 0.0,
  top_k: int | None = None,
  key: jax.Array | None = None,
) -> np.ndarray:
  """The `max_new_tokens` tokens [B, max_new_tokens] (int32) continuing each prompt (token id lists,
  any lengths; left-padded together). Greedy for temperature 0; sampling needs `key`."""
  check_sampling(cfg, max_new_tokens, temperature, top_k, key)
  dec = Decoder(cfg, params, prompts, max_new_tokens=max_new_tokens)
  forward_key = None if key is None else _purpose(key, "forward")
  sample_key = None if key is None else _purpose(key, "sample")
  logits_BxV = dec.prefill(forward_key)
  out = []
  for t in range(max_new_tokens):
    step_key = None if sample_key is None else jax.random.fold_in(sample_key, t)
    out.append(sample(logits_BxV, step_key, temperature=temperature, top_k=top_k))
    if t + 1 < max_new_tokens:
      logits_BxV = dec.step(out[-1], None if forward_key is None else jax.random.fold_in(forward_key, t + 1))
  return np.stack([np.asarray(x) for x in out], axis=1)


def check_prompts(prompts, vocab_size: int) -> list[list[int]]:
  """The prompts as lists of ints; ValueError (one line) for none, an empty one or an id outside the vocabulary."""
  rows = [list(map(int, np.asarray(p).reshape(-1))) for p in prompts]
  if not rows:
    raise ValueError("generate: no prompts")
  for i, row in enumerate(rows):
    if not row:
      raise ValueError(f"generate: prompt {i} is empty")
    bad = [t for t in row if not 0 <= t < vocab_size]
    if bad:
      raise ValueError(f"generate: prompt {i} has token id {bad[0]} outside the vocabulary [0, {vocab_size})")
  return rows


def check_count(max_new_tokens) -> None:
  if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens <= 0:
    raise ValueError(f"generate: max_new_tokens must be a positive int, got {max_new_tokens!r}")


def check_sampling(cfg: ModelConfig, max_new_tokens, temperature, top_k, key) -> None:
  """ValueError (one line, naming the argument) for a bad sampling argument."""
  check_count(max_new_tokens)
  if not isinstance(temperature, (int, float)) or not temperature >= 0:
    raise ValueError(f"generate: temperature must be >= 0, got {temperature!r}")
  if top_k is not None and (not isinstance(top_k, int) or not 1 <= top_k <= cfg.vocab_size):
    raise ValueError(f"generate: top_k must be an int in [1, vocab_size={cfg.vocab_size}] or None, got {top_k!r}")
  if temperature > 0 and key is None:
    raise ValueError("generate: sampling (temperature > 0) needs a key")
