#!/bin/bash
# Full training steps (the paper's Table IV) of the dense families at their real width on one
# H200 (141 GB), in one device call:
#   device run, command: bash scripts/device_step.sh, timeout_s 480
# It uses the device image's own python3 (JAX with CUDA, Flax, Optax; s3r runs from the checkout)
# and writes bench_step_<preset>_gpu.{json,md} per family and device_step.log to $OUT (or
# ./results elsewhere): 3 x 2 files + the log, within the 8 files a call brings back. Each
# family is measured at two depths (PRESETS below, preset:L1,L2) with every recipe, batch 4 x
# 4096 tokens (the paper's per-chip batch), full remat, cuDNN flash attention; `s3r bench step`
# fits T(L) = T0 + L * t_layer through the two depths and extrapolates to the full depth
# (Gemma 3's depths are multiples of its 6-layer local/global pattern). The bench writes its
# files after every depth, so a run stopped by BUDGET_S keeps what finished ("complete": false).
# All families run in one Python process, so XLA:GPU's GEMM autotuning results are reused across
# recipes, depths and families with equal GEMM shapes.
# Memory per device (f32 params + 2 Adam moments + f32 grads = 16 B per parameter): Llama 3.1-8B
# embedding + logits 1.05 B params (17 GB) + 0.22 B per layer (3.5 GB), logits at 4 x 4096 x 128256
# f32 8.4 GB each for values and gradient; Gemma 3-12B 1.0 B tied (16 GB) + 0.22 B per layer,
# logits 17 GB each. At 4 / 12 layers that is about 45 / 110 GB: the depths below fit with room.
# Time estimate: a bf16 Llama layer is ~33 TFLOP per step (fwd, remat recompute, bwd) ~ 55 ms at
# ~600 TFLOP/s, the logits ~85 ms; a step of 4 layers ~0.35 s, of Gemma 3 at 12 layers ~0.9 s; each
# recipe runs 1 + WARMUP + REPEATS steps. Compilation (mostly int8 GEMM autotuning, 12-77 s per new
# shape in the FFN bench) dominates: recipes compile in parallel threads.
# CPU dry run at a tiny size (a few minutes on two cores):
#   PRESETS="llama3.1-8b:1,2 gemma3-12b:1,2" RECIPES=bf16,s3r_ec_dx WIDTH=64 VOCAB=512 BATCH=2 SEQ=32 \
#     REPEATS=1 WARMUP=0 OUT=/tmp/device_step PY=.venv/bin/python bash scripts/device_step.sh
# Env: PRESETS, BATCH (4), SEQ (4096), REPEATS (6), WARMUP (2), WIDTH, VOCAB (default: the
#      preset's), RECIPES (all six), BUDGET_S (seconds for all families: 450), PY (python3).
set -o pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}
export PRESETS=${PRESETS:-"llama3.1-8b:2,4 qwen3-8b:2,4 gemma3-12b:6,12"}
export BATCH=${BATCH:-4} SEQ=${SEQ:-4096} REPEATS=${REPEATS:-6} WARMUP=${WARMUP:-2} WIDTH=${WIDTH:-} VOCAB=${VOCAB:-}
export RECIPES=${RECIPES:-bf16,int8_rtne,int8_sr,s3r,s3r_ec,s3r_ec_dx}
PY=${PY:-python3}
DEST=${OUT:-results}
mkdir -p "$DEST"
LOG="$DEST/device_step.log"
{
  date -u
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())" || exit 1
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv 2>&1
  timeout "${BUDGET_S:-450}" $PY - "$DEST" <<'PYEOF'
import os
import sys

from s3r.bench import cli

env, dest = os.environ, sys.argv[1]
for item in env["PRESETS"].split():
  preset, _, depths = item.partition(":")
  argv = ["step", "--preset", preset, "--layers", depths, "--batch", env["BATCH"], "--seq", env["SEQ"],
          "--repeats", env["REPEATS"], "--warmup", env["WARMUP"], "--prime", "0", "--remat", "full",
          "--attention", "auto", "--recipes", env["RECIPES"], "--tag", preset, "--no-chart", "--out-dir", dest]
  argv += ["--width", env["WIDTH"]] if env["WIDTH"] else []
  argv += ["--vocab", env["VOCAB"]] if env["VOCAB"] else []
  sys.argv = ["s3r", "bench", *argv]  # what the results files record as their command
  print(" ".join(sys.argv), flush=True)
  cli.main(argv)
PYEOF
  echo "bench exit $?"
  ls -la "$DEST"
} 2>&1 | tee "$LOG"
