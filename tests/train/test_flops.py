"""Model FLOPs per token (MaxText's convention), device peaks and MFU."""

import jax
import pytest

from s3r.model import PRESETS, init_params
from s3r.model.config import MoeFields
from s3r.train import flops
from tests.model import family_facts


def test_tiny_training_flops_per_token_match_a_hand_count():
  # tiny: vocab 512, d_model 64, 2 layers, 4 query heads and 2 kv heads of 16, gated FFN of 192.
  attention_weights = 64 * 64 + 2 * (64 * 32) + 64 * 64  # q, k, v, o
  ffn_weights = 3 * 64 * 192  # gate, up, down
  logits = 64 * 512
  matmul_weights = 2 * (attention_weights + ffn_weights) + logits
  assert matmul_weights == 131_072
  for seq in (32, 128):
    # per layer and token: scores (2 * seq * 4 heads * 16) + weighted values (the same), halved (causal), x3 (bwd)
    attention = 2 * 3 * (2 * 2 * seq * 4 * 16) / 2
    counted = flops.train_flops_per_token(PRESETS["tiny"], seq)
    assert (counted.weights, counted.attention) == (6 * 131_072, attention)
    assert counted.per_token == 6 * 131_072 + 12_288 * seq / 16


def _matmul_weights_per_token(name: str) -> float:
  """The matmul weights one token uses, counted on the initialized parameter tree: every leaf but the
  embedding table and the norms, routed experts at top_k / n_experts; plus the logits when they are tied."""
  cfg = PRESETS[name]
  experts = (cfg.top_k, cfg.n_experts) if isinstance(cfg, MoeFields) else (1, 1)
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  total = 0.0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    keys = jax.tree_util.keystr(path)
    if keys == "['embed']" or "norm" in keys:
      continue
    routed = "['moe']" in keys and "shared" not in keys and "router" not in keys
    total += leaf.size * (experts[0] / experts[1] if routed else 1)
  return total + (cfg.d_model * cfg.vocab_size if cfg.tie_embeddings else 0)


@pytest.mark.parametrize("name", ["cpu-small", *family_facts.TINY])  # every family, its width-64 presets
def test_weight_flops_are_six_per_matmul_weight_a_token_uses(name):
  assert flops.train_flops_per_token(PRESETS[name], 64).weights == 6 * _matmul_weights_per_token(name)


def test_gemma3_local_layers_count_the_window_and_mla_counts_its_own_head_dims():
  gemma = PRESETS["gemma3-tiny"]  # 6 layers, the 6th global; window 16; 4 heads of 32
  per_key = 2 * 4 * (32 + 32) / 2 * 3  # scores and values, causal, fwd + bwd
  assert flops.train_flops_per_token(gemma, 128).attention == per_key * (5 * 16 + 1 * 128)
  assert flops.train_flops_per_token(gemma, 8).attention == per_key * 6 * 8  # shorter than the window
  deepseek = PRESETS["deepseek-tiny"]  # 3 layers; 4 heads; q.k over 16 + 8 dims, values of 16
  assert flops.train_flops_per_token(deepseek, 64).attention == 3 * (2 * 64 * 4 * (24 + 16) / 2 * 3)


@pytest.mark.parametrize(
  "kind, peak",
  [
    ("NVIDIA H100 80GB HBM3", 989.4),
    ("NVIDIA H200", 989.4),
    ("TPU v5", 459.0),
    ("TPU v5p", 459.0),
    ("TPU v5 lite", None),
    ("NVIDIA H100 PCIe", None),
    ("cpu", None),
  ],
)
def test_device_peaks_are_the_dense_bf16_figures_and_unknown_devices_have_none(kind, peak):
  assert flops.peak_tflops(kind) == peak


def test_mfu_is_the_achieved_tflops_per_device_over_the_peak():
  per_token = flops.TrainFlops(weights=4e9, attention=1e9)
  h100 = flops.Throughput(per_token, n_devices=8, device_kind="NVIDIA H100 80GB HBM3", peak=989.4)
  metrics = h100.metrics(tokens_per_s=800_000)  # 5e9 x 8e5 / 8 = 500 TFLOP/s per device
  assert metrics["tflops_per_s_per_device"] == pytest.approx(500.0)
  assert metrics["mfu"] == pytest.approx(500.0 / 989.4)
  assert flops.Throughput.postfix(metrics) == {"tflops": "500", "mfu": "50.5%"}
  cpu = flops.Throughput(per_token, n_devices=1, device_kind="cpu", peak=None)
  assert cpu.metrics(1000.0) == {"tflops_per_s_per_device": pytest.approx(5.0)}  # 5e9 x 1e3 on one device
  assert "no MFU" in cpu.describe() and "989.4 TFLOP/s" in h100.describe()
