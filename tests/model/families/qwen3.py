"""The Qwen3 dense family's own facts (s3r/model/families/qwen3.py), read by the tests that run over every
registered family (tests/model/family_facts.py gathers them)."""

PUBLISHED = {"qwen3-8b": 8_190_735_360}  # total parameters of its published checkpoints (docs/models.md)

HUB_CONFIGS: dict = {}  # config.json of its published checkpoints (their older spelling), the fields that matter

REFUSED = [  # Hugging Face config fields it refuses: (fixture, changed field (dotted: nested), value, field named)
  ("qwen3", "use_sliding_window", True, "use_sliding_window=True"),
  ("qwen3", "layer_types", ["full_attention", "sliding_attention"], "layer_types="),
]

INVALID = [
  ({"d_head": 0}, "d_head"),
]  # (overrides of its sibling preset, the field the error names)

# Its tokenizer's convention: (BOS token, EOS token, whether the post-processor adds BOS, tokenizer_config
# fields, whether a text starts with BOS); None: another family's tokenizer.
TOKENIZER = (None, "<|endoftext|>", False, {}, False)

CLI_RECIPE = "int8_sr"  # the recipe of its sibling's default-suite run from the command line
CLI_IN_DEFAULT_SUITE = False  # whether that run is in the default suite (the others: -m slow)
LAYERS_DIFFER = False  # its layers are alike: the per-layer tests run it in the slow suite
