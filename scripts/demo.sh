#!/usr/bin/env bash
# The main job: set up, build, and size LLaMA-2-13B fine-tuning on one
# H100-80GB: it does not fit with everything on the GPU; ZeRO-Offload of the
# optimizer state (and then of the parameters too) makes it fit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
m=./build/planner/memplan
common=(--model llama-2-13b --hw h100-80gb --seq 4096 --micro-batch 1 --dtype bf16 --recompute full)

echo "== 1. everything on the GPU"
"$m" estimate "${common[@]}" || true
echo
echo "== 2. ZeRO-Offload: gradients and AdamW state on the CPU"
"$m" estimate "${common[@]}" --grads cpu --optimizer cpu || true
echo
echo "== 3. ZeRO-Infinity: parameters streamed from the CPU, optimizer split CPU/NVMe"
"$m" estimate "${common[@]}" --params cpu --grads cpu --optimizer cpu=0.5,nvme=0.5 \
  --checkpoints cpu
