"""The settings of the routed mixture-of-experts feed-forward (`s3r.model.moe.MoEFeedForward`), checked here once.

`MoeSettings` is the one object the feed-forward takes: its shape (model width, experts, their width, top-k,
shared experts), its routing (renormalization, scaling, capacity, load-balancing weight), the token exchange
under expert parallelism and the activation. An MoE model config (`MoeFields`) builds it from its own fields
(`MoeFields.moe_settings`) and reports its errors under the config's name (`Qwen3MoeConfig.top_k ...`).
"""

from __future__ import annotations

import dataclasses

EXPERT_DISPATCHES = ("gspmd", "all_to_all")  # MoE token exchange under expert parallelism (see MoEFeedForward)
ACTS = ("silu", "gelu", "relu")  # activations of the gated experts
AUX_LOSS_WEIGHT = 0.001  # default weight of the MoE load-balancing loss (configs and MoeSettings)


class MoeSettingsError(ValueError):
  """A MoeSettings field that is not valid: `field` names it, `problem` says what is wrong."""

  def __init__(self, owner: str, field: str, problem: str):
    super().__init__(f"{owner}.{field} {problem}")
    self.field, self.problem = field, problem


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeSettings:
  """Shape and routing of one routed MoE feed-forward; every field is checked when it is built."""

  d_model: int  # model width D
  d_expert: int  # hidden width F of one routed expert
  n_experts: int  # routed experts E
  top_k: int  # experts per token
  n_shared: int = 0  # shared experts every token uses (one dense gated FFN of width d_shared)
  d_shared: int | None = None  # width of the shared experts' FFN; None: n_shared * d_expert
  renormalize: bool = True  # renormalize the top-k router weights to sum to 1
  routed_scaling_factor: float = 1.0  # the routed experts' weights are multiplied by it (DeepSeek), after renormalize
  capacity_factor: float | None = None  # expert capacity (tokens per expert) / (tokens * top_k / E); None: no drops
  aux_loss_weight: float = AUX_LOSS_WEIGHT  # weight of the load-balancing loss
  expert_dispatch: str = "gspmd"  # expert-parallel token exchange: "gspmd" (XLA's partitioner) or "all_to_all"
  act: str = "silu"  # activation of the gate (one of ACTS)

  def __post_init__(self):
    def fail(field, problem):
      raise MoeSettingsError(type(self).__name__, field, problem)

    for field in ("d_model", "d_expert", "n_experts", "top_k"):
      value = getattr(self, field)
      if not _is_int(value) or not value > 0:
        fail(field, f"must be a positive int, got {value!r}")
    if self.top_k > self.n_experts:
      fail("top_k", f"({self.top_k}) must be <= n_experts ({self.n_experts})")
    if not _is_int(self.n_shared) or self.n_shared < 0:
      fail("n_shared", f"must be an int >= 0, got {self.n_shared!r}")
    if self.d_shared is not None and (not _is_int(self.d_shared) or not self.d_shared > 0):
      fail("d_shared", f"must be a positive int or None, got {self.d_shared!r}")
    factor = self.routed_scaling_factor
    if not isinstance(factor, (int, float)) or not factor > 0:
      fail("routed_scaling_factor", f"must be a positive float, got {factor!r}")
    if self.capacity_factor is not None and not self.capacity_factor > 0:
      fail("capacity_factor", f"must be > 0 or None, got {self.capacity_factor!r}")
    if self.expert_dispatch not in EXPERT_DISPATCHES:
      fail("expert_dispatch", f"must be one of {EXPERT_DISPATCHES}, got {self.expert_dispatch!r}")
    if self.expert_dispatch == "all_to_all" and self.capacity_factor is not None:
      fail("expert_dispatch", f"'all_to_all' is dropless: capacity_factor must be None, got {self.capacity_factor!r}")
    if self.act not in ACTS:
      fail("act", f"must be one of {ACTS}, got {self.act!r}")

  @property
  def shared_width(self) -> int:
    """Width of the shared experts' FFN: 0 without shared experts, else d_shared (default n_shared * d_expert)."""
    return (self.d_shared or self.n_shared * self.d_expert) if self.n_shared else 0


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)
