"""Where each s3r parameter lives in a Hugging Face checkpoint, and how its layout differs.

`tensor_map(cfg, names)` lists one `Entry` per leaf of the s3r params tree: the Hub tensor(s) it is
made of and a `Layout` that turns them into the s3r array (`to_s3r`, casting into the target dtype
in one copy) and back (`to_hub`, for export). Layouts:

- `Copy`: embeddings and norm scales, as stored.
- `Linear`: `torch.nn.Linear` weights are [out, in]; s3r's projections are [in, out].
- `RopeLinear`: DeepSeek's RoPE dims are stored interleaved (pairs 2i, 2i+1 rotate together); s3r
  rotates halves (i, i + R/2), so the RoPE rows of each head are permuted before the transpose.
- `Experts`: routed experts stored one tensor per expert (the Hub layout) -> [E, in, out].
- `FusedExperts`: the fused layout of `transformers`' module state ([E, 2F, D] gate|up, [E, D, F]
  down) -> [E, in, out] (import only: export writes the Hub layout).

Dimension letters: D model width, F expert width, E experts, R RoPE dims per head.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from s3r.model.config import DeepSeekV2Config, Gemma3Config, ModelConfig, MoeFields, Qwen3Config

Path = tuple  # a leaf's keys in the params tree, e.g. ("blocks", 0, "q")


def _fresh(x: np.ndarray, dtype) -> np.ndarray:
  """A C-contiguous copy of `x` in `dtype`, cast while copying (never a view of the memory-mapped file,
  which the parameters must not alias)."""
  return np.array(x, dtype=dtype, order="C", copy=True)


class Layout:
  """How one s3r parameter is stored: `hub_shapes(s3r shape)` (of its Hub tensors), `to_s3r(hub arrays,
  dtype)` and `to_hub(s3r array)`."""

  def hub_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    raise NotImplementedError

  def to_s3r(self, arrays: list[np.ndarray], dtype) -> np.ndarray:
    raise NotImplementedError

  def to_hub(self, x: np.ndarray) -> list[np.ndarray]:
    raise NotImplementedError


class Copy(Layout):
  def hub_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [tuple(shape)]

  def to_s3r(self, arrays, dtype):
    return _fresh(arrays[0], dtype)

  def to_hub(self, x):
    return [x]


class Linear(Layout):
  def hub_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [tuple(shape[::-1])]

  def to_s3r(self, arrays, dtype):
    return _fresh(arrays[0].T, dtype)

  def to_hub(self, x):
    return [np.ascontiguousarray(x.T)]


def interleaved_to_halves(r: int) -> np.ndarray:
  """s3r's RoPE dim j is the stored dim perm[j]: evens (first of each pair) first, then odds."""
  return np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2)])


@dataclasses.dataclass(frozen=True)
class RopeLinear(Linear):
  """A Linear whose output rows are `group`-sized heads with the RoPE dims in their last `r` rows."""

  group: int
  r: int

  def _perm(self, rows: int) -> np.ndarray:
    within = np.arange(self.group)
    within[self.group - self.r :] = self.group - self.r + interleaved_to_halves(self.r)
    return (np.arange(rows // self.group)[:, None] * self.group + within[None, :]).reshape(-1)

  def to_s3r(self, arrays, dtype):
    w = arrays[0]
    return _fresh(w[self._perm(w.shape[0])].T, dtype)

  def to_hub(self, x):
    return [np.ascontiguousarray(x.T[np.argsort(self._perm(x.shape[1]))])]


class Experts(Layout):
  """E per-expert [out, in] tensors <-> [E, in, out]."""

  def hub_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [(shape[2], shape[1])] * shape[0]

  def to_s3r(self, arrays, dtype):
    out = np.empty((len(arrays), *arrays[0].shape[::-1]), dtype)
    for e, w in enumerate(arrays):
      out[e] = w.T  # cast while copying: one copy of the stacked tensor
    return out

  def to_hub(self, x):
    return [np.ascontiguousarray(w.T) for w in x]


@dataclasses.dataclass(frozen=True)
class FusedExperts(Layout):
  """`transformers`' fused experts: part "gate" / "up" of gate_up_proj [E, 2F, D], or down_proj [E, D, F]."""

  part: str

  def hub_shapes(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    e, i, o = shape
    return [(e, 2 * o, i)] if self.part in ("gate", "up") else [(e, o, i)]

  def to_s3r(self, arrays, dtype):
    w = arrays[0]
    if self.part != "down":
      half = w.shape[1] // 2
      w = w[:, :half] if self.part == "gate" else w[:, half:]
    return _fresh(w.transpose(0, 2, 1), dtype)

  def to_hub(self, x):
    raise NotImplementedError("the fused expert layout is read, never written (export writes one tensor per expert)")


@dataclasses.dataclass(frozen=True)
class Entry:
  path: Path
  hub: tuple[str, ...]
  layout: Layout


def _norm(path: Path, name: str) -> Entry:
  return Entry((*path, "scale"), (f"{name}.weight",), Copy())


def _linear(path: Path, name: str, layout: Layout | None = None) -> Entry:
  return Entry(path, (f"{name}.weight",), layout or Linear())


def _gated(path: Path, prefix: str, names=("gate", "up", "down")) -> list[Entry]:
  return [_linear((*path, n), f"{prefix}.{n}_proj") for n in names]


def _attention(cfg: ModelConfig, b: Path, p: str) -> list[Entry]:
  out = [_linear((*b, n), f"{p}.self_attn.{n}_proj") for n in ("q", "k", "v", "o")]
  if isinstance(cfg, Qwen3Config | Gemma3Config):
    out += [_norm((*b, "q_norm"), f"{p}.self_attn.q_norm"), _norm((*b, "k_norm"), f"{p}.self_attn.k_norm")]
  return out


def _mla(cfg: DeepSeekV2Config, b: Path, p: str) -> list[Entry]:
  a, r = f"{p}.self_attn", cfg.qk_rope_head_dim
  q = RopeLinear(group=cfg.qk_nope_head_dim + r, r=r)
  if cfg.q_lora_rank is None:
    out = [_linear((*b, "q"), f"{a}.q_proj", q)]
  else:
    out = [
      _linear((*b, "q_a"), f"{a}.q_a_proj"),
      _norm((*b, "q_a_norm"), f"{a}.q_a_layernorm"),
      _linear((*b, "q_b"), f"{a}.q_b_proj", q),
    ]
  return out + [
    _linear((*b, "kv_a"), f"{a}.kv_a_proj_with_mqa", RopeLinear(group=cfg.kv_lora_rank + r, r=r)),
    _norm((*b, "kv_a_norm"), f"{a}.kv_a_layernorm"),
    _linear((*b, "kv_b"), f"{a}.kv_b_proj"),
    _linear((*b, "o"), f"{a}.o_proj"),
  ]


def _moe(cfg: MoeFields, b: Path, p: str, fused: bool) -> list[Entry]:
  m, mlp = (*b, "moe"), f"{p}.mlp"
  out = [_linear((*m, "router"), f"{mlp}.gate")]
  if fused:
    out += [Entry((*m, n), (f"{mlp}.experts.gate_up_proj",), FusedExperts(n)) for n in ("gate", "up")]
    out.append(Entry((*m, "down"), (f"{mlp}.experts.down_proj",), FusedExperts("down")))
  else:
    for n in ("gate", "up", "down"):
      names = tuple(f"{mlp}.experts.{e}.{n}_proj.weight" for e in range(cfg.n_experts))
      out.append(Entry((*m, n), names, Experts()))
  if cfg.n_shared:
    out += [_linear((*m, f"shared_{n}"), f"{mlp}.shared_experts.{n}_proj") for n in ("gate", "up", "down")]
  return out


def _block(cfg: ModelConfig, layer: int, p: str, fused: bool) -> list[Entry]:
  b = ("blocks", layer)
  attn = _mla(cfg, b, p) if isinstance(cfg, DeepSeekV2Config) else _attention(cfg, b, p)
  norms = [_norm((*b, "attn_norm"), f"{p}.input_layernorm")]
  if isinstance(cfg, Gemma3Config):
    norms += [
      _norm((*b, "post_attn_norm"), f"{p}.post_attention_layernorm"),
      _norm((*b, "mlp_norm"), f"{p}.pre_feedforward_layernorm"),
      _norm((*b, "post_mlp_norm"), f"{p}.post_feedforward_layernorm"),
    ]
  else:
    norms.append(_norm((*b, "mlp_norm"), f"{p}.post_attention_layernorm"))
  if isinstance(cfg, MoeFields) and cfg.is_moe(layer):
    ffn = _moe(cfg, b, p, fused)
  else:
    ffn = _gated(b, f"{p}.mlp")
  return attn + norms + ffn


TEXT_PREFIXES = (  # (decoder prefix, logits head) of each spelling of the checkpoint names
  ("model.", "lm_head.weight"),
  ("language_model.model.", "language_model.lm_head.weight"),  # Gemma3ForConditionalGeneration as published
  ("model.language_model.", "lm_head.weight"),  # ... as transformers' module tree names it
)


def text_prefix(names: set[str]) -> tuple[str, str]:
  """(decoder prefix, logits head name) of the checkpoint whose names are `names`."""
  for prefix, head in TEXT_PREFIXES:
    if f"{prefix}embed_tokens.weight" in names:
      return prefix, head
  return TEXT_PREFIXES[0]


def tensor_map(cfg: ModelConfig, names: set[str]) -> list[Entry]:
  """The Entry of every s3r parameter of `cfg`, named as in a checkpoint holding `names` (which
  decides the decoder prefix and whether the experts are fused)."""
  prefix, head = text_prefix(names)
  fused = any(n.endswith("mlp.experts.gate_up_proj") for n in names)
  out = [Entry(("embed",), (f"{prefix}embed_tokens.weight",), Copy()), _norm(("final_norm",), f"{prefix}norm")]
  if not cfg.tie_embeddings:
    out.append(Entry(("out",), (head,), Linear()))
  for layer in range(cfg.n_layers):
    out += _block(cfg, layer, f"{prefix}layers.{layer}", fused)
  return out
