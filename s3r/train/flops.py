"""Model FLOPs of a training step, achieved TFLOP/s and model FLOPs utilization (MFU).

The count follows MaxText's convention (its per-device training TFLOPs), in our own arithmetic:

- weights: every matmul with a trained weight costs 2 FLOPs per weight per token in the forward pass and
  twice that in the backward (the input gradient and the weight gradient), so 6 per weight per token. The
  weights are the attention projections (q, k, v, o; MLA's down- and up-projections), the feed-forward
  matrices of each layer (an MoE layer: the router over all experts, the shared experts and the top-k routed
  experts a token is sent to, not the others) and the output logits (d_model x vocab, tied or not); the
  embedding lookup, norms and biases are not matmuls and are not counted.
- attention: the two sequence-by-sequence matmuls of each layer (scores q.k and the weighted sum of values)
  cost 2 * S * heads * (d_qk + d_v) FLOPs per token over all S keys; the causal mask halves it, and the
  backward doubles it again (x 3 in all). A sliding-window layer (Gemma 3's local layers) sees min(window, S)
  keys in place of S, halved as well (as MaxText counts it, though such a window is not a triangle).

MFU is the achieved model FLOP/s per device over the device's dense bf16 peak (`peak_tflops`), whatever the
recipe: int8 matmuls run at up to twice the bf16 rate on H100/H200, so an INT8 recipe could in principle
exceed 100% (MaxText divides by the bf16 peak too). Model FLOPs count neither recomputation (remat) nor
the quantizers' elementwise work.
"""

from __future__ import annotations

import dataclasses

from s3r.model import DeepSeekV2Config, Gemma3Config, ModelConfig

# Dense (no sparsity) bf16 tensor-core peaks per chip, TFLOP/s; vendors' sheets list twice these "with sparsity".
#   H100 SXM5: NVIDIA H100 Tensor Core GPU datasheet (BF16 Tensor Core 1,979 TFLOPS with sparsity).
#   H200 SXM: NVIDIA H200 Tensor Core GPU datasheet (BF16 Tensor Core 1,979 TFLOPS with sparsity).
#   TPU v5p: Google Cloud TPU documentation, "TPU v5p" (459 TFLOPs bf16 per chip).
# The PCIe and NVL variants of H100/H200 have lower peaks and are left out (no MFU rather than a wrong one).
PEAK_BF16_TFLOPS: dict[str, float] = {"H100 SXM": 989.4, "H200": 989.4, "TPU v5p": 459.0}


@dataclasses.dataclass(frozen=True)
class TrainFlops:
  """Model FLOPs of training on one token (forward and backward), split as MaxText splits them."""

  weights: float  # 6 x the matmul weights one token uses
  attention: float  # the causal attention matmuls

  @property
  def per_token(self) -> float:
    return self.weights + self.attention


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> TrainFlops:
  """The training FLOPs per token of model `cfg` on sequences of `seq_len` tokens (module docstring)."""
  weights = cfg.d_model * cfg.vocab_size  # output logits
  attention = 0.0
  for layer in range(cfg.n_layers):
    weights += _attention_weights(cfg) + cfg.ffn_params(layer)[1]  # active: router, shared and top-k experts
    attention += 2 * _keys(cfg, layer, seq_len) * cfg.n_heads * _qk_v_dims(cfg) / 2  # causal: half the pairs
  return TrainFlops(weights=6.0 * weights, attention=3.0 * attention)


def _attention_weights(cfg: ModelConfig) -> int:
  """The matmul weights of one attention sublayer (no norms)."""
  d, n = cfg.d_model, cfg.n_heads
  if isinstance(cfg, DeepSeekV2Config):  # multi-head latent attention: low-rank query and key/value projections
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    q = d * n * qk if cfg.q_lora_rank is None else d * cfg.q_lora_rank + cfg.q_lora_rank * n * qk
    kv = d * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank * n * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    return q + kv + n * cfg.v_head_dim * d
  h = cfg.head_dim
  return d * (n + 2 * cfg.n_kv_heads) * h + n * h * d


def _qk_v_dims(cfg: ModelConfig) -> int:
  """d_qk + d_v of one head: the widths of the score and the value matmuls."""
  if isinstance(cfg, DeepSeekV2Config):
    return cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim
  return 2 * cfg.head_dim


def _keys(cfg: ModelConfig, layer: int, seq_len: int) -> int:
  """The keys a query of `layer` attends to before the causal mask: the sliding window of Gemma 3's local
  layers, else the whole sequence."""
  if isinstance(cfg, Gemma3Config) and not cfg.is_global(layer):
    return min(cfg.sliding_window, seq_len)
  return seq_len


def peak_tflops(device_kind: str) -> float | None:
  """The dense bf16 peak TFLOP/s of a device of JAX's `device_kind` ("NVIDIA H100 80GB HBM3", "TPU v5p"),
  or None where it is not in PEAK_BF16_TFLOPS (CPUs, other accelerators)."""
  kind = device_kind.strip()
  if "H100" in kind or "H200" in kind:
    if "PCIe" in kind or "NVL" in kind:
      return None
    return PEAK_BF16_TFLOPS["H200" if "H200" in kind else "H100 SXM"]
  if kind in ("TPU v5p", "TPU v5"):  # JAX names v5p chips "TPU v5" (v5e: "TPU v5 lite")
    return PEAK_BF16_TFLOPS["TPU v5p"]
  return None


@dataclasses.dataclass(frozen=True)
class Throughput:
  """Achieved TFLOP/s per device and MFU of a run's steps, from its tokens per second."""

  flops: TrainFlops  # per token
  n_devices: int
  device_kind: str
  peak: float | None  # dense bf16 TFLOP/s per device; None: unknown (no MFU)

  @classmethod
  def of(cls, model_cfg: ModelConfig, seq_len: int, devices) -> Throughput:
    """For model `model_cfg` trained on `seq_len`-token sequences over `devices` (all processes' devices)."""
    devices = list(devices)
    kind = devices[0].device_kind
    return cls(train_flops_per_token(model_cfg, seq_len), len(devices), kind, peak_tflops(kind))

  def metrics(self, tokens_per_s: float) -> dict[str, float]:
    """{"tflops_per_s_per_device": ..., "mfu": ...} (mfu only with a known peak) at `tokens_per_s` (all devices)."""
    achieved = self.flops.per_token * tokens_per_s / self.n_devices / 1e12
    return {"tflops_per_s_per_device": achieved} | ({"mfu": achieved / self.peak} if self.peak else {})

  def describe(self) -> str:
    """One line for the log: the FLOPs per token and what MFU is measured against."""
    f = self.flops
    line = (
      f"model FLOPs: {f.per_token / 1e6:,.3f} MFLOP per token trained (weights {f.weights / 1e6:,.3f}, "
      f"causal attention {f.attention / 1e6:,.3f}); "
    )
    if self.peak is None:
      return line + f"no bf16 peak known for {self.device_kind!r}: TFLOP/s per device only, no MFU"
    return line + f"MFU against the dense bf16 peak of {self.device_kind} ({self.peak:g} TFLOP/s per device)"

  @staticmethod
  def postfix(record: dict) -> dict[str, str]:
    """The progress bar's fields of a step's metrics record: TFLOP/s per device and MFU (where known)."""
    out = {"tflops": f"{record['tflops_per_s_per_device']:.3g}"} if "tflops_per_s_per_device" in record else {}
    return out | ({"mfu": f"{record['mfu']:.1%}"} if "mfu" in record else {})
