#!/bin/bash
# Turns what a device call brought back into results files: bash scripts/device_unpack.sh FILES_AT
# Each <name>.tar.gz there (device_quality, device_step, device_moe, device_bench) is unpacked into
# results/gpu/<name>/ with its log beside it; nothing else under results/ is touched. Refuses to
# overwrite a folder that exists (move it first), so committed results are never replaced by accident.
set -euo pipefail
src=${1:?usage: bash scripts/device_unpack.sh FILES_AT (the folder a device call brought back)}
found=0
for archive in "$src"/device_*.tar.gz; do
  [ -e "$archive" ] || continue
  name=$(basename "$archive" .tar.gz)
  dest=results/gpu/$name
  if [ -e "$dest" ]; then
    echo "error: $dest exists; move it away first (results are never overwritten)" >&2
    exit 2
  fi
  mkdir -p "$dest"
  tar xzf "$archive" -C "$dest"
  [ -f "$src/$name.log" ] && cp "$src/$name.log" "$dest/"
  echo "$archive -> $dest ($(find "$dest" -type f | wc -l) files)"
  found=1
done
[ "$found" = 1 ] || { echo "error: no device_*.tar.gz in $src" >&2; exit 2; }
