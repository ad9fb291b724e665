"""The shared base of the decoder families' configurations.

`ModelConfig` is the Llama-style decoder (the Llama 3 family's config, and the base of every other
family's config class, which lives in its family's module `s3r.model.families.<name>`); `MoeFields`
adds the routed mixture-of-experts fields the MoE families share; `RopeScaling` is the long-context
RoPE rescaling any family may use. What the decoder around the blocks does differently per family is
a `ClassVar` of the config (`norm_offset`, `embed_scale`). A config's `family` names its record in
the registry (`s3r.model.registry`), through which a config dict finds its class (`from_dict`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar, Literal

from s3r.model import registry
from s3r.model.moe_settings import AUX_LOSS_WEIGHT, MoeSettings, MoeSettingsError
from s3r.quant.formats import formats_with, get_format
from s3r.quant.recipes import RecipeField

TP_PARTIAL_SUMS = ("bf16", "int32")  # how tensor-parallel partial sums are reduced (see ModelConfig)
ROPE_SCALINGS = ("llama3", "linear", "yarn")
ATTENTION_IMPLS = ("xla", "cudnn")  # jax.nn.dot_product_attention implementations (see ModelConfig.attention_impl)
AttentionImpl = Literal["xla", "cudnn"]
ACT_DTYPES = ("bfloat16", "float32")  # activation dtypes (see ModelConfig.act_dtype)


def check_positive(obj, fields, kind=int):
  """Raises ValueError naming `type(obj).field` unless each of `fields` of `obj` is a positive `kind` (int or float)."""
  for field in fields:
    value = getattr(obj, field)
    ok = (isinstance(value, int) and not isinstance(value, bool)) if kind is int else isinstance(value, (int, float))
    if not ok or not value > 0:
      raise ValueError(f"{type(obj).__name__}.{field} must be a positive {kind.__name__}, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
  """Long-context rescaling of the RoPE frequencies (Hugging Face `rope_scaling`)."""

  kind: str  # "llama3" (Llama 3.1 band-wise), "linear" (all frequencies / factor) or "yarn" (DeepSeek-V2)
  factor: float  # context extension factor
  original_max_seq_len: int = 8192  # llama3, yarn: the pre-training context length
  low_freq_factor: float = 1.0  # llama3: wavelengths above original / low_freq_factor are divided by factor
  high_freq_factor: float = 4.0  # llama3: wavelengths below original / high_freq_factor are kept
  beta_fast: float = 32.0  # yarn: rotations at which the ramp from interpolation to extrapolation ends
  beta_slow: float = 1.0  # yarn: rotations at which it starts
  mscale: float = 1.0  # yarn: cos/sin magnitude coefficient
  mscale_all_dim: float = 0.0  # yarn: softmax-scale coefficient (its square multiplies the softmax scale)

  def __post_init__(self):
    if self.kind not in ROPE_SCALINGS:
      raise ValueError(f"RopeScaling.kind must be one of {', '.join(ROPE_SCALINGS)}; got {self.kind!r}")
    check_positive(self, ("factor", "high_freq_factor", "low_freq_factor", "beta_fast", "beta_slow"), float)
    check_positive(self, ("original_max_seq_len",))
    if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor:
      raise ValueError(
        f"RopeScaling.high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor ({self.low_freq_factor})"
      )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Shape and numerics of the Llama-style decoder (Llama 3 family; base of the other families)."""

  family: ClassVar[str] = "llama"
  # what the decoder around the blocks does differently per family (read by s3r.model.transformer)
  norm_offset: ClassVar[bool] = False  # RMSNorm scales by (1 + scale) instead of scale
  embed_scale: ClassVar[bool] = False  # the embedding output is scaled by sqrt(d_model)

  vocab_size: int = 8192  # tokenizer vocabulary (embedding rows, logits)
  d_model: int = 192  # residual stream width D
  n_layers: int = 4  # number of transformer blocks
  n_heads: int = 6  # query heads N
  n_kv_heads: int = 2  # key/value heads K (grouped-query attention); divides n_heads
  d_head: int | None = None  # head dim H; None: d_model // n_heads
  d_ff: int = 512  # gated FFN hidden width F (SwiGLU / GeGLU; the dense layers of MoE families)
  max_seq_len: int = 256  # longest sequence the model accepts
  rope_theta: float = 10_000.0  # RoPE base frequency
  rope_scaling: RopeScaling | None = None  # long-context frequency rescaling; None: plain RoPE
  norm_eps: float = 1e-6  # RMSNorm epsilon
  tie_embeddings: bool = False  # logits use the embedding matrix (no separate output projection)
  init_std: float = 0.02  # std of the normal init of all matrices (output projections: / sqrt(2 * n_layers))
  recipe: RecipeField = RecipeField()  # recipe of the block projections: a Recipe, or a name (NAME or NAME@FORMAT)
  remat: bool = False  # rematerialize each block in the backward pass (saves activation memory)
  scan_layers: bool = True  # run the stacked blocks as a jax.lax.scan (one compiled block); False: a Python loop
  tp_partial_sums: str = (
    "bf16"  # tensor parallelism: "bf16" rounds each shard's GEMM output (the paper), "int32" sums exactly
  )
  attention_impl: AttentionImpl = "xla"  # attention kernel: "xla" (any platform) or "cudnn" (fused, NVIDIA GPUs)
  act_dtype: str = "bfloat16"  # activations (and the bf16 recipe's operands): "bfloat16" or "float32" (evaluation)

  def __post_init__(self):
    name = type(self).__name__
    check_positive(self, ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"))
    if self.d_head is None:
      if self.d_model % self.n_heads:
        raise ValueError(
          f"{name}.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}) when d_head is None"
        )
    else:
      check_positive(self, ("d_head",))
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"{name}.n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
    if self.head_dim % 2:
      raise ValueError(f"{name} head dim (d_head or d_model // n_heads) must be even for RoPE, got {self.head_dim}")
    check_positive(self, ("rope_theta", "norm_eps", "init_std"), float)
    if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
      raise ValueError(f"{name}.rope_scaling must be a RopeScaling or None, got {self.rope_scaling!r}")
    if self.tp_partial_sums not in TP_PARTIAL_SUMS:
      raise ValueError(
        f"{name}.tp_partial_sums must be one of {', '.join(TP_PARTIAL_SUMS)}; got {self.tp_partial_sums!r}"
      )
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(
        f"{name}.attention_impl must be one of {', '.join(ATTENTION_IMPLS)}; got {self.attention_impl!r}"
      )
    if self.act_dtype not in ACT_DTYPES:
      raise ValueError(f"{name}.act_dtype must be one of {', '.join(ACT_DTYPES)}; got {self.act_dtype!r}")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads if self.d_head is None else self.d_head

  def to_dict(self) -> dict:
    """The fields as JSON values (the recipe by its name); `from_dict` reads them back."""
    d = {**dataclasses.asdict(self), "recipe": self.recipe.name}
    return d if self.family == "llama" else {"family": self.family, **d}

  @classmethod
  def from_dict(cls, d: dict) -> ModelConfig:
    d = dict(d)
    family = registry.config_class(d.pop("family", cls.family))
    if d.get("rope_scaling") is not None:
      d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
    return family(**d)

  # Parameter arithmetic (checked against the initialized shapes in tests/model).

  def attention_params(self) -> int:
    h = self.head_dim
    return 2 * self.d_model * self.n_heads * h + 2 * self.d_model * self.n_kv_heads * h

  def norm_params(self) -> int:
    """RMSNorm scales of one block."""
    return 2 * self.d_model

  def ffn_params(self, layer: int) -> tuple[int, int]:
    """(total, active) parameters of layer `layer`'s feed-forward."""
    return 3 * self.d_model * self.d_ff, 3 * self.d_model * self.d_ff


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeFields(ModelConfig):
  """The fields of the routed mixture-of-experts feed-forward (s3r.model.moe.MoEFeedForward), shared by
  the MoE families (each also derives from its dense family's config)."""

  n_experts: int = 8  # routed experts E
  top_k: int = 2  # experts per token
  d_expert: int = 64  # hidden width of one routed expert
  n_shared: int = 0  # shared experts every token uses
  dense_layers: int = 0  # the first dense_layers layers use a dense gated FFN of width d_ff instead
  renormalize: bool = True  # renormalize the top-k router weights to sum to 1
  routed_scaling_factor: float = 1.0  # the routed experts' weights are multiplied by it (DeepSeek), after renormalize
  capacity_factor: float | None = None  # expert capacity (tokens per expert) / (tokens * top_k / E); None: no drops
  aux_loss_weight: float = AUX_LOSS_WEIGHT  # weight of the load-balancing loss
  expert_dispatch: str = "gspmd"  # expert-parallel token exchange: "gspmd" (XLA's partitioner) or "all_to_all"

  @functools.cached_property
  def moe_settings(self) -> MoeSettings:
    """The settings of the routed feed-forward of the MoE layers (checked when the config is built)."""
    return MoeSettings(
      d_model=self.d_model,
      d_expert=self.d_expert,
      n_experts=self.n_experts,
      top_k=self.top_k,
      n_shared=self.n_shared,
      renormalize=self.renormalize,
      routed_scaling_factor=self.routed_scaling_factor,
      capacity_factor=self.capacity_factor,
      aux_loss_weight=self.aux_loss_weight,
      expert_dispatch=self.expert_dispatch,
    )

  def _check_moe(self):
    """The MoE fields' checks: those of MoeSettings (under this config's name), the dense prefix, and the recipe's
    gradient format, which the grouped expert GEMMs must take."""
    name = type(self).__name__
    try:
      _ = self.moe_settings  # built (and checked) once, then cached
    except MoeSettingsError as e:
      raise ValueError(f"{name}.{e.field} {e.problem}") from None
    if not isinstance(self.dense_layers, int) or not 0 <= self.dense_layers <= self.n_layers:
      raise ValueError(
        f"{name}.dense_layers must be an int in [0, n_layers={self.n_layers}], got {self.dense_layers!r}"
      )
    recipe = self.recipe
    if (
      self.dense_layers < self.n_layers
      and recipe.quantized_gradient
      and not get_format(recipe.grad_format).capabilities.grouped
    ):
      raise ValueError(
        f"{name}.recipe {self.recipe.name!r}: the expert GEMMs do not take its gradient codes, so the "
        f"{recipe.grad_format} format (emulated in float32) works only in dense models; use one of "
        f"{', '.join(formats_with('grouped'))}"
      )

  def is_moe(self, layer: int) -> bool:
    return layer >= self.dense_layers

  def ffn_params(self, layer: int) -> tuple[int, int]:
    if not self.is_moe(layer):
      return 3 * self.d_model * self.d_ff, 3 * self.d_model * self.d_ff
    expert = 3 * self.d_model * self.d_expert
    fixed = self.d_model * self.n_experts + self.n_shared * expert  # router + shared experts
    return fixed + self.n_experts * expert, fixed + self.top_k * expert
