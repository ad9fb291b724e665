# Sourced by the device scripts: environment, banners, the smoke stage and packing of results.
#
# What comes back from a device call is at most 8 files under $OUT (16 MiB each, two folders
# deep), so every script works in its own folder $WORK and packs it into one archive,
# $OUT/<name>.tar.gz, next to its log $OUT/<name>.log. `bash scripts/device_unpack.sh DIR` turns
# what came back into the files under results/ (see scripts/README.md).
set -o pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
T0=$SECONDS
# JAX's persistent compilation cache (COMPILE_CACHE=0: off): a second call on a warm machine, or one that
# carries the folder, loads the programs the first compiled instead of compiling them again
if [ "${COMPILE_CACHE:-1}" != 0 ]; then
  export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/.cache/jax_device}
  mkdir -p "$JAX_COMPILATION_CACHE_DIR"
fi

cache_report() {  # the compilation cache's folder and how many programs it holds
  if [ -n "${JAX_COMPILATION_CACHE_DIR:-}" ] && [ "${COMPILE_CACHE:-1}" != 0 ]; then
    echo "compilation cache $JAX_COMPILATION_CACHE_DIR: $(find "$JAX_COMPILATION_CACHE_DIR" -type f | wc -l) files"
  else
    echo "compilation cache off (COMPILE_CACHE=0)"
  fi
}

banner() {  # banner TEXT: a line nobody scrolls past
  printf '\n%s\n!!! %s\n%s\n\n' "$(printf '!%.0s' {1..72})" "$1" "$(printf '!%.0s' {1..72})"
}

seconds_left() {  # seconds_left TOTAL: TOTAL minus the seconds since the script started
  echo $(( $1 - (SECONDS - T0) ))
}

header() {  # the machine and the versions, first in every log
  date -u
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv 2>&1 | head -3
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())" || return 1
  cache_report
}

smoke_or_stop() {  # smoke_or_stop DIR: every code path at the smallest size (<1 min on the GPU), or stop
  timeout "${SMOKE_S:-120}" $PY scripts/device_smoke.py --out "$1" --stages "${SMOKE_STAGES:-versions,lockstep,pallas,step}" 2>&1
  local code=$?
  if [ "$code" != 0 ]; then
    banner "SMOKE STAGE FAILED (exit $code; 124 = timed out): see smoke/smoke.json in the archive; nothing else ran"
    return 1
  fi
}

pack() {  # pack NAME: $WORK -> $DEST/NAME.tar.gz (the log is written to $DEST/NAME.log by the caller)
  tar czf "$DEST/$1.tar.gz" -C "$WORK" . && echo "packed $DEST/$1.tar.gz ($(du -h "$DEST/$1.tar.gz" | cut -f1))"
}

finish() {  # finish NAME: a copy of $DEST/NAME.log into $WORK, then pack (the caller exits with its status)
  cp "$DEST/$1.log" "$WORK/" 2>/dev/null
  pack "$1"
}
