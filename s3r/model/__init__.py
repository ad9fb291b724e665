"""Llama-style decoder (Flax NNX) whose block projections are INT8 quantized matmuls."""
from s3r.model.config import PRESETS, ModelConfig, param_count, preset
from s3r.model.transformer import (PROJECTIONS, Transformer, activation_sharding, apply, constrain, graphdef,
                                   init_params, intercept_projections, logical_axes)
