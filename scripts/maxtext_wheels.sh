#!/bin/bash
# Downloads, here, the wheels that scripts/device_maxtext.sh installs on the GPU machine, which has JAX
# (CUDA) but not MaxText and reaches no package index. The list is what a tiny run of the MaxText
# benchmark actually imports in a MaxText environment of this checkout (`pip install -c constraints.txt
# -e '.[maxtext]'`), at the versions installed there, minus what the device image provides and must not
# be replaced: JAX and its CUDA plugins, NumPy, SciPy, ml_dtypes, opt_einsum (Flax, Optax and Orbax are
# carried, so the GPU runs the versions CI tests).
#
#   bash scripts/maxtext_wheels.sh VENV      # VENV: a venv with '.[maxtext]' installed
#
# The wheels come to about 130 MiB, more than the 64 MiB one device call carries, so they are split
# into folders .whl1, .whl2, ... of at most PART_MIB (56) each, for one call per folder (scripts/README.md);
# the folders are listed in .git/info/exclude, so git ignores them and `carry` can name them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:?usage: bash scripts/maxtext_wheels.sh VENV}
PART_MIB=${PART_MIB:-56}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "tracing the imports of a tiny MaxText benchmark run (a minute or two)"
JAX_PLATFORMS=cpu PYTHONPATH=$PWD "$VENV/bin/python" - "$TMP" <<'PY' >"$TMP/trace.log" 2>&1 || { tail -20 "$TMP/trace.log"; exit 1; }
import atexit, importlib.metadata as md, pathlib, sys
import numpy as np
tmp = pathlib.Path(sys.argv[1])
(tmp / "tokens").mkdir()
for name, size in (("train", 6000), ("val", 600)):
  np.save(tmp / "tokens" / f"{name}.npy", np.random.default_rng(0).integers(0, 512, size).astype(np.uint16))
def dump():
  dists = md.packages_distributions()
  used = sorted({d for m in list(sys.modules) for d in dists.get(m.split(".")[0], [])})
  (tmp / "dists.txt").write_text("\n".join(f"{d}=={md.version(d)}" for d in used) + "\n")
atexit.register(dump)
from benchmarks import cli
cli.main(["maxtext", "--model", "llama3.1-8b", "--layers", "1", "--width", "64", "--vocab", "512", "--batch", "2",
          "--seq", "32", "--steps", "2", "--skip", "1", "--val-batches", "1", "--tokens", str(tmp / "tokens"),
          "--out-dir", str(tmp / "out")])
PY
SKIP='^(s3r|jax|jaxlib|jax-cuda[0-9]*-(plugin|pjrt)|nvidia-.*|numpy|scipy|ml-dtypes|opt-einsum)$'
mapfile -t reqs < <(while IFS= read -r line; do
  norm=$(echo "${line%%==*}" | tr '[:upper:]_.' '[:lower:]--')
  [[ "$norm" =~ $SKIP ]] || echo "$line"
done <"$TMP/dists.txt")
"$VENV/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$TMP/wheels" "${reqs[@]}" 2>&1 | grep -v '^WARNING' || true
rm -rf .whl[0-9]*
part=1
while read -r size path; do  # largest first, each into the first part with room
  mib=$(( (size + 1048575) / 1048576 ))
  placed=0
  for p in $(seq 1 "$part"); do
    have=$(du -sm ".whl$p" 2>/dev/null | cut -f1 || echo 0)
    if (( ${have:-0} + mib <= PART_MIB )); then mkdir -p ".whl$p"; mv "$path" ".whl$p/"; placed=1; break; fi
  done
  if (( ! placed )); then part=$(( part + 1 )); mkdir -p ".whl$part"; mv "$path" ".whl$part/"; fi
done < <(find "$TMP/wheels" -name '*.whl' -printf '%s %p\n' | sort -rn)
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
for p in $(seq 1 "$part"); do
  grep -qxF "/.whl$p/" "$EXCLUDE" 2>/dev/null || echo "/.whl$p/" >> "$EXCLUDE"
  echo ".whl$p: $(ls .whl$p | wc -l) wheels, $(du -sh .whl$p | cut -f1)"
done
