#!/bin/bash
# Full training steps (the paper's Table IV) of the dense families at their real width on one
# H200 (141 GB), in one device call:
#   device run, command: bash scripts/device_step.sh, timeout_s: 600
# First the smoke stage (under a minute). Then, in one Python process (XLA:GPU's GEMM autotuning
# results are reused across recipes, depths and families with equal GEMM shapes), each family of
# PRESETS (preset:L1,L2) at two depths with every recipe, batch 4 x 4096 tokens (the paper's
# per-chip batch), full remat; `python -m benchmarks step` fits T(L) = T0 + L * t_layer through the two depths
# and extrapolates to the full depth. Work is ordered so that every family that starts also
# finishes: Llama 3.1 and Qwen3 first (same GEMM shapes but the vocabulary), Gemma 3 last; a family
# starts only if the time left exceeds its estimate (the previous family's time scaled by the
# parameter count per layer and the depths; FIRST_S for the first), else it is recorded as skipped.
# Compilation runs COMPILE_THREADS (2) recipes at a time, so that XLA's autotuning of six recipes
# does not exhaust GPU memory at Gemma's size. The attention is cuDNN's flash attention where it
# compiles at the family's shapes (checked in seconds before the family's steps are compiled;
# Gemma 3's head dim 256 may be refused), else XLA's, and the results file says which.
# Then, if at least CUBLAS_MIN_S (150) seconds are left, the families of CUBLAS_PRESETS
# ("llama3.1-8b:2,4"; "" skips it) again with XLA's GEMMs on cuBLAS instead of Triton
# (XLA_FLAGS += --xla_gpu_enable_triton_gemm=false), into cublas/: the GEMM code generation changes
# speed as well as compile time and memory (docs/performance-gpu.md), so both are timed.
# Brings back device_step.tar.gz (smoke/, cublas/ and bench_step_<preset>_gpu.{json,md} per family, written
# after every depth) and device_step.log; `bash scripts/device_unpack.sh FILES_AT` puts them in results/.
# Memory per device: f32 params + 2 Adam moments + f32 grads = 16 B per parameter; Llama 3.1-8B at
# 4 layers about 45 GB, Gemma 3-12B at 12 layers about 110 GB (logits 17 GB each for values and
# gradient): the depths below fit.
# Env: PRESETS ("llama3.1-8b:2,4 qwen3-8b:2,4 gemma3-12b:6,12"), BATCH (4), SEQ (4096), REPEATS (6),
#   WARMUP (2), WIDTH, VOCAB (default: the preset's), RECIPES (all six), COMPILE_THREADS (2),
#   TOTAL_S (560), FIRST_S (150), SMOKE_S (120), CUBLAS_PRESETS, CUBLAS_MIN_S (150), PY (python3), OUT, WORK.
source "$(dirname "$0")/device_common.sh"
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}
export PRESETS=${PRESETS:-"llama3.1-8b:2,4 qwen3-8b:2,4 gemma3-12b:6,12"}
export BATCH=${BATCH:-4} SEQ=${SEQ:-4096} REPEATS=${REPEATS:-6} WARMUP=${WARMUP:-2} WIDTH=${WIDTH:-} VOCAB=${VOCAB:-}
export RECIPES=${RECIPES:-bf16,int8_rtne,int8_sr,s3r,s3r_ec,s3r_ec_dx} COMPILE_THREADS=${COMPILE_THREADS:-2}
export FIRST_S=${FIRST_S:-150}
DEST=${OUT:-runs/device}
WORK=${WORK:-runs/device_work/step}  # outside $OUT: only the archive and the log come back
mkdir -p "$DEST" "$WORK"
{
  header || exit 1
  smoke_or_stop "$WORK/smoke" || exit 1
  budget=$(seconds_left "${TOTAL_S:-560}")
  echo "families budget ${budget}s"
  timeout $(( budget + 20 )) $PY scripts/device_step_families.py --budget "$budget" --out-dir "$WORK" 2>&1
  code=$?
  echo "bench exit $code"
  left=$(seconds_left "${TOTAL_S:-560}")
  cublas_presets=${CUBLAS_PRESETS-llama3.1-8b:2,4}  # set but empty: skipped
  if [ -n "$cublas_presets" ] && [ "$left" -ge "${CUBLAS_MIN_S:-150}" ]; then
    echo "cuBLAS GEMMs: $cublas_presets, budget ${left}s"
    PRESETS="$cublas_presets" XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_triton_gemm=false" \
      timeout $(( left + 20 )) $PY scripts/device_step_families.py --budget "$left" --out-dir "$WORK/cublas" 2>&1
    echo "cublas bench exit $?"
  else
    echo "cuBLAS GEMMs skipped (${left}s left, CUBLAS_PRESETS '$cublas_presets')"
  fi
  exit "$code"
} 2>&1 | tee "$DEST/device_step.log"
status=${PIPESTATUS[0]}
finish device_step
exit "$status"
