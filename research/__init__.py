"""The S3R paper's experiments, run from a checkout and never installed (`python -m research --help`).

Configs in research/configs/, committed results in research/results/, the reports in research/docs/."""
