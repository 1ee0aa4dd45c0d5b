#!/usr/bin/env python3
"""gpu_schedules: the optimizer schedules (issue 14) on a GPU, for a model whose
CPU optimizer is worth hiding: memplan's predicted step against the one
`train --plan` measures, for serial, overlap and dpu, on one placement.

The machine is described and calibrated as scripts/gpu_13b.py does (free GPU
memory, the host tier: MemTotal less a reserve, the disk under --nvme-dir;
`memplan calibrate`, its profile kept in --hw-cache for the 13B run). The plan: `memplan estimate`
for --model (default the 1.3B LLaMA of bench/configs, seq 1024, batch 8,
bf16) with ZeRO-Offload's placement (weights and checkpoints on the GPU,
gradients to the host, the optimizer on the CPU, no recompute; --params,
--optimizer, --recompute change it), written with --plan-out and checked by
`train --check-plan`. Then per schedule: the plan with
training.optimizer_schedule set (dpu after one serial step), `memplan
estimate --plan` for its prediction, `train --plan` for --steps steps; the
measured step is the median after the warm-up (dpu: after two). A table in
the log and one row per schedule: measured / predicted (goal within 15%),
measured and predicted over serial, and the share of the optimizer's time
that ran beside the device's work (train --stats-json).

--device cpu (the test here): the plan for the tiny LLaMA on the described
H200, the schedules run on the CPU backend: that each ran as asked; the
ratios (the CPU's steps against the H200's plan) are figures only.

Exit: 0 every schedule ran and met its goal, 1 one did not, 2 bad usage.
"""
import argparse
import os
import sys

import gpu_13b as g


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    g.add_common_args(ap, "ZO_SCHED_", os.path.join(g.ROOT, "bench/configs/llama-1.3b.json"), 1024, 8, 5,
                      "/tmp/zo-schedules")
    ap.add_argument("--params", default="gpu", help="where the weights live (default gpu)")
    ap.add_argument("--optimizer", default="cpu", help="the optimizer state's place or split (default cpu)")
    ap.add_argument("--recompute", default="none")
    ap.add_argument("--label", default="", help="the rows' name for the model (default: its size, e.g. 1.3B)")
    a = ap.parse_args()
    cuda = a.device.startswith("cuda")
    a.phase = a.phase or ("bench" if cuda else "schedules")
    if a.calibrate is None:
        a.calibrate = cuda and not a.hw
    if not g.check_executables(a, "gpu_schedules"):
        return 2
    os.makedirs(a.workdir, exist_ok=True)
    run = g.Run(a)

    m = g.describe(run)
    hw_args = g.hardware(run, m)
    path = os.path.join(a.workdir, "plan-schedules.json")
    r = run.memplan("estimate", "--model", a.model, *hw_args, "--seq", a.seq, "--micro-batch", a.micro_batch,
                    "--dtype", "bf16", "--params", a.params, "--grads", "cpu", "--optimizer", a.optimizer,
                    "--checkpoints", "gpu", "--recompute", a.recompute, "--plan-out", path, ok=(0, 1))
    run.log("# memplan estimate:\n" + "\n".join("#   " + x for x in r.stdout.strip().splitlines()[:12]))
    plan = g.load(path)
    n = plan["model"]["params"]
    label = a.label or ("%.1fB" % (n / 1e9) if n >= 5e7 else os.path.splitext(os.path.basename(a.model))[0])
    if not g.check_fits(run, label, plan, m) or not g.train_check_plan(run, path, a.model, plan, label):
        return 1
    g.compare_schedules(run, label, path, a.model, a.steps)
    return 1 if run.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError, KeyError) as e:  # one line, no traceback
        sys.exit(g.fail_row("gpu_schedules.py", "schedules", "bench", e))
