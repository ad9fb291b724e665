"""The DeepSeek-V2 family's own facts (s3r/model/families/deepseek_v2.py), read by the tests that run over every
registered family (tests/model/family_facts.py gathers them)."""

PUBLISHED = {"deepseek-v2-lite": 15_706_484_224}  # total parameters of its published checkpoints (docs/models.md)

HUB_CONFIGS = {  # config.json of its published checkpoints (their older spelling), the fields that matter
  "deepseek-v2-lite": {
    "architectures": ["DeepseekV2ForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "topk_method": "greedy",
    "n_group": 1,
    "topk_group": 1,
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 102400,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "rope_scaling": {
      "type": "yarn",
      "factor": 40,
      "original_max_position_embeddings": 4096,
      "beta_fast": 32,
      "beta_slow": 1,
      "mscale": 0.707,
      "mscale_all_dim": 0.707,
    },
    "attention_bias": False,
    "tie_word_embeddings": False,
  },
}

REFUSED = [  # Hugging Face config fields it refuses: (fixture, changed field (dotted: nested), value, field named)
  ("deepseek_v2", "topk_method", "group_limited_greedy", "topk_method='group_limited_greedy'"),
  ("deepseek_v2", "norm_topk_prob", True, "norm_topk_prob=True"),
  ("deepseek_v2", "scoring_func", "sigmoid", "scoring_func='sigmoid'"),
  ("deepseek_v2", "moe_layer_freq", 2, "moe_layer_freq=2"),
  ("deepseek_v2", "num_key_value_heads", 2, "num_key_value_heads=2"),
  ("deepseek_v2", "rope_parameters.mscale", None, "mscale=None"),
  ("deepseek_v2", "rope_parameters.attention_factor", 1.2, "attention_factor=1.2"),
  ("deepseek_v2", "rope_parameters.truncate", False, "truncate=False"),
]

INVALID = [
  ({"v_head_dim": 64}, "v_head_dim"),
  ({"dense_layers": 4}, "dense_layers"),
]  # (overrides of its sibling preset, the field the error names)

# Its tokenizer's convention: (BOS token, EOS token, whether the post-processor adds BOS, tokenizer_config
# fields, whether a text starts with BOS); None: another family's tokenizer.
TOKENIZER = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", False, {"add_bos_token": True}, True)

CLI_RECIPE = "s3r_ec_dx_bcast"  # the recipe of its sibling's default-suite run from the command line
CLI_IN_DEFAULT_SUITE = False  # whether that run is in the default suite (the others: -m slow)
# Its layers differ from one another (its two stacked segments: the dense first layer, then
# the MoE layers), so the per-layer tests (scanned against unrolled, a key per projection) run it
# in the default suite.
LAYERS_DIFFER = True
