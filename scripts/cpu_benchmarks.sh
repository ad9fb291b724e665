#!/usr/bin/env bash
# The committed CPU benchmark tables, regenerated in one sitting on one machine, one after another.
#
#   bash scripts/cpu_benchmarks.sh                    # every stage -> runs/results/ (committed results stay)
#   bash scripts/cpu_benchmarks.sh results            # rewrites the committed results/bench_*_cpu.* and comm.*
#   bash scripts/cpu_benchmarks.sh results models     # one stage only
#
# Stages:
#   kernels  the quantized layer, the quantizer, the FFN block, the training step and the peers
#            (about 70 minutes on a quiet 2-core machine)
#   models   the five families' steps, MoE against dense, the MoE block, the static HLO counts, the
#            per-fusion profile, the collectives of a sharded step and the checkpoint load
#            (about 60 minutes)
#
# Needs the repository's .venv; `bench peers` also needs the peers extra (pip install -e '.[peers]').
# Each benchmark records the revision, JAX version, CPU, load and date in its own files.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-runs/results}
shift || true
STAGES=${*:-kernels models}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT_DIR"
run() {
  echo "== $(date -u +%FT%TZ) python -m benchmarks $* --out-dir $OUT_DIR"
  "$PY" -m benchmarks "$@" --out-dir "$OUT_DIR"
}
kernels() {
  run matmul --repeats 14
  run quantizer --shapes W1,W2,W3,W4 --repeats 28
  run ffn --shapes W1,W2,W3,W4 --repeats 12
  run step --repeats 12
  if "$PY" -c "import aqt, qwix" 2>/dev/null; then
    run peers --repeats 10
  else
    echo "== skipped bench peers: aqtp and qwix are not installed (pip install -e '.[peers]')"
  fi
}
models() {
  run step --preset llama-tiny,qwen3-tiny,gemma3-tiny,qwen3-moe-tiny,deepseek-tiny --batch 32 --seq 128 \
    --remat full --repeats 12 --tag families
  run step --preset cpu-small,moe-cpu-small --repeats 6 --tag moe_vs_dense
  run moe --tokens 256 --gemm-tokens 16 --repeats 15 --warmup 2 --prime 0
  run moe --shapes qwen3-30b-a3b --recipes int8_rtne,int8_sr,s3r,s3r_ec_dx --tokens 256 --gemm-tokens 0 \
    --repeats 40 --warmup 2 --prime 0 --tag targets
  run static
  run profile --shape W3 --recipes int8_rtne,s3r,s3r_ec_dx,int8_sr
  echo "== $(date -u +%FT%TZ) python -m benchmarks comm --out $OUT_DIR/comm"
  "$PY" -m benchmarks comm --out "$OUT_DIR/comm"
  run hf_load --repeats 2
}
for stage in $STAGES; do
  case "$stage" in
    kernels | models) "$stage" ;;
    *) echo "error: unknown stage '$stage' (kernels, models)" >&2; exit 2 ;;
  esac
done
echo "== $(date -u +%FT%TZ) done"
