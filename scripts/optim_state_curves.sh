#!/bin/sh
# Issue 30's training curves: a small LLaMA (4 layers, hidden 128, bytes as
# tokens) trained 300 steps on real English text (the GPL-3, Apache-2.0,
# GFDL-1.3 and Artistic licence texts of /usr/share/common-licenses, 75573
# bytes) with AdamW's m and v in fp32, 8 bits and bf16 (the optimizer in
# host memory), each drawn by `plot` into docs/figures/optim-state-*.svg
# (the first seed's runs), and the losses compared: per seed, and with
# several seeds the mean and spread of each encoding's difference from
# fp32's run of the same seed (--seed: the weights' random init).
# Usage: scripts/optim_state_curves.sh [BUILD_DIR [SEED...]]   (seed 1 by default)
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
seeds=${*:-1}
out=$(mktemp -d)
lic=/usr/share/common-licenses
cat "$lic/GPL-3" "$lic/Apache-2.0" "$lic/GFDL-1.3" "$lic/Artistic" > "$out/train.txt"
cat > "$out/config.json" <<'JSON'
{"model_type": "llama", "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4,
 "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
first=
for seed in $seeds; do
  for s in fp32 8bit bf16; do
    "$build/examples/train" --model "$out/config.json" --data "$out/train.txt" --text --steps 300 \
      --micro-batch 8 --seq 128 --lr 1e-3 --warmup 20 --lr-schedule cosine --min-lr 1e-4 --dtype bf16 \
      --beta2 0.999 --threads 1 --seed "$seed" --optimizer-on cpu --optim-dtype "$s" \
      --log "$out/$s-$seed.jsonl" > /dev/null
    [ -n "$first" ] && continue
    "$build/examples/plot" "$out/$s-$seed.jsonl" --out "docs/figures/optim-state-$s.svg" \
      --title "small LLaMA, 300 steps of license text, AdamW m and v in $s"
  done
  first=$seed
done
/usr/bin/python3 - "$out" $seeds <<'PY'
import json, statistics, sys
d, seeds = sys.argv[1], sys.argv[2:]
states = ("fp32", "8bit", "bf16")
tail = {}
for seed in seeds:
    for s in states:
        v = [json.loads(l)["loss"] for l in open(f"{d}/{s}-{seed}.jsonl")]
        tail[s, seed] = (v[-1], sum(v[-20:]) / 20)
    ref = tail["fp32", seed][1]
    for s in states:
        last, t = tail[s, seed]
        print(f"seed {seed}: {s:5s} final {last:.4f}  mean of the last 20 {t:.4f}  vs fp32 {100 * (t / ref - 1):+.2f}%")
if len(seeds) > 1:
    for s in states[1:]:
        rel = [100 * (tail[s, x][1] / tail["fp32", x][1] - 1) for x in seeds]
        print(f"{s:5s} vs fp32 over seeds {' '.join(seeds)}: mean {statistics.mean(rel):+.2f}%  "
              f"sd {statistics.stdev(rel):.2f}  range {min(rel):+.2f}% .. {max(rel):+.2f}%")
    for s in states:
        t = [tail[s, x][1] for x in seeds]
        print(f"{s:5s} mean of the last 20 over the seeds: {statistics.mean(t):.4f} (sd {statistics.stdev(t):.4f})")
PY
rm -rf "$out"
