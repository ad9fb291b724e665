#!/bin/bash
# The paper-scale quality run in one device call (research/docs/quality-at-scale.md):
#   device run, command: bash scripts/device_quality.sh, carry: [".cache/device_tokens", ".cache/device_programs"], timeout_s: 600
# paper-12l, seq 2048 x batch 8, int8_sr / s3r / s3r_ec_dx in lockstep from the same parameters,
# batches and quantizer keys, lr 6e-4. Three stages:
# 1. smoke: only the versions stage by default (SMOKE_STAGES=versions). The tiny lockstep stage
#    passed on the H200 (research/results/device_quality/smoke/smoke.json) but took 71 s of the 560, and
#    the step-bench stage (25 s) tests nothing this script uses; the probe below compiles and runs
#    the real preset's train step (at one layer), and the run writes its summary after every
#    evaluation, so a failure later in the run still leaves what came before.
# 2. compile probe (python -m research.compile_probe, at most PROBE_S = 90 s): one train step of
#    the preset sliced to one layer, s3r_ec_dx, compiled in a subprocess per candidate XLA_FLAGS
#    (on the GPU, cheapest first: --xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0;
#    --xla_gpu_enable_triton_gemm=false; the default; elsewhere only the default), each within
#    PROBE_CANDIDATE_S = 60 s; the fastest-compiling set whose step is within 1.5x of the
#    default's is exported as XLA_FLAGS for the run. The first call compiled the three models in
#    423.5 s with the default flags and trained nothing (research/results/device_quality/). An XLA_FLAGS
#    set by the caller wins: the probe is skipped (PROBE=always runs it with the caller's flags as
#    the base of every candidate; PROBE=never skips it).
# 3. the lockstep runner, with what is left of TOTAL_S: it compiles the three train steps in
#    parallel (the evaluation programs in the background; each recipe's compile seconds go to the
#    summary), measures an iteration, and fits a complete schedule (warm-up 10%, cosine to lr/10)
#    to the steps that fit; cuDNN flash attention where it compiles. At the end it measures each
#    recipe's relative gradient errors on its final parameters. The summary is "complete" only when
#    the fitted schedule ran to its end.
# 0. programs compiled ahead of time (PRECOMPILED, default .cache/device_programs, carried with the
#    tokens): the three train steps compiled for the H100 target on a machine without a GPU by
#    `python -m benchmarks aot --target h100 --program lockstep --layers 12 --recipes int8_sr,s3r,s3r_ec_dx
#    --vocab 32000 --save-executables .cache/device_programs` (research/docs/quality-at-scale.md). When
#    the folder has a manifest the compile probe is skipped and the run loads each program whose
#    lowering matches (the log says which; any other is compiled with XLA_FLAGS
#    --xla_gpu_autotune_level=0, the flags the saved ones were compiled with, unless XLA_FLAGS is
#    set). If that run ends without a summary (the loaded programs failed), the rest of the budget
#    goes to a run that compiles everything as below.
# Needs the token folder (.cache/device_tokens, about 50 MiB; build it once with
#   .venv/bin/python -m research.lockstep build-tokens --out .cache/device_tokens).
# Brings back device_quality.tar.gz (smoke/, probe/ with probe.json and xla_flags.txt, run/ with
# summary.json, summary.md, curves.jsonl, lockstep.log) and device_quality.log;
# `bash scripts/device_unpack.sh FILES_AT` puts them under research/results/device_quality/.
# Env: PRESET (paper-12l), BATCH (8), SEQ (2048), STEPS (2000: the longest schedule), WARMUP (200),
#   LR (6e-4), EVAL_EVERY (250), EVAL_BATCHES (16), DOSE_KEYS (4), TOKENS (.cache/device_tokens),
#   TOTAL_S (560: seconds for the whole script), SMOKE_S (120), SMOKE_STAGES (versions),
#   PROBE (auto: run unless XLA_FLAGS is set; always; never), PROBE_S (90), PROBE_CANDIDATE_S (60),
#   PROBE_LAYERS (1), PROBE_CANDIDATES (comma-separated names; default by backend), XLA_FLAGS,
#   PRECOMPILED (.cache/device_programs; "none": compile everything), PY (python3), OUT, WORK.
# CPU dry run (tests/scripts/test_device_scripts.py): PRESET=tiny BATCH=2 SEQ=32 STEPS=4 ...
source "$(dirname "$0")/device_common.sh"
DEST=${OUT:-runs/device}
WORK=${WORK:-runs/device_work/quality}  # outside $OUT: only the archive and the log come back
TOKENS=${TOKENS:-.cache/device_tokens}
mkdir -p "$DEST" "$WORK"
{
  header || exit 1
  if [ ! -f "$TOKENS/meta.json" ]; then
    banner "no token folder at $TOKENS: build it with python -m research.lockstep build-tokens and carry it"
    exit 2
  fi
  SMOKE_STAGES=${SMOKE_STAGES:-versions} smoke_or_stop "$WORK/smoke" || exit 1
  PRECOMPILED=${PRECOMPILED:-.cache/device_programs}
  precompiled=""
  if [ "$PRECOMPILED" != none ] && [ -f "$PRECOMPILED/manifest.json" ]; then
    precompiled="--precompiled $PRECOMPILED"
    echo "programs compiled ahead of time: $PRECOMPILED (compile probe skipped)"
    # a GPU option (other backends parse and ignore it): no Python start-up just to ask for the backend
    export XLA_FLAGS="${XLA_FLAGS:---xla_gpu_autotune_level=0}"
  elif [ "${PROBE:-auto}" = never ] || { [ "${PROBE:-auto}" = auto ] && [ -n "${XLA_FLAGS:-}" ]; }; then
    echo "compile probe skipped (PROBE=${PROBE:-auto}, XLA_FLAGS ${XLA_FLAGS:-unset})"
  else
    timeout $(( ${PROBE_S:-90} + 30 )) $PY -m research.compile_probe --data "$TOKENS" --out "$WORK/probe" \
      --preset "${PRESET:-paper-12l}" --layers "${PROBE_LAYERS:-1}" --batch "${BATCH:-8}" --seq "${SEQ:-2048}" --budget "${PROBE_S:-90}" \
      --schedule-steps "${STEPS:-2000}" --timeout "${PROBE_CANDIDATE_S:-60}" --candidates "${PROBE_CANDIDATES:-}" 2>&1
    echo "compile probe exit $?"
    chosen=$(cat "$WORK/probe/xla_flags.txt" 2>/dev/null)
    if [ -n "$chosen" ]; then export XLA_FLAGS="$chosen"; fi
  fi
  echo "lockstep XLA_FLAGS: ${XLA_FLAGS:-(none)}"
  budget=$(seconds_left "${TOTAL_S:-560}")
  echo "lockstep budget ${budget}s"
  lockstep_run() {  # $1: the time budget, then extra flags
    local seconds=$1
    shift
    timeout $(( seconds + 30 )) $PY -m research.lockstep run --data "$TOKENS" --out "$WORK/run" \
      --preset "${PRESET:-paper-12l}" --steps "${STEPS:-2000}" --fit-budget --batch "${BATCH:-8}" --seq "${SEQ:-2048}" \
      --lr "${LR:-6e-4}" --warmup "${WARMUP:-200}" --eval-every "${EVAL_EVERY:-250}" \
      --eval-batches "${EVAL_BATCHES:-16}" --dose-keys "${DOSE_KEYS:-4}" --time-budget "$seconds" "$@" 2>&1
  }
  # shellcheck disable=SC2086  # $precompiled is a flag and its value, or nothing
  lockstep_run "$budget" $precompiled
  code=$?
  echo "lockstep exit $code"
  if [ -n "$precompiled" ] && [ ! -f "$WORK/run/summary.json" ]; then
    budget=$(seconds_left "${TOTAL_S:-560}")
    echo "no summary from the run with the programs compiled ahead: compiling them here, budget ${budget}s"
    lockstep_run "$budget"
    code=$?
    echo "lockstep exit $code"
  fi
  exit "$code"
} 2>&1 | tee "$DEST/device_quality.log"
status=${PIPESTATUS[0]}
finish device_quality
exit "$status"
