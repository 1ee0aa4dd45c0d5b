#!/bin/sh
# Run a test binary against PyTorch references made now, by Debian's
# python3-torch: run_with_torch.sh TEST GENERATOR OUTDIR.
# Exits 77 (skipped) when /usr/bin/python3 cannot import torch.
set -e
test_bin=$1 generator=$2 out=$3
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "skipped: /usr/bin/python3 cannot import torch (apt-get install python3-torch)"
  exit 77
fi
rm -rf "$out"
/usr/bin/python3 "$generator" --out "$out"
ZO_GPU_FIXTURES=$out exec "$test_bin"
