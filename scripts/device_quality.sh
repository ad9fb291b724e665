#!/bin/bash
# The paper-scale quality run in one device call (docs/quality-at-scale.md):
#   device run, command: bash scripts/device_quality.sh, carry: [".cache/device_tokens"], timeout_s: 600
# paper-12l, seq 2048 x batch 8, int8_sr / s3r / s3r_ec_dx in lockstep from the same parameters,
# batches and quantizer keys, lr 6e-4. First the smoke stage (under a minute); then the lockstep
# runner, which compiles the three train steps in parallel (the evaluation programs in the
# background), measures an iteration, and fits a complete schedule (warm-up 10%,
# cosine to lr/10) to the steps that fit in what is left of TOTAL_S; cuDNN flash attention where it
# compiles. At the end it measures each recipe's relative gradient errors on its final parameters.
# Needs the token folder (.cache/device_tokens, about 50 MiB; build it once with
#   .venv/bin/python -m experiments.lockstep build-tokens --out .cache/device_tokens).
# Brings back device_quality.tar.gz (smoke/, run/ with summary.json, summary.md, curves.jsonl,
# lockstep.log) and device_quality.log; `bash scripts/device_unpack.sh FILES_AT` puts them under
# results/quality_gpu/.
# Env: PRESET (paper-12l), BATCH (8), SEQ (2048), STEPS (2000: the longest schedule), WARMUP (200),
#   LR (6e-4), EVAL_EVERY (250), EVAL_BATCHES (16), DOSE_KEYS (4), TOKENS (.cache/device_tokens),
#   TOTAL_S (560: seconds for the whole script), SMOKE_S (120), PY (python3), OUT, WORK.
# CPU dry run (tests/scripts/test_device_scripts.py): PRESET=tiny BATCH=2 SEQ=32 STEPS=4 ...
source "$(dirname "$0")/device_common.sh"
DEST=${OUT:-runs/device}
WORK=${WORK:-runs/device_work/quality}  # outside $OUT: only the archive and the log come back
TOKENS=${TOKENS:-.cache/device_tokens}
mkdir -p "$DEST" "$WORK"
{
  header || exit 1
  if [ ! -f "$TOKENS/meta.json" ]; then
    banner "no token folder at $TOKENS: build it with python -m experiments.lockstep build-tokens and carry it"
    exit 2
  fi
  smoke_or_stop "$WORK/smoke" || exit 1
  budget=$(seconds_left "${TOTAL_S:-560}")
  echo "lockstep budget ${budget}s"
  timeout $(( budget + 30 )) $PY -m experiments.lockstep run --data "$TOKENS" --out "$WORK/run" \
    --preset "${PRESET:-paper-12l}" --steps "${STEPS:-2000}" --fit-budget --batch "${BATCH:-8}" --seq "${SEQ:-2048}" \
    --lr "${LR:-6e-4}" --warmup "${WARMUP:-200}" --eval-every "${EVAL_EVERY:-250}" \
    --eval-batches "${EVAL_BATCHES:-16}" --dose-keys "${DOSE_KEYS:-4}" --time-budget "$budget" 2>&1
  code=$?
  echo "lockstep exit $code"
  exit "$code"
} 2>&1 | tee "$DEST/device_quality.log"
status=${PIPESTATUS[0]}
finish device_quality
exit "$status"
