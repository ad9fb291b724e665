"""The Qwen3-MoE family's own facts (s3r/model/families/qwen3_moe.py), read by the tests that run over every
registered family (tests/model/family_facts.py gathers them)."""

PUBLISHED = {"qwen3-30b-a3b": 30_532_122_624}  # total parameters of its published checkpoints (docs/models.md)

HUB_CONFIGS = {  # config.json of its published checkpoints (their older spelling), the fields that matter
  "qwen3-30b-a3b": {
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "router_aux_loss_coef": 0.001,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "sliding_window": None,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
  },
}

REFUSED = [  # Hugging Face config fields it refuses: (fixture, changed field (dotted: nested), value, field named)
  ("qwen3_moe", "mlp_only_layers", [1], "mlp_only_layers=\\[1\\]"),
  ("qwen3_moe", "decoder_sparse_step", 2, "decoder_sparse_step"),
]

INVALID = [
  ({"top_k": 9}, "top_k"),
]  # (overrides of its sibling preset, the field the error names)

# Its tokenizer's convention: (BOS token, EOS token, whether the post-processor adds BOS, tokenizer_config
# fields, whether a text starts with BOS); None: another family's tokenizer.
TOKENIZER = None  # Qwen3's tokenizer

CLI_RECIPE = "s3r"  # the recipe of its sibling's default-suite run from the command line
CLI_IN_DEFAULT_SUITE = True  # whether that run is in the default suite (the others: -m slow)
LAYERS_DIFFER = False  # its layers are alike: the per-layer tests run it in the slow suite
