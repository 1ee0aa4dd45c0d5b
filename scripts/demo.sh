#!/usr/bin/env bash
# The main job: set up, build, and size LLaMA-2-13B fine-tuning on one
# H100-80GB: it does not fit with everything on the GPU; ZeRO-Offload of the
# optimizer state (and then of the parameters too) makes it fit; then let the
# planner search for the fastest plan and write it for the runtime.
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
echo
echo "== 4. memplan plan: the fastest plan that fits, written for the runtime"
"$m" plan --model llama-2-13b --hw h100-80gb --seq 4096 --global-batch 8 --top 3 \
  --json build/llama-2-13b.plan.json --svg build/llama-2-13b.plan.svg
