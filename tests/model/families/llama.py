"""The Llama 3 family's own facts (s3r/model/families/llama.py), read by the tests that run over every
registered family (tests/model/family_facts.py gathers them)."""

PUBLISHED = {"llama3.1-8b": 8_030_261_248}  # total parameters of its published checkpoints (docs/models.md)

HUB_CONFIGS = {  # config.json of its published checkpoints (their older spelling), the fields that matter
  "llama3.1-8b": {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192,
      "rope_type": "llama3",
    },
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
  },
}

REFUSED = [  # Hugging Face config fields it refuses: (fixture, changed field (dotted: nested), value, field named)
  ("llama", "hidden_act", "gelu", "hidden_act='gelu'"),
  ("llama", "attention_bias", True, "attention_bias=True"),
  ("llama", "mlp_bias", True, "mlp_bias=True"),
  ("llama", "rope_parameters.rope_type", "dynamic", "rope_type='dynamic'"),
  ("llama", "rope_parameters.rope_type", "longrope", "rope_type='longrope'"),
  ("llama", "rope_parameters.partial_rotary_factor", 0.5, "partial_rotary_factor=0.5"),
]

INVALID: list = []  # (overrides of its sibling preset, the field the error names)

# Its tokenizer's convention: (BOS token, EOS token, whether the post-processor adds BOS, tokenizer_config
# fields, whether a text starts with BOS); None: another family's tokenizer.
TOKENIZER = ("<|begin_of_text|>", "<|end_of_text|>", True, {}, True)  # Llama 3

CLI_RECIPE = "s3r_ec_dx"  # the recipe of its sibling's default-suite run from the command line
CLI_IN_DEFAULT_SUITE = True  # whether that run is in the default suite (the others: -m slow)
LAYERS_DIFFER = False  # its layers are alike: the per-layer tests run it in the slow suite
