#!/usr/bin/env bash
# The committed CPU benchmark tables, regenerated in one sitting on one machine, one after another:
# the quantized layer, the quantizer, the FFN block, the training step and the peers.
#
#   bash scripts/cpu_benchmarks.sh            # -> runs/results/ (the committed results stay as they are)
#   bash scripts/cpu_benchmarks.sh results    # rewrites the committed results/bench_*_cpu.*
#
# Needs the repository's .venv; `bench peers` also needs the peers extra (pip install -e '.[peers]').
# Each benchmark records the revision, JAX version, CPU, load and date in its own files. About
# 70 minutes on a quiet 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-runs/results}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT_DIR"
run() {
  echo "== $(date -u +%FT%TZ) python -m benchmarks $* --out-dir $OUT_DIR"
  "$PY" -m benchmarks "$@" --out-dir "$OUT_DIR"
}
run matmul --repeats 14
run quantizer --shapes W1,W2,W3,W4 --repeats 28
run ffn --shapes W1,W2,W3,W4 --repeats 12
run step --repeats 12
if "$PY" -c "import aqt, qwix" 2>/dev/null; then
  run peers --repeats 10
else
  echo "== skipped bench peers: aqtp and qwix are not installed (pip install -e '.[peers]')"
fi
echo "== $(date -u +%FT%TZ) done"
