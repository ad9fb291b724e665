#!/bin/bash
# Calibration of the performance model, the first thing to run when a GPU is lent (under 5 minutes):
#   device run, command: REVISION=<commit> bash scripts/device_calibrate.sh, timeout_s 420
# (REVISION names the commit of the working tree, which the device's copy cannot tell; about 2 min of
# start-up, then at most TOTAL_S = 290 s here, then packing.) Parts, each its own process under a time
# limit, each writing its files as it goes, so a part cut short or failing keeps what it finished and the
# next part still runs:
# 1. the machine and the versions, and the smoke stage's versions check (SMOKE_STAGES=versions);
# 2. programs, first pass (FIRST_S, 120 s): `python -m benchmarks calibrate run` on FIRST_PROGRAMS with
#    FIRST_RECIPES (the SwiGLU FFN block at W9, T = 16384, `int8_rtne` and `bf16`): compile, optimized HLO,
#    a jax.profiler trace of ITERS calls read back into per-kernel device times mapped to the HLO's
#    instructions, and the time per call (REPEATS samples of NUMBER calls) -> programs/;
# 3. the GEMM sweep (SWEEP_S, 80 s): `python -m benchmarks gemm_sweep` at SWEEP_SHAPES (W9 and W3 first)
#    and SWEEP_DTYPES (bf16, s8, e4m3, e4m3xe5m2), the forward, dX and dW GEMMs of each shape alone,
#    timed interleaved, with the backend and tile XLA chose for each -> gemms/bench_gemm_sweep_gpu.*;
# 4. programs, second pass: every program of PROGRAMS (ffn_W9, ffn_W3, the train step of STEP_PRESET at
#    STEP_LAYERS layers, STEP_BATCH x STEP_SEQ tokens) with every recipe of RECIPES (`bf16_f32bwd`, the bf16
#    block with f32 backward GEMMs, is FFN only), what the first pass measured skipped, until CUBLAS_S
#    seconds are left;
# 5. the s8 sweep again with Triton GEMMs off (`--xla xla_gpu_enable_triton_gemm=false`: cuBLASLt),
#    SWEEP_SHAPES, if at least CUBLAS_MIN_S seconds are left -> gemms/bench_gemm_sweep_cublas_s8_gpu.*;
# 6. `python -m benchmarks calibrate collect` -> calibration.json (the model's file: docs/gpu-gemms.md,
#    scripts/README.md).
# XLA's GEMM autotuning is on (the default flags), so compiles are slow (the first INT8 FFN program of a
# shape took 12-77 s on the H200); the order puts what the model needs most first, and one call need not
# reach every program of the second pass (the train steps come last). A second call on the same warm
# machine goes on where the first stopped: programs already measured are skipped, and the compilation
# cache in .cache/jax_device (JAX keeps XLA's per-fusion autotuning results inside it) is kept.
# Brings back device_calibrate.tar.gz (calibration.json, meta.json, programs/<program>/<recipe>.{json,
# hlo.txt,xplane.pb}, gemms/, smoke/) and device_calibrate.log; the traces are left out of the archive if it
# would pass 15 MiB. Then, here: `bash scripts/device_unpack.sh FILES_AT` (-> results/gpu/device_calibrate/)
# and `python -m benchmarks calibrate install results/gpu/device_calibrate` (-> results/perfmodel/
# calibration_<h100|h200>.json, never over an existing file unless --force).
# Env: TOTAL_S (290), FIRST_S (120), SWEEP_S (80), CUBLAS_S (30), CUBLAS_MIN_S (25), TOKENS (16384),
#   FIRST_PROGRAMS (ffn_W9), FIRST_RECIPES (int8_rtne,bf16), PROGRAMS (ffn_W9,ffn_W3,step),
#   RECIPES (int8_rtne,bf16,s3r_ec_dx,s3r_ec_dx@e5m2+fwd_e4m3,bf16_f32bwd), STEP_PRESET (paper-12l),
#   STEP_LAYERS (2), STEP_BATCH (8), STEP_SEQ (2048), STEP_WIDTH, ITERS (3), REPEATS (5), NUMBER (2),
#   SWEEP_SHAPES (W9,W3,W1,W2,W4,W5,W6,W7,W8), SWEEP_TOKENS (16384), SWEEP_DTYPES (bf16,s8,e4m3,e4m3xe5m2),
#   SWEEP_REPEATS (5), SWEEP_NUMBER (10), SMOKE_STAGES (versions), SMOKE_S (120), REVISION, PY (python3), OUT, WORK.
source "$(dirname "$0")/device_common.sh"
DEST=${OUT:-runs/device}
WORK=${WORK:-runs/device_work/calibrate}  # outside $OUT: only the archive and the log come back
mkdir -p "$DEST" "$WORK"
export REVISION=${REVISION:-} SMOKE_STAGES=${SMOKE_STAGES:-versions}
TOTAL_S=${TOTAL_S:-290}
SWEEP_SHAPES=${SWEEP_SHAPES:-W9,W3,W1,W2,W4,W5,W6,W7,W8}
STEP_ARGS=(--step-preset "${STEP_PRESET:-paper-12l}" --step-layers "${STEP_LAYERS:-2}" --step-batch "${STEP_BATCH:-8}"
  --step-seq "${STEP_SEQ:-2048}" ${STEP_WIDTH:+--step-width "$STEP_WIDTH"})
RUN_ARGS=(--tokens "${TOKENS:-16384}" --iters "${ITERS:-3}" --repeats "${REPEATS:-5}" --number "${NUMBER:-2}" --out-dir "$WORK")
SWEEP_ARGS=(--shapes "$SWEEP_SHAPES" --tokens "${SWEEP_TOKENS:-16384}" --repeats "${SWEEP_REPEATS:-5}"
  --number "${SWEEP_NUMBER:-10}" --out-dir "$WORK/gemms")

limit() {  # limit SECONDS: SECONDS, or what is left of TOTAL_S if less (at least 1)
  local left; left=$(seconds_left "$TOTAL_S")
  local s=$(( $1 < left ? $1 : left ))
  echo $(( s > 0 ? s : 1 ))
}

{
  header || exit 1
  smoke_or_stop "$WORK/smoke" || exit 1
  s=$(limit "${FIRST_S:-120}")
  echo "programs, first pass: ${s}s"
  timeout "$s" $PY -m benchmarks calibrate run --programs "${FIRST_PROGRAMS:-ffn_W9}" \
    --recipes "${FIRST_RECIPES:-int8_rtne,bf16}" "${STEP_ARGS[@]}" "${RUN_ARGS[@]}" --budget $(( s - 20 )) 2>&1
  echo "programs first pass exit $?"
  s=$(limit "${SWEEP_S:-80}")
  echo "GEMM sweep: ${s}s"
  timeout "$s" $PY -m benchmarks gemm_sweep "${SWEEP_ARGS[@]}" --dtypes "${SWEEP_DTYPES:-bf16,s8,e4m3,e4m3xe5m2}" \
    --budget $(( s * 2 / 3 )) 2>&1
  echo "GEMM sweep exit $?"
  s=$(( $(seconds_left "$TOTAL_S") - ${CUBLAS_S:-30} ))
  if [ "$s" -ge 20 ]; then
    echo "programs, second pass: ${s}s"
    timeout "$s" $PY -m benchmarks calibrate run --programs "${PROGRAMS:-ffn_W9,ffn_W3,step}" \
      --recipes "${RECIPES:-int8_rtne,bf16,s3r_ec_dx,s3r_ec_dx@e5m2+fwd_e4m3,bf16_f32bwd}" "${STEP_ARGS[@]}" \
      "${RUN_ARGS[@]}" --budget $(( s - 20 )) 2>&1
    echo "programs second pass exit $?"
  else
    echo "programs, second pass skipped (${s}s left before the cuBLAS sweep)"
  fi
  s=$(seconds_left "$TOTAL_S")
  if [ "$s" -ge "${CUBLAS_MIN_S:-25}" ]; then
    echo "s8 GEMM sweep with Triton GEMMs off: ${s}s"
    timeout "$s" $PY -m benchmarks gemm_sweep "${SWEEP_ARGS[@]}" --dtypes s8 --tag cublas_s8 \
      --xla xla_gpu_enable_triton_gemm=false --budget $(( s * 2 / 3 )) 2>&1
    echo "cublas sweep exit $?"
  else
    echo "s8 GEMM sweep with Triton GEMMs off skipped (${s}s left, CUBLAS_MIN_S ${CUBLAS_MIN_S:-25})"
  fi
  timeout 60 $PY -m benchmarks calibrate collect "$WORK" 2>&1
  echo "collect exit $?"
  find "$WORK" -type f | sort | head -100
} 2>&1 | tee "$DEST/device_calibrate.log"
status=${PIPESTATUS[0]}
finish device_calibrate
if [ -f "$DEST/device_calibrate.tar.gz" ] && [ "$(stat -c %s "$DEST/device_calibrate.tar.gz")" -gt $(( 15 * 2**20 )) ]; then  # what comes back: 16 MiB a file
  echo "archive over 15 MiB: packed again without the traces" | tee -a "$DEST/device_calibrate.log"
  find "$WORK" -name '*.xplane.pb' -delete
  finish device_calibrate
fi
exit "$status"
