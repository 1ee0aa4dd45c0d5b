#!/usr/bin/env bash
# The main job: set up, build, and size LLaMA-2-13B fine-tuning on one
# H100-80GB: it does not fit with everything on the GPU; ZeRO-Offload of the
# optimizer state (and then of the parameters too) makes it fit; then let the
# planner search for the fastest plan and write it for the runtime; train a
# model 3x the device memory from that plan; and fine-tune a small model on
# text through a tokenizer, with a schedule, evaluation and a metrics log
# drawn as SVG.
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
  --json-out build/llama-2-13b.plan.json --svg build/llama-2-13b.plan.svg
# train checks that plan against LLaMA-2-13B as a run would, allocating nothing
./build/examples/train --check-plan --plan build/llama-2-13b.plan.json

echo
echo "== 5. the runtime: a model 3x the device memory (its bf16 weights alone) trains on the CPU backend"
# A LLaMA-shaped model of 24 layers (9.5M parameters, 18.2 MiB of bf16 weights)
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

echo
echo "== 6. fine-tuning through a tokenizer: tokenize text, train a small model, fine-tune it"
# The shipped vocabulary: byte-level BPE as GPT-2's, 1024 ids, trained on this
# repository's docs (tests/fixtures/tokenizer/small-bpe.json; a real model's
# tokenizer.json works the same way).
tok=tests/fixtures/tokenizer/small-bpe.json
cat >"$demo/small.json" <<'JSON'
{"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
 "num_key_value_heads": 2, "intermediate_size": 384, "vocab_size": 1024, "max_position_embeddings": 256}
JSON
# every doc but offload.md (kept for the fine-tuning) and README.md (held out)
./build/examples/tokenize --tokenizer "$tok" --out "$demo/docs.bin" $(ls docs/*.md | grep -v offload.md)
./build/examples/train --model "$demo/small.json" --data "$demo/docs.bin" --steps 60 --micro-batch 8 \
  --seq 128 --lr 2e-3 --save "$demo/base" | grep -E '^(step (1|60) |# saved)'
# fine-tune on docs/offload.md as text (tokenized on the fly): warmup then
# cosine decay, the held-out README.md evaluated every 10 steps, a log and its SVG
./build/examples/train --model "$demo/small.json" --weights "$demo/base" --tokenizer "$tok" \
  --data docs/offload.md --eval-data README.md --eval-every 10 --eval-batches 1 --steps 40 \
  --micro-batch 8 --seq 128 --lr 1e-3 --lr-schedule cosine --warmup 5 --min-lr 1e-4 \
  --log build/finetune.jsonl --plot build/finetune.svg | grep -E '^(eval|# plot|# data|# lr)|^step (1|40) '
echo "last log record: $(tail -n 1 build/finetune.jsonl)"
if command -v rsvg-convert >/dev/null; then
  rsvg-convert build/finetune.svg -o build/finetune.png && echo "picture: build/finetune.svg (and build/finetune.png)"
else
  echo "picture: build/finetune.svg"
fi
