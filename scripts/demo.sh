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
# train checks that plan against LLaMA-2-13B as a run would, allocating nothing
./build/examples/train --check-plan --plan build/llama-2-13b.plan.json

echo
echo "== 5. the runtime: a model 4x the device memory trains on the CPU backend"
# A LLaMA-shaped model of 24 layers (9.5M parameters, 19 MiB of bf16 weights)
# on a "device" of 6 MiB: memplan sizes it first, then train executes that plan.
demo=$(mktemp -d)
trap 'rm -rf "$demo"' EXIT
cat >"$demo/config.json" <<'JSON'
{"model_type": "llama", "num_hidden_layers": 24, "hidden_size": 192, "num_attention_heads": 6,
 "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 256, "max_position_embeddings": 256}
JSON
for i in $(seq 400); do printf 'the quick brown fox jumps over the lazy dog %d. ' $((i % 10)); done >"$demo/text.txt"
plan=(--model "$demo/config.json" --gpu-mem 6MiB --cpu-mem 1GiB --nvme 1GiB --seq 64 --micro-batch 2
      --grad-accum 2 --params cpu --grads cpu --optimizer cpu=0.5,nvme=0.5 --recompute full
      --checkpoints cpu --prefetch 1 --sub-group 1M --no-dropout --cuda-context 0
      --cublas-workspace 0 --fragmentation 0)
"$m" estimate "${plan[@]}" | sed -n '1,12p'
"$m" estimate "${plan[@]}" --plan-out "$demo/plan.json" >/dev/null
./build/examples/train --model "$demo/config.json" --plan "$demo/plan.json" --data "$demo/text.txt" \
  --text --steps 8 --lr 2e-3 --nvme-dir "$demo" --stats-json "$demo/stats.json"
