#!/usr/bin/env python3
"""gpu_13b: the 13B demo of issue 18. A LLaMA-2-13B-shaped model (random
initialisation) fine-tuned a few steps on one GPU, from a plan memplan made
for that machine, its measurements beside the plan's prediction.

1. The machine: GPU memory as CUDA reports it free (nvidia-smi's memory.free,
   else torch.cuda.mem_get_info), host memory (MemAvailable), the free disk
   under --nvme-dir; flags override each.
2. `memplan calibrate` (on CUDA): CPU AdamW rate, memory bandwidth and the
   disk's rates measured there; GPU rates from the preset of the GPU's name;
   the pinned host->device rate of bench_gpu_cuda when given (--pcie-gbs).
3. `memplan plan --json-out FILE` for that machine. Full fine-tuning of 13B
   needs about 208 GB of weights, gradients and AdamW state: the optimizer
   state must be split over GPU, CPU and disk. When memplan plan's best does
   not put a share on all three (its search splits CPU/NVMe, or takes the GPU
   whole), the fastest three-way split that `memplan estimate` says fits is
   used (its report, --json, ranks them; --plan-out writes the winner as the
   plan): shares in twentieths, NVMe at least --min-nvme, full recompute,
   gradients to the host, weights resident (or streamed when resident fits
   nowhere). `train --check-plan` then checks the plan against the model.
4. `train --plan` on the device for --steps steps: tokens/s, MFU (memplan's
   model FLOPs over the measured step, against the hardware peak the plan
   used), and the peak bytes per tier against the plan (goal: within 5%),
   the step time against the predicted one (goal: within 20%).

Host memory: train loads and initialises the weights one block at a time,
so beyond the plan's CPU tier it holds one block of fp32 (1.3 GB for 13B):
the plan is made for 95% of the host memory. The random initialisation is
parallel (about 3.5e7 values/s a thread; --init-rate) and the NVMe share of
the optimizer state is written once before the first step: fewer steps run
when the time left would not hold them.

--device cpu checks everything up to the GPU: steps 1 and 3 for a described
machine (default the H200 of this project's GPU machine: 139 GiB free GPU
memory, 128 GiB host, 50 GiB disk); `train --check-plan` of the 13B plan
against the 13B model (nothing of it allocated); then the same placement
planned for a tiny LLaMA (the 13B plan's flags) and run by `train --plan` on
the CPU backend.

Exit: 0 ran and every goal met (cpu: the plan is valid and train accepted
it), 1 a goal missed or a step failed, 2 bad usage. Rows for
scripts/gpu-check.sh's summary go to --rows.
"""
import argparse
import array
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30
UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(s, what):
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(s))
    if not m or m.group(2).lower() not in UNITS:
        raise ValueError("%s %s: expected a size such as 139GiB, 128GB or bytes" % (what, s))
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def gib(n):
    return "%.2f GiB" % (n / GIB)


class Run:
    def __init__(self, args):
        self.a = args
        self.rows = []
        self.failed = False

    def log(self, msg):
        print(msg, flush=True)

    def row(self, check, status, figure, goal=""):
        self.rows.append((check, status, figure, goal))
        if status == "FAIL":
            self.failed = True
        if self.a.rows:
            with open(self.a.rows, "a") as f:
                f.write("%s\t%s\t%s\t%s\t%s\n" % (self.a.phase, check, status, figure, goal))

    def memplan(self, *argv, ok=(0,)):
        cmd = [self.a.memplan] + [str(x) for x in argv]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode not in ok:
            raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd[:3]), r.returncode,
                                                    (r.stderr.strip() or r.stdout.strip())[:300]))
        return r


# ---- 1. the machine --------------------------------------------------------------------

def gpu_free_and_name():
    """(free bytes, name) of GPU 0 as the driver reports them, else (0, "")."""
    smi = shutil.which("nvidia-smi") or "/usr/local/nvidia/bin/nvidia-smi"
    try:
        out = subprocess.run([smi, "--query-gpu=memory.free,name", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
        free, name = out[0].split(",", 1)
        return int(free) << 20, name.strip()
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        pass
    try:
        import torch
        free, _ = torch.cuda.mem_get_info(0)
        return int(free), torch.cuda.get_device_name(0)
    except Exception:
        return 0, ""


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def describe(run):
    a = run.a
    cuda = a.device.startswith("cuda")
    name = ""
    if a.gpu_mem:
        gpu = parse_size(a.gpu_mem, "--gpu-mem")
    elif cuda:
        gpu, name = gpu_free_and_name()
        if not gpu:
            raise RuntimeError("no GPU memory reading (nvidia-smi, torch): pass --gpu-mem")
    else:
        gpu = 139 * GIB
    cpu = parse_size(a.cpu_mem, "--cpu-mem") if a.cpu_mem else (mem_available() if cuda else 128 * GIB)
    os.makedirs(a.nvme_dir, exist_ok=True)
    if a.nvme:
        nvme = parse_size(a.nvme, "--nvme")
    elif cuda:
        st = os.statvfs(a.nvme_dir)
        nvme = max(0, int(st.f_bavail * st.f_frsize * 0.9) - 2 * GIB)
    else:
        nvme = 50 * GIB
    return dict(gpu=gpu, cpu=cpu, nvme=nvme, name=name)


def base_preset(name):
    n = name.upper()
    return "h100-80gb" if "H100" in n else ("a100-80gb" if "A100" in n else "h200-141gb")


# ---- 3. the plan -------------------------------------------------------------------------

def shares(plan):
    o = plan["placement"]["optimizer"]
    return o.get("gpu", 0), o.get("cpu", 0), o.get("nvme", 0)


def plan_flags(plan):
    """memplan estimate's flags for a plan's configuration (not its model, hardware or batch)."""
    tr, pl = plan["training"], plan["placement"]
    return ["--dtype", tr["dtype"], "--grad-dtype", tr["grad_dtype"], "--recompute", tr["recompute"],
            "--params", pl["params"], "--grads", pl["grads"], "--checkpoints", pl["checkpoints"],
            "--optimizer", "gpu=%g,cpu=%g,nvme=%g" % shares(plan),
            "--prefetch", plan["buffers"]["prefetch_depth"], "--sub-group", plan["nvme"]["sub_group"],
            "--swap-buffers", plan["nvme"]["swap_buffers"]]


def split_args(run, spec, params):
    return ["--micro-batch", run.a.micro_batch, "--recompute", "full", "--params", params, "--grads", "cpu",
            "--checkpoints", "gpu", "--optimizer", spec, "--grad-dtype", "fp32"]


def three_way(run, hw_args, common):
    """The fastest split of the optimizer over GPU, CPU and NVMe that fits: (report, spec, params)."""
    best = None
    tried = 0
    for params in ("gpu", "cpu"):
        for g in range(1, 19):
            for n in range(1, 20 - g):
                c = 20 - g - n
                if c < 1 or n / 20 < run.a.min_nvme:
                    continue
                spec = "gpu=%g,cpu=%g,nvme=%g" % (g / 20, c / 20, n / 20)
                r = run.memplan("estimate", *hw_args, *common, *split_args(run, spec, params), "--json",
                                ok=(0, 1))
                tried += 1
                d = json.loads(r.stdout)
                if d["fits"] and (best is None or d["time"]["step_s"] < best[0]["time"]["step_s"]):
                    best = (d, spec, params)
        if best:
            break  # resident weights fit: streamed ones would only be slower
    return best, tried


def make_plan(run, m):
    a = run.a
    wd = a.workdir
    cpu_plan = int(m["cpu"] * 0.95)
    run.log("# machine: GPU %s free%s, host %s available (plan: %s, 5%% left for train's one block of "
            "initial weights and slack), disk %s free under %s" % (
                gib(m["gpu"]), " (%s)" % m["name"] if m["name"] else "", gib(m["cpu"]), gib(cpu_plan),
                gib(m["nvme"]), a.nvme_dir))
    hw = a.hw or base_preset(m["name"])
    if a.calibrate:
        prof = os.path.join(wd, "hw.json")
        r = run.memplan("calibrate", "--base", base_preset(m["name"]), "--nvme-dir", a.nvme_dir,
                        "--out", prof, "--seconds", "2")
        run.log("# " + (r.stderr.strip() or r.stdout.strip()).splitlines()[-1])
        if a.pcie_gbs:
            with open(prof) as f:
                p = json.load(f)
            p["pcie_bw"] = float(a.pcie_gbs) * 1e9
            p["note"] = p.get("note", "") + "; pcie_bw: bench_gpu_cuda's pinned host->device rate"
            with open(prof, "w") as f:
                json.dump(p, f, indent=1)
        hw = prof
    hw_args = ["--hw", hw, "--gpu-mem", m["gpu"], "--cpu-mem", cpu_plan, "--nvme", m["nvme"]]
    common = ["--model", a.model, "--seq", a.seq, "--dtype", "bf16"]

    path = os.path.join(wd, "plan13b.json")
    r = run.memplan("plan", *hw_args, *common, "--global-batch", a.micro_batch, "--grad-dtype", "fp32",
                    "--top", "3", "--json-out", os.path.join(wd, "memplan-plan.json"), ok=(0, 1))
    run.log("# memplan plan:\n" + "\n".join("#   " + x for x in r.stdout.strip().splitlines()[:12]))
    chosen, params = None, None
    if r.returncode == 0:
        g, c, n = shares(json.load(open(os.path.join(wd, "memplan-plan.json"))))
        run.row("memplan plan's best", "info", "optimizer gpu %.2f cpu %.2f nvme %.2f" % (g, c, n))
        if g > 0 and c > 0 and n > 0:
            chosen = ("memplan plan", os.path.join(wd, "memplan-plan.json"))
    else:
        run.row("memplan plan's best", "info", "nothing fits")
    if not chosen:
        best, tried = three_way(run, hw_args, common)
        if not best:
            run.row("plan: optimizer over GPU, CPU and NVMe", "FAIL",
                    "no split fits (%d tried): GPU %s, host %s, disk %s" % (tried, gib(m["gpu"]), gib(cpu_plan),
                                                                            gib(m["nvme"])))
            return None
        d, spec, params = best
        run.memplan("estimate", *hw_args, *common, *split_args(run, spec, params), "--plan-out", path, ok=(0, 1))
        chosen = ("memplan estimate, fastest of %d three-way splits" % tried, path)
        run.log("# the plan: %s; weights on %s, optimizer %s" % (chosen[0], params, spec))
    with open(chosen[1]) as f:
        plan = json.load(f)
    if chosen[1] != path:
        shutil.copyfile(chosen[1], path)
    return plan, chosen[0], path, hw_args


def predicted(plan):
    """(peak bytes per tier, step s, tokens/s, mfu, model flops) of a plan file."""
    if plan.get("format") != "zoffload-plan":
        raise RuntimeError("not a plan file (memplan plan --json-out FILE, memplan estimate --plan-out FILE)")
    p = plan["predicted"]
    fl = p.get("model_flops") or p["mfu"] * p["step_s"] * plan["hardware"]["peak_flops_16"]
    return p["peak_bytes"], p["step_s"], p["tokens_per_s"], p["mfu"], fl


def check_plan(run, plan, m, source):
    peak, step, tps, mfu, _ = predicted(plan)
    g, c, n = shares(plan)
    ok = g > 0 and c > 0 and n > 0 and abs(g + c + n - 1) < 1e-6
    run.row("plan: optimizer over GPU, CPU and NVMe (%s)" % source, "ok" if ok else "FAIL",
            "gpu %.2f cpu %.2f nvme %.2f" % (g, c, n), "all three > 0")
    caps = dict(gpu=m["gpu"], cpu=m["cpu"], nvme=m["nvme"])
    fit = all(peak[t] <= caps[t] for t in caps)
    run.row("plan: predicted peaks", "ok" if fit else "FAIL",
            "GPU %s, CPU %s, NVMe %s" % (gib(peak["gpu"]), gib(peak["cpu"]), gib(peak["nvme"])),
            "GPU <= %s, CPU <= %s, NVMe <= %s" % (gib(m["gpu"]), gib(m["cpu"]), gib(m["nvme"])))
    run.row("plan: predicted step", "info", "%.2f s, %.0f tokens/s, MFU %.1f%%" % (step, tps, 100 * mfu))
    return ok and fit


def train_check_plan(run, path, model, plan, what):
    """`train --check-plan`: the plan against the model, nothing allocated; its placement is the plan's."""
    r = subprocess.run([run.a.train, "--check-plan", "--plan", path, "--model", model], capture_output=True,
                       text=True)
    out = (r.stdout + r.stderr).strip()
    g, c, n = shares(plan)
    want = "optimizer cpu %.2f nvme %.2f gpu %.2f" % (c, n, g)
    place = [ln for ln in out.splitlines() if ln.startswith("# placement:")]
    ok = r.returncode == 0 and bool(place) and want in place[0] and "# plan predicts peak bytes" in out
    run.row("train --check-plan (%s)" % what, "ok" if ok else "FAIL",
            want if ok else "exit %d: %s" % (r.returncode, out.splitlines()[-1][:150] if out else "no output"),
            "exit 0, the plan's placement")
    return ok


# ---- 4. the run --------------------------------------------------------------------------

def write_tokens(path, vocab, n):
    rng = random.Random(1234)
    with open(path, "wb") as f:
        f.write(array.array("H", (rng.randrange(vocab) for _ in range(n))).tobytes())


def run_train(run, cmd, limit):
    """train's output line by line (into the log as it comes), stopped at limit s."""
    run.log("## " + " ".join(cmd))
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    import threading
    timer = threading.Timer(limit, p.kill)
    timer.start()
    try:
        for line in p.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            run.log("   [%5.0fs] %s" % (time.time() - t0, line))
    finally:
        timer.cancel()
    rc = p.wait()
    killed = rc < 0 and time.time() - t0 >= limit - 1
    return rc, lines, time.time() - t0, killed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    env = os.environ.get
    ap.add_argument("--train", default=os.path.join(ROOT, "build-gpu/examples/train"))
    ap.add_argument("--memplan", default=os.path.join(ROOT, "build-gpu/planner/memplan"))
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (the plan checked, a tiny run)")
    ap.add_argument("--model", default=env("ZO_13B_MODEL", "llama-2-13b"))
    ap.add_argument("--seq", type=int, default=int(env("ZO_13B_SEQ", "2048")))
    ap.add_argument("--micro-batch", type=int, default=int(env("ZO_13B_MICRO_BATCH", "4")))
    ap.add_argument("--steps", type=int, default=int(env("ZO_13B_STEPS", "4")))
    ap.add_argument("--gpu-mem", default=env("ZO_13B_GPU_MEM", ""), help="default: free GPU memory (cpu: 139GiB)")
    ap.add_argument("--cpu-mem", default=env("ZO_13B_CPU_MEM", ""), help="default: MemAvailable (cpu: 128GiB)")
    ap.add_argument("--nvme", default=env("ZO_13B_NVME", ""), help="default: 90%% of the free disk (cpu: 50GiB)")
    ap.add_argument("--init-rate", type=float, default=float(env("ZO_13B_INIT_RATE", "0")),
                    help="random initial weights train draws a second (default: 3.5e7 x the cores)")
    ap.add_argument("--min-nvme", type=float, default=float(env("ZO_13B_MIN_NVME", "0.1")),
                    help="smallest NVMe share of the optimizer in the three-way split (default 0.1)")
    ap.add_argument("--hw", default=env("ZO_13B_HW", ""), help="hardware preset or profile (default: calibrate)")
    ap.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=None,
                    help="memplan calibrate first (default: on cuda)")
    ap.add_argument("--pcie-gbs", default="", help="pinned host->device GB/s (bench_gpu_cuda) for the profile")
    ap.add_argument("--nvme-dir", default=env("ZO_NVME_DIR", "/tmp/zo-nvme"))
    ap.add_argument("--workdir", default="/tmp/zo-13b")
    ap.add_argument("--rows", default="")
    ap.add_argument("--phase", default="", help=argparse.SUPPRESS)
    ap.add_argument("--time-limit", type=float, default=570)
    a = ap.parse_args()
    cuda = a.device.startswith("cuda")
    a.phase = a.phase or ("13b" if cuda else "plan13b")
    if a.calibrate is None:
        a.calibrate = cuda and not a.hw
    for exe in (a.train, a.memplan):
        if not os.access(exe, os.X_OK):
            print("gpu_13b: %s is not an executable (build first)" % exe, file=sys.stderr)
            return 2
    t_end = time.time() + a.time_limit
    os.makedirs(a.workdir, exist_ok=True)
    run = Run(a)

    m = describe(run)
    made = make_plan(run, m)
    if not made:
        return 1
    plan, source, path, hw_args = made
    if not check_plan(run, plan, m, source) or not train_check_plan(run, path, a.model, plan, "13B"):
        return 1
    peak, step_pred, tps_pred, mfu_pred, flops = predicted(plan)
    tokens_step = a.micro_batch * a.seq

    nv = os.path.join(a.nvme_dir, "run")
    shutil.rmtree(nv, ignore_errors=True)
    os.makedirs(nv, exist_ok=True)
    stats = os.path.join(a.workdir, "stats13b.json")
    if cuda:
        model, steps = a.model, a.steps
    else:  # the same placement planned for a tiny LLaMA, run on the CPU backend
        model, steps = os.path.join(ROOT, "tests/fixtures/gpu/tiny_llama.json"), 2
        path = os.path.join(a.workdir, "plan-tiny.json")
        run.memplan("estimate", "--model", model, *hw_args, "--seq", 16, "--micro-batch", 1, *plan_flags(plan),
                    "--plan-out", path, ok=(0, 1))
        with open(path) as f:
            plan = json.load(f)
        if not train_check_plan(run, path, model, plan, "tiny LLaMA"):
            return 1
    seq, mb, vocab = plan["training"]["seq"], plan["training"]["micro_batch"], plan["model"]["vocab"]
    data = os.path.join(a.workdir, "tokens.bin")
    write_tokens(data, vocab, mb * seq * (steps + 1) + seq + 2)
    cmd = [a.train, "--plan", path, "--model", model, "--data", data, "--device", a.device, "--steps", str(steps),
           "--nvme-dir", nv, "--stats-json", stats]
    limit = max(30, t_end - time.time() - 10)
    if cuda:
        # train draws the initial weights block by block, in parallel, and writes the NVMe share of
        # the optimizer state once before the first step: fewer steps when the time left would not
        # hold them (2 at least: the first is a warm-up)
        rate = a.init_rate or 3.5e7 * (os.cpu_count() or 1)
        nvme_w = plan["hardware"].get("nvme_write_bw") or 1e9
        init_s = plan["model"]["params"] / rate + peak["nvme"] / nvme_w
        fit = int((limit - init_s - 30) / step_pred) if step_pred else steps
        if fit < steps:
            steps = max(2, fit)
            cmd[cmd.index("--steps") + 1] = str(steps)
        run.log("# expect: initial weights and the NVMe share ~%.0f s, then %d steps of ~%.1f s predicted; "
                "%.0f s left" % (init_s, steps, step_pred, limit))
    rc, lines, secs, killed = run_train(run, cmd, limit)
    shutil.rmtree(nv, ignore_errors=True)
    tok = [float(w[w.index("tok/s") + 1]) for w in (ln.split() for ln in lines)
           if len(w) >= 2 and w[0] == "step" and "tok/s" in w[:-1]]
    if rc != 0:
        why = "stopped at its %.0f s limit" % limit if killed else "exit %d" % rc
        last = [ln for ln in lines if ln.strip()][-1:] or ["no output"]
        run.row("train --plan (%s)" % a.device, "FAIL", "%s after %d steps, %.0f s: %s" % (why, len(tok), secs,
                                                                                        last[0][:120]))
        return 1
    if not cuda:
        place = [ln for ln in lines if ln.startswith("# placement:")]
        g, c, n = shares(plan)
        want = "optimizer cpu %.2f nvme %.2f gpu %.2f" % (c, n, g)
        ok = bool(place) and want in place[0]
        ok = ok and len(tok) == steps
        run.row("train --plan ran it (tiny LLaMA, CPU backend)", "ok" if ok else "FAIL",
                "%d of %d steps; %s" % (len(tok), steps, want if ok else "placement line: %s" % (place[:1] or "-")))
        return 1 if run.failed else 0

    # ---- measured against predicted ------------------------------------------------------
    meas = tok[1:] if len(tok) > 1 else tok
    tps = statistics.median(meas)
    step = tokens_step / tps
    peak_flops = flops / (step_pred * mfu_pred) if step_pred and mfu_pred else 0
    mfu = flops / step / peak_flops if peak_flops else 0
    run.row("13B tokens/s (median of steps 2..%d)" % len(tok), "info",
            "%.0f (plan %.0f); MFU %.1f%% (plan %.1f%%)" % (tps, tps_pred, 100 * mfu, 100 * mfu_pred))
    r = step / step_pred
    run.row("13B step time / predicted", "ok" if abs(r - 1) <= 0.20 else "FAIL",
            "%.2f (%.2f s vs %.2f s)" % (r, step, step_pred), "within 20%")
    with open(stats) as f:
        st = json.load(f)
    for t in ("gpu", "cpu", "nvme"):
        got, want = st["peak_bytes"][t], peak[t]
        q = got / want if want else float("inf") if got else 1.0
        run.row("13B peak %s / plan" % t, "ok" if abs(q - 1) <= 0.05 else "FAIL",
                "%.3f (%s vs %s)" % (q, gib(got), gib(want)), "within 5%")
    return 1 if run.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError, KeyError) as e:  # one line, no traceback
        print("gpu_13b: %s" % e, file=sys.stderr)
        rows = next((sys.argv[i + 1] for i, x in enumerate(sys.argv[:-1]) if x == "--rows"), "")
        if rows:
            dev = next((sys.argv[i + 1] for i, x in enumerate(sys.argv[:-1]) if x == "--device"), "cuda")
            phase = "plan13b" if dev == "cpu" else "13b"
            with open(rows, "a") as f:
                f.write("%s\tgpu_13b.py\tFAIL\t%s\t\n" % (phase, str(e).replace("\t", " ")[:200]))
        sys.exit(1)
