#!/bin/bash
# The FFN and quantizer benchmarks on one GPU (an H200), and where the FFN block's temporary
# memory goes, in one device call:
#   device run, command: bash scripts/device_bench.sh, timeout_s 600
# It uses the device image's own python3 (JAX with CUDA, Flax, Optax, SciPy, Matplotlib are
# there; s3r is pure Python and runs from the checkout). First the smoke stage (under a minute;
# the script stops if it fails). It writes bench_{ffn,quantizer}_gpu.* and
# static_memory/bench_static_gpu.* to $WORK and packs them into device_bench.tar.gz beside
# device_bench.log (`bash scripts/device_unpack.sh FILES_AT` puts them in results/); the benches
# draw no PNG (`python -m benchmarks merge FILE.json --out results/bench_ffn_gpu` draws it from the JSON here). The FFN and quantizer benches write their
# JSON and Markdown after every shape, so a run cut short by its timeout keeps the shapes it
# finished (marked "complete": false). Commit what comes back under results/ and add the GPU
# tables beside the CPU ones in the README.
# Memory first (MEM_S, compile only, nothing runs): `python -m benchmarks static --memory-breakdown` lists the
# buffers live at the FFN block's memory peak per recipe (XLA:GPU's buffer assignment; int32 GEMM
# outputs, f32 gradient temporaries, transposed int8 copies) at MEM_SHAPES, T = 16384; GEMM
# autotuning is off for it, as in results/bench_static_gpu.md, so that four recipes at two shapes
# compile in about a minute. It writes its files at the end only.
# Token counts are larger than on the CPU so that one call outlasts its dispatch: FFN T=16384
# (W1: ~0.3 TFLOP per fwd+bwd), quantizer T=65536 (W1: G is 256 MiB).
# Measured on the H200 (results/gpu/README.md): the FFN needs about 540 s for all
# nine shapes, mostly XLA:GPU's int8 GEMM autotuning (12-77 s per shape), so within one call it
# reaches W5-W6; run SHAPES=W7,W8,W9 in a second call and join the files with `python -m benchmarks merge`.
# The quantizer takes about 60 s for all nine shapes.
# Env: SHAPES (default all), FFN_TOKENS (16384), Q_TOKENS (65536), PY (python3), MEM_SHAPES (W1,W3), MEM_TOKENS (16384),
#      MEM_S / FFN_S / Q_S (seconds allowed per part: 80 / 220 / 130), SMOKE_S (120), OUT, WORK.
source "$(dirname "$0")/device_common.sh"
DEST=${OUT:-runs/device}
WORK=${WORK:-runs/device_work/bench}  # outside $OUT: only the archive and the log come back
SHAPES=${SHAPES:-all}
mkdir -p "$DEST" "$WORK"
LOG="$DEST/device_bench.log"
{
  header || exit 1
  smoke_or_stop "$WORK/smoke" || exit 1
  XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_autotune_level=0" timeout "${MEM_S:-80}" $PY -m benchmarks static \
    --recipes bf16,int8_rtne,s3r_ec_dx,int8_sr --memory-shapes "${MEM_SHAPES:-W1,W3}" --memory-tokens "${MEM_TOKENS:-16384}" \
    --memory-breakdown --out-dir "$WORK/static_memory" 2>&1
  echo "static memory exit $?"
  # FFN block: 6 recipes -> 12 repeats = the Williams design twice; 3 calls per sample
  timeout "${FFN_S:-220}" $PY -m benchmarks ffn --shapes "$SHAPES" --tokens "${FFN_TOKENS:-16384}" \
    --repeats 12 --number 3 --no-chart --out-dir "$WORK" 2>&1
  echo "ffn exit $?"
  # quantizer alone: 7 configurations -> 28 repeats = the design twice
  timeout "${Q_S:-130}" $PY -m benchmarks quantizer --shapes "$SHAPES" --tokens "${Q_TOKENS:-65536}" \
    --repeats 28 --number 5 --no-chart --out-dir "$WORK" 2>&1
  echo "quantizer exit $?"
  ls -laR "$WORK"
} 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
finish device_bench
exit "$status"
