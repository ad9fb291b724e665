"""Builds the tiny Hugging Face checkpoints under tests/model/fixtures_hf/ (one per family and
variant) with `transformers`' own `save_pretrained`, and records what `transformers` computes
from the saved files: float32 logits (eager attention) of a fixed token batch and a greedy
continuation, in `reference.npz` beside each checkpoint.

Run by hand where `torch` and `transformers` are installed (they are not s3r dependencies):

    python scripts/make_hf_fixtures.py [--out tests/model/fixtures_hf]

Each configuration exercises the features of its family that change the computed function (see
FIXTURES), at weights scaled so that each feature moves the logits: matrices N(0, 1/fan_in), the
embedding N(0, 1), norm scales 1 + N(0, 0.3) (Gemma's, stored as an offset, N(0, 0.3)), routers
4x larger so that routing is decisive. Gemma's token embedding is N(0, 1/256) instead: Gemma
multiplies it by sqrt(width) = 8, and at N(0, 1) the scaled embedding (RMS 8) outweighs the
normalized sublayer outputs (RMS ~1), so the tied logits head only repeats the last token and greedy
decoding checks nothing; at RMS 1/2 in the residual stream the continuation varies. Weights are
rounded to bfloat16 and saved in bfloat16 (as the published checkpoints are); the reference logits
come from the saved files loaded back in float32, so they are exactly what `transformers` computes
from the committed weights.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import shutil

import numpy as np
import tokenizers
import torch
import transformers as T

BATCH, SEQ = 2, 24  # the reference token batch; Gemma's window (8) is shorter than SEQ
PROMPT, NEW_TOKENS = 8, 8  # greedy continuation of the first row's first PROMPT tokens
MIN_DISTINCT = 3  # distinct tokens the continuation must hold: one repeated token checks little of decoding
VOCAB = 128

_COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5)


def llama() -> T.PretrainedConfig:
  # head dim 16: wavelengths 2*pi*10000^(i/8) = 6.3, 20, 63, 199, ...; with an original context of 64
  # (low_freq_factor 1, high_freq_factor 4) the first is kept, the next two interpolated, the rest / 8.
  rope = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
  rope["original_max_position_embeddings"] = 64
  return T.LlamaConfig(
    **_COMMON, intermediate_size=96, num_hidden_layers=2, max_position_embeddings=256, rope_parameters=rope
  )


def qwen3() -> T.PretrainedConfig:
  # head dim 24 with width 64 and 4 heads: the query width (96) differs from the model width.
  return T.Qwen3Config(
    **_COMMON,
    head_dim=24,
    intermediate_size=96,
    num_hidden_layers=2,
    max_position_embeddings=256,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0),
  )


def gemma3_text() -> T.PretrainedConfig:
  # layers local, global, local: window 8 < SEQ, local base 10000, global base 1e5 with linear scaling 2,
  # query_pre_attn_scalar 20 != head dim 24, tied embeddings scaled by sqrt(64).
  return T.Gemma3TextConfig(
    **_COMMON,
    head_dim=24,
    intermediate_size=96,
    num_hidden_layers=3,
    max_position_embeddings=256,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    query_pre_attn_scalar=20,
    rope_parameters={
      "full_attention": dict(rope_type="linear", factor=2.0, rope_theta=100000.0),
      "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
    },
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
  )


def gemma3_multimodal() -> T.PretrainedConfig:
  # the text tower of gemma3_text inside Gemma3ForConditionalGeneration, with a one-layer SigLIP tower
  vision = T.SiglipVisionConfig(
    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8
  )
  return T.Gemma3Config(
    text_config=gemma3_text(),
    vision_config=vision,
    mm_tokens_per_image=4,
    boi_token_index=VOCAB - 3,
    eoi_token_index=VOCAB - 2,
    image_token_index=VOCAB - 1,
  )


def qwen3_moe() -> T.PretrainedConfig:
  # layer 0 dense (mlp_only_layers [0]), then routed MoE: top-2 of 8 experts, renormalized.
  return T.Qwen3MoeConfig(
    **_COMMON,
    head_dim=16,
    intermediate_size=96,
    num_hidden_layers=3,
    max_position_embeddings=256,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    norm_topk_prob=True,
    mlp_only_layers=[0],
    rope_parameters=dict(rope_type="default", rope_theta=10000.0),
  )


def _deepseek(q_lora_rank, mscale, mscale_all_dim) -> T.PretrainedConfig:
  # MLA (latent 32, 16 + 8 query/key dims, 12 value dims) with YaRN over an original context of 16;
  # layer 0 dense, then top-3 of 8 routed experts (not renormalized) x routed_scaling_factor 2.5 + 1 shared.
  rope = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16)
  rope.update(beta_fast=32.0, beta_slow=1.0, mscale=mscale, mscale_all_dim=mscale_all_dim)
  return T.DeepseekV2Config(
    vocab_size=VOCAB,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=4,
    rms_norm_eps=1e-5,
    intermediate_size=96,
    num_hidden_layers=3,
    max_position_embeddings=64,  # factor x the original context
    q_lora_rank=q_lora_rank,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=12,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_shared_experts=1,
    moe_intermediate_size=24,
    first_k_dense_replace=1,
    norm_topk_prob=False,
    routed_scaling_factor=2.5,
    topk_method="greedy",
    rope_parameters=rope,
  )


FIXTURES = {  # name: (config, model class, what it exercises)
  "llama": (llama, T.LlamaForCausalLM, "GQA 4/2; Llama 3 RoPE scaling with all three bands active"),
  "qwen3": (qwen3, T.Qwen3ForCausalLM, "GQA; QK-norm; head dim 24 independent of width 64"),
  "gemma3": (
    gemma3_text,
    T.Gemma3ForCausalLM,
    "sliding window 8 < sequence 24; local base 1e4, global base 1e5 with linear scaling 2; "
    "query_pre_attn_scalar 20 != head dim 24; sandwich norms; tied, scaled embedding",
  ),
  "gemma3_multimodal": (
    gemma3_multimodal,
    T.Gemma3ForConditionalGeneration,
    "the gemma3 text tower inside Gemma3ForConditionalGeneration, sharded with an index",
  ),
  "qwen3_moe": (qwen3_moe, T.Qwen3MoeForCausalLM, "dense first layer; top-2 of 8 experts renormalized"),
  "deepseek_v2": (
    lambda: _deepseek(None, 0.707, 0.707),
    T.DeepseekV2ForCausalLM,
    "MLA without q_lora_rank; YaRN (mscale = mscale_all_dim); dense first layer; top-3 of 8 unrenormalized; "
    "routed_scaling_factor 2.5; one shared expert",
  ),
  "deepseek_v2_qlora": (
    lambda: _deepseek(24, 1.0, 0.8),
    T.DeepseekV2ForCausalLM,
    "MLA with q_lora_rank 24; YaRN with mscale != mscale_all_dim; as deepseek_v2 otherwise",
  ),
}


GEMMA_EMBED_STD = 1 / 16  # Gemma's token embedding: x sqrt(64) in the model, RMS 1/2 in the residual stream


def randomize(model: torch.nn.Module, *, offset_norms: bool, seed: int, embed_std: float = 1.0) -> None:
  """Weights at a scale where every feature moves the logits, rounded to bfloat16 (the token
  embedding N(0, embed_std^2))."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      if "norm" in name:
        value = 0.3 * noise + (0.0 if offset_norms else 1.0)
      elif "embed" in name or p.ndim == 1:
        value = noise * (embed_std if name.endswith("embed_tokens.weight") else 1.0)
      else:
        value = noise / math.sqrt(p.shape[-1]) * (4.0 if name.endswith("mlp.gate.weight") else 1.0)
      p.copy_(value.to(torch.bfloat16).float())


def tokenizer_files(out: pathlib.Path) -> None:
  """A byte-level BPE tokenizer of VOCAB ids with <s> / </s>, saved as transformers saves one."""
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
    vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=[], show_progress=False
  )
  tok.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 4] * 8, trainer=trainer)
  fast = T.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
  fast.save_pretrained(out)


def build(name: str, out: pathlib.Path, seed: int) -> None:
  make_config, cls, features = FIXTURES[name]
  config = make_config()
  torch.manual_seed(seed)
  model = cls(config)
  if name == "gemma3_multimodal":  # the same text weights as the gemma3 fixture, so the logits must agree
    text = T.Gemma3ForCausalLM(gemma3_text())
    randomize(text, offset_norms=True, seed=FIXTURE_SEEDS["gemma3"], embed_std=GEMMA_EMBED_STD)
    randomize(model, offset_norms=True, seed=seed)
    model.model.language_model.load_state_dict(text.model.state_dict())
  elif name.startswith("gemma"):
    randomize(model, offset_norms=True, seed=seed, embed_std=GEMMA_EMBED_STD)
  else:
    randomize(model, offset_norms=False, seed=seed)
  folder = out / name
  shutil.rmtree(folder, ignore_errors=True)
  shard = dict(max_shard_size="100KB") if name == "gemma3_multimodal" else {}
  model.to(torch.bfloat16).save_pretrained(folder, **shard)
  if name == "llama":
    tokenizer_files(folder)

  loaded = cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
  tokens = np.random.default_rng(0).integers(0, VOCAB - 3, (BATCH, SEQ))
  with torch.no_grad():
    logits = loaded(torch.as_tensor(tokens)).logits.float().numpy()
    prompt = torch.as_tensor(tokens[:1, :PROMPT])
    greedy = loaded.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS)
  if len(set(greedy[0, PROMPT:].tolist())) < MIN_DISTINCT:
    raise SystemExit(f"{name}: the greedy continuation {greedy[0, PROMPT:].tolist()} repeats a token or two")
  np.savez_compressed(
    folder / "reference.npz",
    tokens=tokens,
    logits=logits,
    prompt=tokens[:1, :PROMPT],
    greedy=greedy[:, PROMPT:].numpy(),
  )
  meta = {
    "architecture": cls.__name__,
    "exercises": features,
    "torch": torch.__version__,
    "transformers": T.__version__,
    "reference": "float32 logits of `tokens` (eager attention) from the saved files; greedy: "
    f"{NEW_TOKENS} tokens continuing `prompt` with do_sample=False",
  }
  (folder / "fixture.json").write_text(json.dumps(meta, indent=2) + "\n")
  size = sum(f.stat().st_size for f in folder.iterdir())
  print(f"{name}: {size / 1024:.0f} KB in {folder}")


FIXTURE_SEEDS = {name: i + 1 for i, name in enumerate(FIXTURES)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("tests/model/fixtures_hf"))
  parser.add_argument("--only", nargs="*", choices=list(FIXTURES), help="build these fixtures (default: all)")
  args = parser.parse_args()
  for name in args.only or FIXTURES:
    build(name, args.out, FIXTURE_SEEDS[name])


if __name__ == "__main__":
  main()
