#!/usr/bin/env python3
"""profile_overhead: what train --profile costs a step on the CPU backend.

Runs `train` on a small LLaMA (weights, gradients and optimizer on the
device, as the QLoRA 13B plan places them) with and without --profile,
alternated (--pairs times), and prints the median step time of the steps
after the first (the ones --profile times) of each, their ratio, and the
ops timed per step; then, over the --profile runs, the compute stream's
busy time over the host's waits for it (the runtime's own count: 1.0 when
the profile accounts for the time the host waited). The model is written
to a temporary folder; nothing else is read.

usage: scripts/profile_overhead.py [--train build/examples/train] [--hidden 128] [--pairs 5] [--steps 8]
"""
import argparse
import array
import json
import os
import random
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(a, d, profile):
    stats = os.path.join(d, "stats.json")
    cmd = [a.train, "--model", os.path.join(d, "config.json"), "--data", os.path.join(d, "tokens.bin"),
           "--steps", str(a.steps), "--micro-batch", "4", "--seq", "128", "--threads", str(a.threads),
           "--optimizer", "gpu", "--stats-json", stats] + (["--profile"] if profile else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    tok = [float(w[w.index("tok/s") + 1]) for w in (ln.split() for ln in out.splitlines()) if w[:1] == ["step"]]
    step_ms = [1e3 * 4 * 128 / t for t in tok[1:]]
    ops, ratio = 0.0, 0.0
    if profile:
        prof = json.load(open(stats))["profile"]
        ops = sum(o["calls_per_step"] for o in prof["ops"] if o["stream"] != "host")
        ratio = prof["streams_busy_ms_per_step"]["compute"] / prof["host_ms_per_step"]["compute"]
    return statistics.median(step_ms), ops, ratio


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=os.path.join(ROOT, "build/examples/train"))
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": a.hidden, "num_attention_heads": 4,
               "num_key_value_heads": 2, "intermediate_size": 2 * a.hidden, "vocab_size": 512,
               "max_position_embeddings": 256}
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        rng = random.Random(1)
        with open(os.path.join(d, "tokens.bin"), "wb") as f:
            f.write(array.array("H", (rng.randrange(512) for _ in range(4 * 128 * (a.steps + 1) + 2))).tobytes())
        off, on, ratios, ops = [], [], [], 0.0
        for _ in range(a.pairs):
            off.append(run(a, d, False)[0])
            ms, ops, ratio = run(a, d, True)
            on.append(ms)
            ratios.append(ratio)
    mo, mn = statistics.median(off), statistics.median(on)
    print("# profile_overhead: LLaMA 2 layers hidden %d, batch 4 x 128, %d threads, CPU backend; median step of "
          "steps 2..%d over %d runs each, alternated" % (a.hidden, a.threads, a.steps, a.pairs))
    print("off      %.3f ms/step" % mo)
    print("profile  %.3f ms/step (%.0f ops, copies and memsets timed a step)" % (mn, ops))
    print("ratio    %.3f (%.2f us a timed op)" % (mn / mo, 1e3 * (mn - mo) / ops if ops else 0.0))
    print("compute stream busy / host's waits for it: %.3f .. %.3f (median %.3f)" % (
        min(ratios), max(ratios), statistics.median(ratios)))


if __name__ == "__main__":
    main()
