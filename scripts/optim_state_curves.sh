#!/bin/sh
# Issue 30's training curves: a small LLaMA (4 layers, hidden 128, bytes as
# tokens) trained 300 steps on real English text (the GPL-3, Apache-2.0,
# GFDL-1.3 and Artistic licence texts of /usr/share/common-licenses, 75573
# bytes) with AdamW's m and v in fp32, 8 bits and bf16 (the optimizer in
# host memory), each drawn by `plot` into docs/figures/optim-state-*.svg,
# and the losses compared. Usage: scripts/optim_state_curves.sh [BUILD_DIR]
set -eu
build=${1:-build}
out=$(mktemp -d)
lic=/usr/share/common-licenses
cat "$lic/GPL-3" "$lic/Apache-2.0" "$lic/GFDL-1.3" "$lic/Artistic" > "$out/train.txt"
cat > "$out/config.json" <<'JSON'
{"model_type": "llama", "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4,
 "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
for s in fp32 8bit bf16; do
  "$build/examples/train" --model "$out/config.json" --data "$out/train.txt" --text --steps 300 \
    --micro-batch 8 --seq 128 --lr 1e-3 --warmup 20 --lr-schedule cosine --min-lr 1e-4 --dtype bf16 \
    --beta2 0.999 --threads 1 --seed 1 --optimizer-on cpu --optim-dtype "$s" --log "$out/$s.jsonl" > /dev/null
  "$build/examples/plot" "$out/$s.jsonl" --out "docs/figures/optim-state-$s.svg" \
    --title "small LLaMA, 300 steps of license text, AdamW m and v in $s"
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
L = {s: [json.loads(l)["loss"] for l in open(f"{d}/{s}.jsonl")] for s in ("fp32", "8bit", "bf16")}
ref = sum(L["fp32"][-20:]) / 20
for s, v in L.items():
    t = sum(v[-20:]) / 20
    print(f"{s:5s} final {v[-1]:.4f}  mean of the last 20 {t:.4f}  vs fp32 {100 * (t / ref - 1):+.2f}%")
PY
rm -rf "$out"
