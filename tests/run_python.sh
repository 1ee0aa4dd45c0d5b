#!/bin/sh
# Run a Python script with the python that has PyTorch: $ZO_TORCH_PYTHON
# (scripts/gpu-check.sh sets it to the GPU machine's python3), else Debian's
# /usr/bin/python3 (python3-torch). Exits 77 (skipped) when there is none;
# the script itself exits 77 when that python cannot import torch.
py=${ZO_TORCH_PYTHON:-/usr/bin/python3}
if [ ! -x "$py" ]; then
  echo "skipped: $py not found"
  exit 77
fi
exec "$py" "$@"
