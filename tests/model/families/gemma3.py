"""The Gemma 3 family's own facts (s3r/model/families/gemma3.py), read by the tests that run over every
registered family (tests/model/family_facts.py gathers them)."""

PUBLISHED = {"gemma3-12b": 11_766_034_176}  # total parameters of its published checkpoints (docs/models.md)

HUB_CONFIGS = {  # config.json of its published checkpoints (their older spelling), the fields that matter
  "gemma3-12b": {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "mm_tokens_per_image": 256,
    "text_config": {
      "hidden_size": 3840,
      "intermediate_size": 15360,
      "num_hidden_layers": 48,
      "num_attention_heads": 16,
      "num_key_value_heads": 8,
      "head_dim": 256,
      "vocab_size": 262208,
      "max_position_embeddings": 131072,
      "query_pre_attn_scalar": 256,
      "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
      "rope_theta": 1000000.0,
      "rope_local_base_freq": 10000.0,
      "sliding_window": 1024,
      "sliding_window_pattern": 6,
      "final_logit_softcapping": None,
      "attn_logit_softcapping": None,
      "model_type": "gemma3_text",
    },
    "vision_config": {"model_type": "siglip_vision_model"},
  },
}

REFUSED = [  # Hugging Face config fields it refuses: (fixture, changed field (dotted: nested), value, field named)
  ("gemma3", "final_logit_softcapping", 30.0, "final_logit_softcapping=30.0"),
  ("gemma3", "attn_logit_softcapping", 50.0, "attn_logit_softcapping=50.0"),
  ("gemma3", "layer_types", ["full_attention", "sliding_attention", "sliding_attention"], "layer_types="),
  ("gemma3", "use_bidirectional_attention", True, "use_bidirectional_attention=True"),
  ("gemma3", "rope_parameters.sliding_attention.rope_type", "linear", "sliding_attention"),
  ("gemma3_multimodal", "text_config.final_logit_softcapping", 30.0, "text_config.final_logit_softcapping"),
]

INVALID = [
  ({"sliding_window": 0}, "sliding_window"),
]  # (overrides of its sibling preset, the field the error names)

# Its tokenizer's convention: (BOS token, EOS token, whether the post-processor adds BOS, tokenizer_config
# fields, whether a text starts with BOS); None: another family's tokenizer.
TOKENIZER = ("<bos>", "<eos>", True, {"add_bos_token": True, "add_eos_token": False}, True)

CLI_RECIPE = "s3r_ec"  # the recipe of its sibling's default-suite run from the command line
CLI_IN_DEFAULT_SUITE = False  # whether that run is in the default suite (the others: -m slow)
# Its layers differ from one another (its per-layer choice of local or global attention under
# the scan), so the per-layer tests (scanned against unrolled, a key per projection) run it
# in the default suite.
LAYERS_DIFFER = True
