#!/bin/bash
# One prepared GPU run (H200) of the MoE checks and `python -m benchmarks moe` at the paper's MoE shapes, within
# one 8-minute call:
#   device run, command: bash scripts/device_moe.sh, timeout_s 600
# Uses the device image's python3 (JAX with CUDA, Flax, Optax, Matplotlib); s3r runs from the checkout.
# First the smoke stage (under a minute; the script stops if it fails). Then five steps, each its own
# process under its own time limit, into its own folder of $WORK, packed at the end into
# device_moe.tar.gz beside device_moe.log (what comes back; `bash scripts/device_unpack.sh FILES_AT`
# puts it under results/gpu/device_moe/):
#   pallas_check: the compiled Pallas grouped GEMMs against ragged_dot, bit for bit, at SHAPE_Q
#     (python -m benchmarks.pallas_check -> pallas_check.json). If it fails (a kernel that does not
#     compile, is not a Triton kernel, or differs), a "PALLAS CHECK FAILED" banner is printed, the
#     GEMM steps run without the pallas formulation, and the script exits 1 after the other steps.
#     Its exit 3 (only the diagnostic families of the tiled dW differ) keeps pallas and is reported.
#   gemm_qwen, gemm_deepseek: the grouped GEMM formulations (tiled, ragged_dot, dense capacity,
#     pallas), each step writing bench_moe_gpu.{json,md} (a formulation that fails to compile is
#     logged with "!!!", recorded under "errors" and left out)
#   block_qwen, block_deepseek: the MoE block fwd+bwd per recipe (default impl: Pallas on a GPU),
#     each step writing bench_moe_block_gpu.{json,md}
# Each step rewrites its files after every recipe's compilation and every timing round (the
# timings so far under "in_progress"), so a step cut short by its limit keeps what it reached.
# GEMMs before blocks: they carry the GPU target (grouped GEMM >= 4x faster than ragged_dot at 128 experts).
# Time: SMOKE_S + CHECK_S + 2 GEMM_S + 2 BLOCK_S <= 90 + 60 + 150 + 230 = 530 s of step limits.
# Env (defaults in brackets; shrink for a CPU dry run, e.g. TOKENS=32 GEMM_TOKENS=32 CHECK_TOKENS=40
#   SHAPE_Q=64x16x4x32 SHAPE_D=64x8x2x48+2 REPEATS=2 NUMBER=1 CHECK_S=600 GEMM_S=600 BLOCK_S=300):
#   TOKENS [4096] block tokens; GEMM_TOKENS [4096] tokens of the GEMM comparison (R = T·top_k rows);
#   CHECK_TOKENS [512] tokens of the Pallas check; SHAPE_Q [qwen3-30b-a3b], SHAPE_D [deepseek-v2-lite];
#   REPEATS [12: the 6-recipe design twice]; NUMBER [3] calls per sample; CHECK_S [60] / GEMM_S [75] /
#   BLOCK_S [115] seconds per step; RECIPES [bench moe's]; SMOKE_S [120]; PY [python3]; OUT, WORK.
source "$(dirname "$0")/device_common.sh"
DEST=${OUT:-runs/device}
WORK=${WORK:-runs/device_work/moe}  # outside $OUT: only the archive and the log come back
mkdir -p "$DEST" "$WORK"
LOG="$DEST/device_moe.log"
COMMON=(--repeats "${REPEATS:-12}" --number "${NUMBER:-3}" --warmup 1)
step() {  # step NAME SECONDS ARGS...: one bench run into $WORK/NAME
  local name=$1 secs=$2
  shift 2
  mkdir -p "$WORK/$name"
  timeout "$secs" $PY -m benchmarks moe "$@" "${COMMON[@]}" ${RECIPES:+--recipes "$RECIPES"} --out-dir "$WORK/$name" \
    --no-chart 2>&1
  echo "$name exit $?"
}
{
  header || exit 1
  smoke_or_stop "$WORK/smoke" || exit 1
  mkdir -p "$WORK/pallas_check"
  timeout "${CHECK_S:-60}" $PY -m benchmarks.pallas_check --shape "${SHAPE_Q:-qwen3-30b-a3b}" \
    --tokens "${CHECK_TOKENS:-512}" --out-dir "$WORK/pallas_check" 2>&1
  check=$?
  echo "$check" > "$WORK/pallas_check/exit_code"
  FORMS=tiled,ragged,dense,pallas
  if [ "$check" = 3 ]; then
    banner "PALLAS CHECK PASSED, TILED dW DIAGNOSTICS FAILED: see pallas_check/pallas_check.json"
  elif [ "$check" != 0 ]; then
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
  ls -laR "$WORK"
  if [ "$check" != 0 ] && [ "$check" != 3 ]; then banner "PALLAS CHECK FAILED (exit $check): the other steps ran; this run exits 1"; fi
} 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
finish device_moe
[ "$status" != 0 ] && exit "$status"
case "$(cat "$WORK/pallas_check/exit_code" 2>/dev/null)" in 0 | 3) ;; *) exit 1 ;; esac
