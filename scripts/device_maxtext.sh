#!/bin/bash
# s3r's MaxText backend against MaxText's own int8 (AQT) and bf16 on one GPU. The device image has JAX
# but not MaxText: the packages MaxText imports travel as wheels (`bash scripts/maxtext_wheels.sh VENV`
# downloads them here into .whl1, .whl2, ...: more than one call carries), one folder per call:
#   device run, command: MODE=install bash scripts/device_maxtext.sh, carry [".whl1"], timeout_s 120
#   (the same with [".whl2"])
#   device run, command: bash scripts/device_maxtext.sh, carry [".whl3", ".cache/maxtext_tokens"], timeout_s 600
# Each call installs the wheels that travelled with it, without network or dependency resolution,
# into $SITE (--target; default .maxtext_site, ignored by git, so it stays on the warm machine between
# calls), which goes on PYTHONPATH after the checkout. MODE=install stops there.
# Then the smoke stage (SMOKE_STAGES, default versions only), then `python -m benchmarks maxtext` on
# MaxText's own config of Llama 3.1-8B (`model_name=llama3.1-8b`) sliced to LAYERS decoder layers at full width, batch BATCH x SEQ
# tokens of the carried token folder, CONFIGS in lockstep (MaxText unquantized, MaxText int8, s3r's bf16
# and s3r_ec_dx through the backend), STEPS steps, the order rotating per step. The benchmark rewrites
# its files after every step, so a run stopped by its time limit keeps the steps it took.
# Memory: 2 layers of Llama 3.1-8B are about 1.5 B parameters with the embedding and the output layer
# (16 B each with f32 Adam: ~24 GB) and f32 logits of 4 x 2048 x 128256 (~4 GB, and their gradient).
# Brings back device_maxtext.tar.gz (smoke/, bench_maxtext_llama3.1-8b_gpu.{json,md}) and device_maxtext.log.
# Env: LAYERS (2), BATCH (4), SEQ (2048), STEPS (12), SKIP (4), CONFIGS (",int8,s3r:bf16,s3r:s3r_ec_dx"),
#   MODEL (llama3.1-8b), ATTENTION (dot_product), TOKENS (.cache/maxtext_tokens), WHEELS (.whl[0-9]*),
#   SITE (.maxtext_site), MODE (run; install), SMOKE_STAGES (versions), TOTAL_S (560), SMOKE_S (120), PY (python3), OUT, WORK; WIDTH and VOCAB
#   shrink the model for a dry run on the CPU (tests/integrations/test_maxtext.py).
source "$(dirname "$0")/device_common.sh"
DEST=${OUT:-runs/device}
WORK=${WORK:-runs/device_work/maxtext}  # outside $OUT: only the archive and the log come back
WHEELS=${WHEELS:-.whl[0-9]*} SITE=${SITE:-$PWD/.maxtext_site} TOKENS=${TOKENS:-.cache/maxtext_tokens}
SHRINK="${WIDTH:+--width $WIDTH} ${VOCAB:+--vocab $VOCAB}"  # dry runs on the CPU only
mkdir -p "$DEST" "$WORK"
{
  header || exit 1
  # shellcheck disable=SC2086  # WHEELS is a glob
  wheels=$(ls $WHEELS/*.whl 2>/dev/null)
  if [ -n "$wheels" ]; then
    # shellcheck disable=SC2086
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" $wheels \
      || { banner "WHEELS DID NOT INSTALL from $WHEELS"; exit 9; }
    echo "installed $(echo "$wheels" | wc -l) wheels into $SITE"
  fi
  export PYTHONPATH="$PYTHONPATH:$SITE"  # after the checkout: s3r comes from the working tree
  if [ "${MODE:-run}" = install ]; then echo "MODE=install: done"; exit 0; fi
  $PY -c "import maxtext, s3r.integrations.maxtext as m; m.register(); print('maxtext', maxtext.__file__)" \
    || { banner "MAXTEXT DOES NOT IMPORT: carry its wheels (scripts/maxtext_wheels.sh)"; exit 1; }
  # versions only by default: the tiny s3r stages (a minute of compiling) test nothing MaxText runs
  SMOKE_STAGES=${SMOKE_STAGES:-versions} smoke_or_stop "$WORK/smoke" || exit 1
  budget=$(seconds_left "${TOTAL_S:-560}")
  echo "maxtext budget ${budget}s"
  timeout "$budget" $PY -m benchmarks maxtext --model "${MODEL:-llama3.1-8b}" --layers "${LAYERS:-2}" $SHRINK \
    --batch "${BATCH:-4}" --seq "${SEQ:-2048}" --steps "${STEPS:-12}" --skip "${SKIP:-4}" --val-batches 1 \
    --configs "${CONFIGS:-,int8,s3r:bf16,s3r:s3r_ec_dx}" --attention "${ATTENTION:-dot_product}" \
    --tokens "$TOKENS" --out-dir "$WORK" 2>&1
  code=$?
  echo "maxtext exit $code"
  exit "$code"
} 2>&1 | tee "$DEST/device_maxtext.log"
status=${PIPESTATUS[0]}
finish device_maxtext
exit "$status"
