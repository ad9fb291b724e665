"""How an s3r parameter is stored in a Hugging Face checkpoint: its `Entry` (the Hub tensor(s) it is
made of) and the `Layout` that turns them into the s3r array (`to_s3r`, casting into the target
dtype in one copy) and back (`to_hub`, for export); and the entries the families share (norms,
linears, gated feed-forwards, attention, routed experts). Each family lists its block's entries in
its module (s3r.model.families); `s3r.model.hf.tensors.tensor_map` puts the whole model together.
Layouts:

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

from s3r.model.config import MoeFields

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
  """One s3r parameter in a checkpoint: its `path` in the params tree, the `hub` tensor names it is made
  of, and the `layout` that converts between them."""

  path: Path
  hub: tuple[str, ...]
  layout: Layout


def norm(path: Path, name: str) -> Entry:
  return Entry((*path, "scale"), (f"{name}.weight",), Copy())


def linear(path: Path, name: str, layout: Layout | None = None) -> Entry:
  return Entry(path, (f"{name}.weight",), layout or Linear())


def gated(path: Path, prefix: str, names=("gate", "up", "down")) -> list[Entry]:
  return [linear((*path, n), f"{prefix}.{n}_proj") for n in names]


def attention(b: Path, p: str, *, qk_norm: bool = False) -> list[Entry]:
  """The q, k, v, o projections of block `b` (Hub prefix `p`), and the per-head query and key norms."""
  out = [linear((*b, n), f"{p}.self_attn.{n}_proj") for n in ("q", "k", "v", "o")]
  if qk_norm:
    out += [norm((*b, "q_norm"), f"{p}.self_attn.q_norm"), norm((*b, "k_norm"), f"{p}.self_attn.k_norm")]
  return out


def pre_norms(b: Path, p: str) -> list[Entry]:
  """The two pre-sublayer norms of the Llama block (attention, feed-forward)."""
  return [norm((*b, "attn_norm"), f"{p}.input_layernorm"), norm((*b, "mlp_norm"), f"{p}.post_attention_layernorm")]


def moe(cfg: MoeFields, b: Path, p: str, fused: bool) -> list[Entry]:
  """The router and experts of an MoE block: one tensor per expert, or `transformers`' fused layout."""
  m, mlp = (*b, "moe"), f"{p}.mlp"
  out = [linear((*m, "router"), f"{mlp}.gate")]
  if fused:
    out += [Entry((*m, n), (f"{mlp}.experts.gate_up_proj",), FusedExperts(n)) for n in ("gate", "up")]
    out.append(Entry((*m, "down"), (f"{mlp}.experts.down_proj",), FusedExperts("down")))
  else:
    for n in ("gate", "up", "down"):
      names = tuple(f"{mlp}.experts.{e}.{n}_proj.weight" for e in range(cfg.n_experts))
      out.append(Entry((*m, n), names, Experts()))
  if cfg.n_shared:
    out += [linear((*m, f"shared_{n}"), f"{mlp}.shared_experts.{n}_proj") for n in ("gate", "up", "down")]
  return out
