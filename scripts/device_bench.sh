#!/bin/bash
# The one prepared GPU run of issue #4 (item 7), for a session that has the device:
#   device run, command: bash scripts/device_bench.sh, timeout_s 540
# It uses the device image's own python3 (JAX with CUDA, Flax, Optax, SciPy, Matplotlib are
# there; s3r is pure Python and runs from the checkout) and writes bench_{ffn,quantizer}_gpu.*
# to $OUT (or ./results elsewhere). Commit what comes back under results/ and add the GPU
# tables beside the CPU ones in the README.
# Env: SHAPES (default all), TOKENS (default 4096), PY (default python3).
set -o pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
DEST=${OUT:-results}
SHAPES=${SHAPES:-all}
TOKENS=${TOKENS:-4096}
mkdir -p "$DEST"
$PY -c "import jax; print('jax', jax.__version__, jax.devices())" || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv 2>/dev/null
# FFN block: 6 recipes -> 12 repeats = the Williams design twice
timeout 300 $PY -m s3r.cli bench ffn --shapes "$SHAPES" --tokens "$TOKENS" --repeats 12 --out-dir "$DEST" 2>&1 | tail -60
# quantizer alone: 7 configurations -> 28 repeats = the design twice
timeout 180 $PY -m s3r.cli bench quantizer --shapes "$SHAPES" --tokens "$TOKENS" --repeats 28 --out-dir "$DEST" 2>&1 | tail -60
ls -la "$DEST"
