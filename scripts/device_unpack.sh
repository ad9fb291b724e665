#!/bin/bash
# Turns what a device call brought back into results files: bash scripts/device_unpack.sh FILES_AT [SUFFIX]
# Each <name>.tar.gz there is unpacked with its log beside it: the benchmarks' (device_step, device_moe,
# device_bench) into results/gpu/<name><SUFFIX>/, the paper-scale quality run (device_quality) into
# research/results/<name><SUFFIX>/; nothing else under those folders is touched. Refuses
# to overwrite a folder that exists, so committed results are never replaced by accident: a second
# run of a script goes beside the first with a SUFFIX (for example -2).
set -euo pipefail
src=${1:?usage: bash scripts/device_unpack.sh FILES_AT [SUFFIX] (FILES_AT: the folder a device call brought back)}
suffix=${2:-}
case "$suffix" in */* | .*) echo "error: SUFFIX must be a plain name part such as -2, got '$suffix'" >&2; exit 2 ;; esac
found=0
for archive in "$src"/device_*.tar.gz; do
  [ -e "$archive" ] || continue
  name=$(basename "$archive" .tar.gz)
  case "$name" in
    device_quality) dest=research/results/$name$suffix ;;  # an experiment (research.lockstep), not a benchmark
    *) dest=results/gpu/$name$suffix ;;
  esac
  if [ -e "$dest" ]; then
    echo "error: $dest exists; give a SUFFIX (bash scripts/device_unpack.sh $src -2) to put this run beside it" >&2
    exit 2
  fi
  mkdir -p "$dest"
  tar xzf "$archive" -C "$dest"
  [ -f "$src/$name.log" ] && cp "$src/$name.log" "$dest/"
  echo "$archive -> $dest ($(find "$dest" -type f | wc -l) files)"
  found=1
done
[ "$found" = 1 ] || { echo "error: no device_*.tar.gz in $src" >&2; exit 2; }
