"""Which attention kernel a device run uses: cuDNN flash attention where it compiles, else XLA's.

cuDNN's fused attention refuses some shapes (large head dims, some sliding windows) only when a
program that uses it is compiled, which for a whole training step can take a minute. `resolve`
compiles the attention forward and backward alone, at the model's head count, head dim, window,
batch and sequence, which takes seconds, and falls back to XLA's attention with a note that the
results record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from s3r.model.config import AttentionImpl

CHOICES = ("auto", "xla", "cudnn")


def _probe(cfg, batch: int, seq: int) -> None:
  """Compiles grad(sum(attention)) with cuDNN at the model's attention shapes (raises if refused)."""
  import jax
  import jax.numpy as jnp

  q = jax.ShapeDtypeStruct((batch, seq, cfg.n_heads, cfg.head_dim), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((batch, seq, cfg.n_kv_heads, cfg.head_dim), jnp.bfloat16)
  windows: set[tuple[int, int] | None] = {None}
  if getattr(cfg, "sliding_window", None):
    windows.add((cfg.sliding_window - 1, 0))

  for window in windows:

    def loss(q, k, v, window=window):
      y = jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=window, implementation="cudnn")
      return jnp.sum(y.astype(jnp.float32))

    jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).compile()


def resolve(choice: str, cfg, *, batch: int, seq: int) -> tuple[AttentionImpl, str | None]:
  """(attention_impl, note) for `choice`: `auto` is cuDNN on a GPU where it compiles for `cfg` at
  (batch, seq), else XLA; `xla` and `cudnn` are taken as asked. The note says why auto fell back."""
  import jax

  if choice not in CHOICES:
    raise ValueError(f"attention must be one of {', '.join(CHOICES)}, got {choice!r}")
  if choice == "xla":
    return "xla", None
  if choice == "cudnn":
    return "cudnn", None
  if jax.default_backend() != "gpu":
    return "xla", None
  try:
    _probe(cfg, batch, seq)
  except Exception as e:  # cuDNN refuses at compile time with backend-specific errors
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return "xla", f"cuDNN attention refused at head dim {cfg.head_dim}, seq {seq} ({first}); XLA attention used"
  return "cudnn", None
