#!/bin/bash
# One prepared GPU run (H200) of the MoE checks and `s3r bench moe` at the paper's MoE shapes, within
# one 8-minute call:
#   device run, command: bash scripts/device_moe.sh, timeout_s 480
# Uses the device image's python3 (JAX with CUDA, Flax, Optax, Matplotlib); s3r runs from the checkout.
# Five steps, each its own process under its own time limit, into its own folder of $OUT (or
# ./results/moe_gpu elsewhere), plus device_moe.log:
#   pallas_check: the compiled Pallas grouped GEMMs against ragged_dot, bit for bit, at SHAPE_Q
#     (python -m s3r.bench.pallas_check -> pallas_check.json). If it fails (a kernel that does not
#     compile, is not a Triton kernel, or differs), a "PALLAS CHECK FAILED" banner is printed, the
#     GEMM steps run without the pallas formulation, and the script exits 1 after the other steps.
#   gemm_qwen, gemm_deepseek: the grouped GEMM formulations (tiled, ragged_dot, dense capacity,
#     pallas), each step writing bench_moe_gpu.{json,md} (a formulation that fails to compile is
#     logged with "!!!", recorded under "errors" and left out)
#   block_qwen, block_deepseek: the MoE block fwd+bwd per recipe (default impl, the tiled path),
#     each step writing bench_moe_block_gpu.{json,md}
# Each step rewrites its files after every configuration set it finishes, so a step cut short
# keeps what it finished.
# GEMMs before blocks: they carry the GPU target (grouped GEMM >= 4x faster than ragged_dot at 128 experts).
# Time: CHECK_S + 2 GEMM_S + 2 BLOCK_S = 60 + 150 + 230 = 440 s of step limits, plus start-up.
# Env (defaults in brackets; shrink for a CPU dry run, e.g. TOKENS=32 GEMM_TOKENS=32 CHECK_TOKENS=40
#   SHAPE_Q=64x16x4x32 SHAPE_D=64x8x2x48+2 REPEATS=2 NUMBER=1 CHECK_S=600 GEMM_S=600 BLOCK_S=300):
#   TOKENS [4096] block tokens; GEMM_TOKENS [4096] tokens of the GEMM comparison (R = T·top_k rows);
#   CHECK_TOKENS [512] tokens of the Pallas check; SHAPE_Q [qwen3-30b-a3b], SHAPE_D [deepseek-v2-lite];
#   REPEATS [12: the 6-recipe design twice]; NUMBER [3] calls per sample; CHECK_S [60] / GEMM_S [75] /
#   BLOCK_S [115] seconds per step; PY [python3].
set -o pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
DEST=${OUT:-results/moe_gpu}
mkdir -p "$DEST"
LOG="$DEST/device_moe.log"
COMMON=(--repeats "${REPEATS:-12}" --number "${NUMBER:-3}" --warmup 1)
step() {  # step NAME SECONDS ARGS...: one bench run into $DEST/NAME
  local name=$1 secs=$2
  shift 2
  mkdir -p "$DEST/$name"
  timeout "$secs" $PY -m s3r.cli bench moe "$@" "${COMMON[@]}" --out-dir "$DEST/$name" --no-chart 2>&1
  echo "$name exit $?"
}
banner() {  # banner TEXT: a line nobody scrolls past
  printf '\n%s\n!!! %s\n%s\n\n' "$(printf '!%.0s' {1..72})" "$1" "$(printf '!%.0s' {1..72})"
}
{
  date -u
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())" || exit 1
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv 2>&1
  mkdir -p "$DEST/pallas_check"
  timeout "${CHECK_S:-60}" $PY -m s3r.bench.pallas_check --shape "${SHAPE_Q:-qwen3-30b-a3b}" \
    --tokens "${CHECK_TOKENS:-512}" --out-dir "$DEST/pallas_check" 2>&1
  check=$?
  echo "$check" > "$DEST/pallas_check/exit_code"
  FORMS=tiled,ragged,dense,pallas
  if [ "$check" != 0 ]; then
    banner "PALLAS CHECK FAILED (exit $check; 124 = timed out): see pallas_check/pallas_check.json; GEMM steps run without pallas"
    FORMS=tiled,ragged,dense
  fi
  step gemm_qwen "${GEMM_S:-75}" --shapes "${SHAPE_Q:-qwen3-30b-a3b}" --skip-block --gemm-tokens "${GEMM_TOKENS:-4096}" \
    --gemm-forms "$FORMS"
  step gemm_deepseek "${GEMM_S:-75}" --shapes "${SHAPE_D:-deepseek-v2-lite}" --skip-block \
    --gemm-tokens "${GEMM_TOKENS:-4096}" --gemm-forms "$FORMS"
  step block_qwen "${BLOCK_S:-115}" --shapes "${SHAPE_Q:-qwen3-30b-a3b}" --tokens "${TOKENS:-4096}" --gemm-tokens 0
  step block_deepseek "${BLOCK_S:-115}" --shapes "${SHAPE_D:-deepseek-v2-lite}" --tokens "${TOKENS:-4096}" \
    --gemm-tokens 0
  ls -laR "$DEST"
  if [ "$check" != 0 ]; then banner "PALLAS CHECK FAILED (exit $check): the other steps ran; this run exits 1"; fi
} 2>&1 | tee "$LOG"
status=$?
[ "$status" != 0 ] && exit "$status"
[ "$(cat "$DEST/pallas_check/exit_code" 2>/dev/null)" = 0 ] || exit 1
