"""Independent float64 numpy forward passes of the five decoder families (MoE: the routed feed-forward, dropless),
written from the published architecture descriptions, for comparison with s3r.model."""

from __future__ import annotations

import math

import jax
import numpy as np

LATENT_EPS = 1e-6  # DeepSeek-V2's latent norms (q_a_layernorm, kv_a_layernorm) ignore rms_norm_eps


def _a(x):
  return np.asarray(x, np.float64)


def rms_norm(x, scale, eps, gemma=False):
  y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
  return y * (1.0 + _a(scale)) if gemma else y * _a(scale)


def inverse_frequencies(h, theta, scaling):
  """RoPE inverse frequencies after Llama 3 / linear / YaRN rescaling, one frequency at a time."""
  base = [theta ** (-2.0 * i / h) for i in range(h // 2)]
  if scaling is None:
    return np.array(base), 1.0
  if scaling.kind == "linear":
    return np.array(base) / scaling.factor, 1.0
  if scaling.kind == "llama3":
    out = []
    for f in base:
      wavelength = 2 * math.pi / f
      if wavelength < scaling.original_max_seq_len / scaling.high_freq_factor:
        out.append(f)
      elif wavelength > scaling.original_max_seq_len / scaling.low_freq_factor:
        out.append(f / scaling.factor)
      else:
        t = (scaling.original_max_seq_len / wavelength - scaling.low_freq_factor) / (
          scaling.high_freq_factor - scaling.low_freq_factor
        )
        out.append((1 - t) * f / scaling.factor + t * f)
    return np.array(out), 1.0
  # YaRN (DeepSeek-V2): dims rotating fewer than beta_slow times over the original context are interpolated.
  corr = lambda rot: h * math.log(scaling.original_max_seq_len / (rot * 2 * math.pi)) / (2 * math.log(theta))
  lo, hi = max(math.floor(corr(scaling.beta_fast)), 0), min(math.ceil(corr(scaling.beta_slow)), h - 1)
  hi = hi + 0.001 if hi == lo else hi
  out = []
  for i, f in enumerate(base):
    interp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
    out.append(f / scaling.factor * interp + f * (1 - interp))
  m = lambda c: 1.0 if scaling.factor <= 1 else 0.1 * c * math.log(scaling.factor) + 1.0
  return np.array(out), m(scaling.mscale) / m(scaling.mscale_all_dim)


def apply_rope(x_SxNxH, theta, scaling):
  s, _, h = x_SxNxH.shape
  freq, mag = inverse_frequencies(h, theta, scaling)
  ang = np.arange(s)[:, None] * freq[None, :]
  cos, sin = np.cos(ang)[:, None, :] * mag, np.sin(ang)[:, None, :] * mag
  x1, x2 = x_SxNxH[..., : h // 2], x_SxNxH[..., h // 2 :]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(q_SxNxH, k_SxKxH, v_SxKxU, scale, window=None):
  s, n, _ = q_SxNxH.shape
  group = n // k_SxKxH.shape[1]
  out = np.zeros((s, n, v_SxKxU.shape[-1]))
  for head in range(n):
    scores = q_SxNxH[:, head] @ k_SxKxH[:, head // group].T * scale
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    allowed = (j <= i) & ((i - j < window) if window else True)
    scores = np.where(allowed, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    out[:, head] = (p / p.sum(-1, keepdims=True)) @ v_SxKxU[:, head // group]
  return out


def silu(x):
  return x / (1 + np.exp(-x))


def gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def gated(x, p, act):
  return (act(x @ _a(p["gate"])) * (x @ _a(p["up"]))) @ _a(p["down"])


def moe(x, p, cfg, margins=None):
  """The routed MoE feed-forward (dropless): softmax router, top-k (renormalized if asked, times the
  routed scaling factor), each chosen expert's SwiGLU weighted, plus the shared experts' SwiGLU.
  `margins` (a list) receives each token's gap between its k-th and (k+1)-th router probability
  (0 when every expert is chosen)."""
  logits = x @ _a(p["router"])
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  if margins is not None:
    ranked = -np.sort(-probs, axis=-1)
    margins.append(ranked[:, cfg.top_k - 1] - ranked[:, cfg.top_k] if cfg.top_k < probs.shape[-1] else np.ones(len(x)))
  y = np.zeros_like(x)
  for t in range(x.shape[0]):
    top = np.argsort(-probs[t])[: cfg.top_k]
    w = probs[t, top] / (probs[t, top].sum() if cfg.renormalize else 1.0) * cfg.routed_scaling_factor
    for e, we in zip(top, w):
      expert = {"gate": p["gate"][e], "up": p["up"][e], "down": p["down"][e]}
      y[t] += we * gated(x[t : t + 1], expert, silu)[0]
  if cfg.n_shared:
    y += gated(x, {"gate": p["shared_gate"], "up": p["shared_up"], "down": p["shared_down"]}, silu)
  return y


def _gqa_attention(x, p, cfg, layer):
  s, n, kh, h = x.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  gemma = cfg.family == "gemma3"
  q, k, v = (x @ _a(p["q"])).reshape(s, n, h), (x @ _a(p["k"])).reshape(s, kh, h), (x @ _a(p["v"])).reshape(s, kh, h)
  if cfg.family in ("qwen3", "qwen3_moe", "gemma3"):
    q, k = (
      rms_norm(q, p["q_norm"]["scale"], cfg.norm_eps, gemma),
      rms_norm(k, p["k_norm"]["scale"], cfg.norm_eps, gemma),
    )
  theta, scaling, window, scale = cfg.rope_theta, cfg.rope_scaling, None, h**-0.5
  if gemma:
    scale = cfg.query_pre_attn_scalar**-0.5
    if (layer + 1) % cfg.global_every:
      theta, scaling, window = cfg.local_rope_theta, None, cfg.sliding_window
  q, k = apply_rope(q, theta, scaling), apply_rope(k, theta, scaling)
  return attention(q, k, v, scale, window).reshape(s, n * h) @ _a(p["o"])


def _mla_attention(x, p, cfg):
  s, n, c = x.shape[0], cfg.n_heads, cfg.kv_lora_rank
  nope, r, u = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
  if cfg.q_lora_rank is None:
    q = x @ _a(p["q"])
  else:
    q = rms_norm(x @ _a(p["q_a"]), p["q_a_norm"]["scale"], LATENT_EPS) @ _a(p["q_b"])
  q = q.reshape(s, n, nope + r)
  ckv = x @ _a(p["kv_a"])
  kv = (rms_norm(ckv[:, :c], p["kv_a_norm"]["scale"], LATENT_EPS) @ _a(p["kv_b"])).reshape(s, n, nope + u)
  k_pe = apply_rope(ckv[:, None, c:], cfg.rope_theta, cfg.rope_scaling)
  q = np.concatenate([q[..., :nope], apply_rope(q[..., nope:], cfg.rope_theta, cfg.rope_scaling)], -1)
  k = np.concatenate([kv[..., :nope], np.repeat(k_pe, n, axis=1)], -1)
  sc = cfg.rope_scaling
  m = 0.1 * sc.mscale_all_dim * math.log(sc.factor) + 1.0 if sc is not None and sc.kind == "yarn" else 1.0
  out = attention(q, k, kv[..., nope:], (nope + r) ** -0.5 * m * m)
  return out.reshape(s, n * u) @ _a(p["o"])


def layer_params(params, layer):
  """Layer `layer`'s parameters: row `layer` of the stacked blocks, counting the leading dense layers'
  stack (when there is one) first."""
  dense = len(params["dense_layers"]["attn_norm"]["scale"]) if "dense_layers" in params else 0
  name, row = ("dense_layers", layer) if layer < dense else ("layers", layer - dense)
  return jax.tree.map(lambda a: a[row], params[name])


def forward(cfg, params, tokens_S, margins=None):
  """float64 logits [S, V] of one sequence; `margins` (a list) receives each MoE layer's routing
  margins [S] (see `moe`)."""
  gemma = cfg.family == "gemma3"
  x = _a(params["embed"])[np.asarray(tokens_S)]
  if gemma:
    x = x * math.sqrt(cfg.d_model)
  for layer in range(cfg.n_layers):
    p = layer_params(params, layer)
    norm = lambda y, name: rms_norm(y, p[name]["scale"], cfg.norm_eps, gemma)
    h = norm(x, "attn_norm")
    a = _mla_attention(h, p, cfg) if cfg.family == "deepseek_v2" else _gqa_attention(h, p, cfg, layer)
    x = x + (norm(a, "post_attn_norm") if gemma else a)
    h = norm(x, "mlp_norm")
    if "moe" in p:
      f = moe(h, p["moe"], cfg, margins)
    else:
      f = gated(h, p, gelu_tanh if gemma else silu)
    x = x + (norm(f, "post_mlp_norm") if gemma else f)
  h = rms_norm(x, params["final_norm"]["scale"], cfg.norm_eps, gemma)
  return h @ (_a(params["embed"]).T if cfg.tie_embeddings else _a(params["out"]))
