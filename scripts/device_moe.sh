#!/bin/bash
# One prepared GPU run (H200) of `s3r bench moe` at the paper's MoE shapes, within one 8-minute call:
#   device run, command: bash scripts/device_moe.sh, timeout_s 480
# Uses the device image's python3 (JAX with CUDA, Flax, Optax, Matplotlib); s3r runs from the checkout.
# Four steps, each its own process under its own time limit, each writing bench_moe_gpu.{json,md}
# (GEMM steps) or bench_moe_block_gpu.{json,md} (block steps)
# after every configuration set it finishes (so a step cut short keeps what it finished), into
# its own folder of $OUT (or ./results/moe_gpu elsewhere), plus device_moe.log:
#   gemm_qwen, gemm_deepseek: the grouped GEMM formulations (tiled, ragged_dot, dense capacity)
#   block_qwen, block_deepseek: the MoE block fwd+bwd per recipe
# GEMMs first: they carry the GPU target (tiled >= 4x faster than ragged_dot at 128 experts).
# Env (defaults in brackets; shrink for a CPU dry run, e.g. TOKENS=32 GEMM_TOKENS=32
#   SHAPE_Q=64x16x4x32 SHAPE_D=64x8x2x48+2 REPEATS=2 NUMBER=1 STEP_S=120):
#   TOKENS [4096] block tokens; GEMM_TOKENS [4096] tokens of the GEMM comparison (R = T·top_k rows);
#   SHAPE_Q [qwen3-30b-a3b], SHAPE_D [deepseek-v2-lite]; REPEATS [12: the 6-recipe design twice];
#   NUMBER [3] calls per sample; GEMM_S [70] / BLOCK_S [130] seconds per step; PY [python3].
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
{
  date -u
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())" || exit 1
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv 2>&1
  step gemm_qwen "${GEMM_S:-70}" --shapes "${SHAPE_Q:-qwen3-30b-a3b}" --skip-block --gemm-tokens "${GEMM_TOKENS:-4096}"
  step gemm_deepseek "${GEMM_S:-70}" --shapes "${SHAPE_D:-deepseek-v2-lite}" --skip-block \
    --gemm-tokens "${GEMM_TOKENS:-4096}"
  step block_qwen "${BLOCK_S:-130}" --shapes "${SHAPE_Q:-qwen3-30b-a3b}" --tokens "${TOKENS:-4096}" --gemm-tokens 0
  step block_deepseek "${BLOCK_S:-130}" --shapes "${SHAPE_D:-deepseek-v2-lite}" --tokens "${TOKENS:-4096}" \
    --gemm-tokens 0
  ls -laR "$DEST"
} 2>&1 | tee "$LOG"
