"""Generation with the key/value cache (s3r.model.generate, s3r.model.Decoder) on the Hugging Face fixtures.

Every fixture (tests/model/fixtures_hf/) records transformers' float32 logits of two 24-token rows and
its greedy continuation of an 8-token prompt. s3r runs them with float32 activations and the `bf16`
recipe (f32 products), where its full forward equals the recorded logits to 1e-5 relative
(test_hf_import.py); decoding through the cache must give the same. The batch is always the same two
left-padded prompts of different lengths (13 and 8, or 13 and 5), so the prefill and the decode step
compile once per family.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s3r import model as M
from s3r.model.generation import check_prompts, left_pad, sample
from tests.model.test_hf_import import NAMES

FIXTURES = pathlib.Path(__file__).parent / "fixtures_hf"
FAMILIES = [n for n in NAMES if n != "gemma3_multimodal"]  # the multimodal fixture holds the gemma3 text tower
EXACT = 1e-5  # s3r's float32 forward vs transformers' float32 logits (test_hf_import.py)
LONG, NEW = 13, 8  # the longer prompt (past gemma3's sliding window of 8) and the tokens decoded after it


def _load(name: str):
  cfg, params = M.load_hf(FIXTURES / name, recipe="bf16", act_dtype="float32")
  return cfg, params, np.load(FIXTURES / name / "reference.npz")


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_generation_continues_each_fixture_as_transformers_does_when_left_padded(name):
  cfg, params, ref = _load(name)
  prompt = ref["prompt"][0].tolist()
  assert len(prompt) < LONG  # so the recorded prompt is left-padded in the batch
  out = M.generate(cfg, params, [prompt, ref["tokens"][1, :LONG]], max_new_tokens=NEW)
  assert out.shape == (2, NEW) and out.dtype == np.int32
  np.testing.assert_array_equal(out[0], ref["greedy"][0])


@pytest.mark.parametrize("name", FAMILIES)
def test_cached_decoding_gives_the_full_forward_logits_of_a_left_padded_batch(name):
  cfg, params, ref = _load(name)
  tokens, want = ref["tokens"], ref["logits"]  # want: the full forward of each whole row
  lengths = (LONG, 5)
  dec = M.Decoder(cfg, params, [tokens[b, :n] for b, n in enumerate(lengths)], max_new_tokens=NEW)
  got = [np.asarray(dec.prefill())]
  for t in range(NEW - 1):  # teacher forcing: the next recorded token of each row
    got.append(np.asarray(dec.step(jnp.asarray([tokens[b, n + t] for b, n in enumerate(lengths)]))))
  for b, n in enumerate(lengths):
    mine = np.stack([g[b] for g in got])  # the logits after positions n-1 .. n+NEW-2
    full = want[b, n - 1 : n - 1 + NEW]
    rel = np.linalg.norm(mine - full) / np.linalg.norm(full)
    assert rel < EXACT, f"{name} row {b}: relative error {rel:.2e}"


@pytest.mark.parametrize("field, value", [("sliding_window", 64), ("local_rope_theta", 1e6)])
def test_the_cached_comparison_fails_when_a_gemma3_local_layer_feature_is_changed(field, value):
  cfg, params, ref = _load("gemma3")
  dec = M.Decoder(dataclasses.replace(cfg, **{field: value}), params, [ref["tokens"][0, :LONG]], max_new_tokens=1)
  got, full = np.asarray(dec.prefill())[0], ref["logits"][0, LONG - 1]
  assert np.linalg.norm(got - full) / np.linalg.norm(full) > 100 * EXACT


def test_the_cache_holds_keys_and_values_or_for_mla_the_latent_and_the_shared_rope_key():
  from s3r.model import cache

  for name, want in [("gemma3", {"k": (2, 24), "v": (2, 24)}), ("deepseek_v2", {"latent": (32,), "k_rope": (1, 8)})]:
    cfg = M.hf_config(FIXTURES / name, act_dtype="float32")
    slots = cache.empty(cfg, batch=2, length=LONG + NEW)
    assert slots.slot_pos_BxL.shape == (2, LONG + NEW)
    # stacked over the layers like the blocks' parameters
    assert {k: v.shape for k, v in slots.layers.items()} == {
      k: (cfg.n_layers, 2, LONG + NEW, *s) for k, s in want.items()
    }, name


# Sampling: the sampler on fixed logits (frequencies within bounds from the binomial variance), then
# end to end on the llama fixture.

DRAWS = 20_000
Z = 5.0  # a frequency off by more than Z binomial standard deviations fails (probability ~6e-7 per token)


def _frequencies(logits_V, key, **kw):
  tokens = sample(jnp.broadcast_to(logits_V, (DRAWS, logits_V.shape[0])), key, **kw)
  return np.bincount(np.asarray(tokens), minlength=logits_V.shape[0]) / DRAWS


def _within_binomial_bounds(freq, p):
  sd = np.sqrt(p * (1 - p) / DRAWS)
  return np.all(np.abs(freq - p) <= Z * sd + 1e-12)


def test_sampling_draws_from_the_tempered_softmax():
  logits = jnp.asarray([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
  freq = _frequencies(logits, jax.random.key(0), temperature=2.0, top_k=None)
  assert _within_binomial_bounds(freq, np.asarray(jax.nn.softmax(logits / 2.0)))
  assert not _within_binomial_bounds(freq, np.asarray(jax.nn.softmax(logits)))  # the temperature matters


def test_top_k_sampling_draws_only_the_k_most_likely_tokens_in_their_renormalized_proportions():
  logits = jnp.asarray([0.3, 2.0, -1.0, 1.5, 0.9, 1.0])
  freq = _frequencies(logits, jax.random.key(1), temperature=1.0, top_k=3)
  top = np.asarray([1, 3, 5])
  assert set(np.flatnonzero(freq)) <= set(top.tolist())
  p = np.zeros(6)
  p[top] = np.asarray(jax.nn.softmax(logits[top]))
  assert _within_binomial_bounds(freq, p)


def test_greedy_is_the_argmax_and_ignores_the_key():
  logits = jax.random.normal(jax.random.key(2), (16, 50))
  assert np.array_equal(sample(logits, None, temperature=0, top_k=None), np.argmax(logits, axis=-1))


def test_sampled_generation_is_reproducible_per_seed_and_keeps_to_the_top_k():
  cfg, params, ref = _load("llama")
  prompts = [ref["prompt"][0], ref["tokens"][1, :LONG]]
  run = lambda seed, k: M.generate(
    cfg, params, prompts, max_new_tokens=NEW, temperature=1.5, top_k=k, key=jax.random.key(seed)
  )
  first = run(0, 4)
  assert np.array_equal(first, run(0, 4))
  assert not np.array_equal(first, run(1, 4))  # 16 draws among 4 tokens: equal with probability < 0.76**16
  assert np.array_equal(run(0, 1), M.generate(cfg, params, prompts, max_new_tokens=NEW))  # top-1 is greedy
  dec = M.Decoder(cfg, params, prompts, max_new_tokens=NEW)  # each drawn token among the 4 largest logits
  logits = [dec.prefill()] + [dec.step(first[:, t]) for t in range(NEW - 1)]
  for t, step_logits in enumerate(logits):
    top4 = np.argsort(-np.asarray(step_logits), axis=-1)[:, :4]
    assert all(first[b, t] in top4[b] for b in range(2)), t


# Arguments


def test_left_padding_right_aligns_the_prompts():
  tokens, valid = left_pad([[5, 6, 7], [8]], pad_id=0)
  assert tokens.tolist() == [[5, 6, 7], [0, 0, 8]] and valid.tolist() == [[True] * 3, [False, False, True]]


@pytest.mark.parametrize(
  "kwargs, prompts, match",
  [
    ({"max_new_tokens": 0}, [[1, 2]], "max_new_tokens must be a positive int"),
    ({"max_new_tokens": 2}, [[1, 2], []], "prompt 1 is empty"),
    ({"max_new_tokens": 2}, [], "no prompts"),
    ({"max_new_tokens": 2}, [[1, 999]], "token id 999 outside the vocabulary"),
    ({"max_new_tokens": 2, "temperature": -1.0}, [[1]], "temperature must be >= 0"),
    ({"max_new_tokens": 2, "temperature": 1.0}, [[1]], "needs a key"),
    ({"max_new_tokens": 2, "top_k": 0}, [[1]], "top_k must be an int"),
    ({"max_new_tokens": 250}, [[1] * 10], r"plus max_new_tokens \(250\) exceeds the model's max_seq_len \(256\)"),
  ],
)
def test_bad_generation_arguments_are_refused_in_one_line(kwargs, prompts, match):
  cfg = M.hf_config(FIXTURES / "llama")
  params = jax.eval_shape(lambda: M.init_params(cfg, jax.random.key(0)))  # refused before any compute
  with pytest.raises(ValueError, match=match) as info:
    M.generate(cfg, params, prompts, **kwargs)
  assert "\n" not in str(info.value)


def test_prompts_may_be_arrays_or_lists():
  assert check_prompts([np.asarray([3, 4]), (5,)], 8) == [[3, 4], [5]]
