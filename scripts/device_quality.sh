#!/bin/bash
# The paper-scale quality run for one device call (docs/quality-at-scale.md):
#   paper-12l, seq 2048 x batch 8, int8_sr / s3r / s3r_ec_dx in lockstep from the same
#   parameters, batches and quantizer keys, lr 6e-4, warm-up 200 then cosine to 2000 steps,
#   validation (16 fixed batches of enwiki shard 9, and the C4 sample) every 250 steps and at the stop.
# Build the token folder here first (once, about 50 MiB):
#   .venv/bin/python -m s3r.experiments.lockstep build-tokens --out .cache/device_tokens
# then call the device with
#   command: bash scripts/device_quality.sh, carry: [".cache/device_tokens"], timeout_s: 480
# The run stops itself before BUDGET seconds (compilation included) and writes to $OUT:
#   curves.jsonl (one line per evaluation), summary.json (paired differences, rewritten after every
#   evaluation), lockstep.log, device_quality.log. Commit them under results/quality_gpu/.
# Env: BUDGET (seconds, default 420), STEPS (2000), LR (6e-4), TOKENS (.cache/device_tokens), PY (python3).
set -o pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
DEST=${OUT:-runs/quality_gpu}
mkdir -p "$DEST"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())" || exit 1
  # The budget is wall time from the Python start; `timeout` is a backstop a little beyond it.
  timeout $(( ${BUDGET:-420} + 45 )) $PY -m s3r.experiments.lockstep run --data "${TOKENS:-.cache/device_tokens}" \
    --out "$DEST" --preset paper-12l --steps "${STEPS:-2000}" --batch 8 --seq 2048 --lr "${LR:-6e-4}" --warmup 200 \
    --eval-every 250 --eval-batches 16 --time-budget "${BUDGET:-420}" 2>&1
  echo "lockstep exit $?"
  ls -la "$DEST"
} 2>&1 | tee "$DEST/device_quality.log"
