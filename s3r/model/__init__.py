"""Decoder families (Flax NNX) whose block projections are INT8 quantized matmuls: Llama 3, Qwen3,
Gemma 3, Qwen3-MoE and DeepSeek-V2, one module each in s3r/model/families (see docs/models.md)."""

from s3r.model import stack
from s3r.model.config import ModelConfig, RopeScaling
from s3r.model.families import FAMILIES, Family
from s3r.model.families.deepseek_v2 import DeepSeekV2Config
from s3r.model.families.gemma3 import Gemma3Config
from s3r.model.families.qwen3 import Qwen3Config
from s3r.model.families.qwen3_moe import Qwen3MoeConfig
from s3r.model.generation import Decoder, generate
from s3r.model.hf import HFConfigError, HFError, HFTokenizer, hf_config, load_hf, load_hf_tokenizer, save_hf
from s3r.model.layers import PROJECTIONS, Block, activation_sharding, constrain
from s3r.model.presets import PRESETS, active_param_count, param_count, preset
from s3r.model.transformer import Transformer, apply, apply_with_aux, block_class, graphdef, init_params, logical_axes

__all__ = [
  "Block",
  "Decoder",
  "DeepSeekV2Config",
  "FAMILIES",
  "Family",
  "Gemma3Config",
  "HFConfigError",
  "HFError",
  "HFTokenizer",
  "ModelConfig",
  "PRESETS",
  "PROJECTIONS",
  "Qwen3Config",
  "Qwen3MoeConfig",
  "RopeScaling",
  "Transformer",
  "activation_sharding",
  "block_class",
  "active_param_count",
  "apply",
  "apply_with_aux",
  "constrain",
  "generate",
  "graphdef",
  "hf_config",
  "init_params",
  "load_hf",
  "load_hf_tokenizer",
  "logical_axes",
  "param_count",
  "preset",
  "save_hf",
  "stack",
]
