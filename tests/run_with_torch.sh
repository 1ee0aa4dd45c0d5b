#!/bin/sh
# Run a test binary against PyTorch references made now, by Debian's
# python3-torch (or $ZO_TORCH_PYTHON: scripts/gpu-check.sh sets it to the GPU
# machine's python3): run_with_torch.sh TEST GENERATOR OUTDIR.
# Exits 77 (skipped) when that python cannot import torch: asked only after
# the generator failed (importing torch takes a second of CPU, once is enough).
set -e
test_bin=$1 generator=$2 out=$3
py=${ZO_TORCH_PYTHON:-/usr/bin/python3}
rm -rf "$out"
if ! "$py" "$generator" --out "$out"; then
  if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "skipped: $py cannot import torch (apt-get install python3-torch)"
    exit 77
  fi
  echo "$generator failed"
  exit 1
fi
ZO_GPU_FIXTURES=$out exec "$test_bin"
