#!/usr/bin/env python3
"""gpu_13b: the 13B demo of issue 18. A LLaMA-2-13B-shaped model (random
initialisation) trained a few steps on one GPU, from plans memplan made for
that machine, its measurements beside the plans' predictions. Three runs, in
the order --runs gives (default qlora,full8,full,schedules), each while the
time left holds it:

  qlora      QLoRA (issue 15): an NF4 base, LoRA r 16 on every linear layer
  full8      full fine-tuning with 8-bit AdamW state (m, v block-wise 8-bit,
             the fp32 master: 6 B/param): memplan plan --optim adamw8bit's
             best, which fits GPU and host without the disk
  full       full fine-tuning: the optimizer state split over GPU, CPU and disk
  schedules  the full run's plan with the optimizer schedules serial, overlap
             and dpu (issue 14): measured step against memplan's for each
             (after full, which it needs)

1. The machine: GPU memory as CUDA reports it free (nvidia-smi's memory.free,
   else torch.cuda.mem_get_info), the host tier (below), the free disk under
   --nvme-dir; flags override each.
2. `memplan calibrate` (on CUDA): CPU AdamW rate, memory bandwidth and the
   disk's rates measured there; GPU rates from the preset of the GPU's name;
   the pinned host->device rate of bench_gpu_cuda when given (--pcie-gbs).
   With --hw-cache FILE an earlier run's profile is taken from FILE (the
   bench phase's 1.3B schedules, scripts/gpu_schedules.py, write it too).
3. full: `memplan plan --json-out FILE` for that machine. Full fine-tuning of 13B
   needs about 208 GB of weights, gradients and AdamW state: the optimizer
   state is split over GPU, CPU and disk. The plan is memplan plan's best with
   a share on each of the three (`--optimizer-min gpu=0.01,cpu=0.01,nvme=F`,
   F = --min-nvme); its best without that constraint (which may leave the
   disk out when the GPU and host hold it all) is logged beside it. qlora:
   `memplan plan --lora R --lora-targets all-linear --qlora` for the same
   machine, its best. `train --check-plan` checks each plan
   against the model (placement, method and schedule).
4. `train --plan` on the device for --steps steps: tokens/s, MFU (memplan's
   model FLOPs over the measured step, against the hardware peak the plan
   used), and the peak bytes per tier against the plan (goal: within 5%),
   the step time against the predicted one (goal: within 20%). The QLoRA run is
   profiled (`train --profile`): its table, every device op's ms per step, goes
   to the log, and its five longest ops to a row. schedules: the
   full plan with training.optimizer_schedule set (dpu after one serial
   step), memplan estimate --plan for its prediction, train --plan for the
   measured step (the median after the warm-up steps); goal within 15%.

Host memory: the plans' CPU tier is the machine's memory (MemTotal, or
--cpu-mem) less a reserve (--host-reserve, default 10% of it and at least
8 GiB): what the kernel, the CUDA driver's own host memory, the page cache
of the NVMe files and train's one block of fp32 initial weights beyond the
plan (train loads and initialises the weights one block at a time: 1.3 GB
for 13B) need. Not MemAvailable at start: that is the kernel's estimate at
one moment, which moves with whatever else holds memory then, so the same
machine would get another plan at each start; it is logged beside, and an
info row says when it is below the tier. The random initialisation is
parallel (about 3.5e7 values/s a thread; --init-rate), so is QLoRA's NF4
packing (about 2e7 a thread; --nf4-rate); full fine-tuning sets up its
stores and optimizer state and puts the weights into them (3.5e6 parameters
a second a core as measured on the H100 before that was parallelised, 252 s
for 13B; --setup-rate), and the NVMe share of the optimizer state is written
once before the first step: fewer steps run when the time left would not
hold them, and a run that would not fit at all is reported not run. train
prints a "# start:" line per phase of its start-up.

--device cpu checks everything up to the GPU: the plans for a described
machine (default the H200 of this project's GPU machine: 139 GiB free GPU
memory, 128 GiB host, 50 GiB disk); `train --check-plan` of each 13B plan
against the 13B model (nothing of it allocated); then the same placement and
method planned for a tiny LLaMA (the 13B plan's flags) and run by `train
--plan` on the CPU backend, and the tiny full plan under each schedule (the
schedule ran as asked; the ratios are the CPU's against the H200's plan,
figures only).

Exit: 0 ran and every goal met (cpu: the plans are valid and train ran
them), 1 a goal missed or a step failed, 2 bad usage. Rows for
scripts/gpu-check.sh's summary go to --rows.
"""
import argparse
import array
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests/fixtures/gpu/tiny_llama.json")
GIB = 1 << 30
UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
RUNS = ("qlora", "full8", "full", "schedules")  # the default order: QLoRA first, the cheapest run that shows 13B
SCHEDULES = ("serial", "overlap", "dpu")
STEP_GOAL, PEAK_GOAL, SCHEDULE_GOAL = 0.20, 0.05, 0.15


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
        self.cuda = args.device.startswith("cuda")
        self.t_end = time.time() + args.time_limit
        self.failed = False

    def left(self):
        return self.t_end - time.time()

    def log(self, msg):
        print(msg, flush=True)

    def row(self, check, status, figure, goal=""):
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


def add_common_args(ap, env_prefix, model, seq, micro_batch, steps, workdir):
    """The flags gpu_13b.py and gpu_schedules.py share (defaults from env_prefix + NAME)."""
    def env(name, default):
        return os.environ.get(env_prefix + name, default)
    ap.add_argument("--train", default=os.path.join(ROOT, "build-gpu/examples/train"))
    ap.add_argument("--memplan", default=os.path.join(ROOT, "build-gpu/planner/memplan"))
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (plans checked, tiny runs)")
    ap.add_argument("--model", default=env("MODEL", model))
    ap.add_argument("--seq", type=int, default=int(env("SEQ", str(seq))))
    ap.add_argument("--micro-batch", type=int, default=int(env("MICRO_BATCH", str(micro_batch))))
    ap.add_argument("--steps", type=int, default=int(env("STEPS", str(steps))))
    ap.add_argument("--gpu-mem", default=env("GPU_MEM", ""), help="default: free GPU memory (cpu: 139GiB)")
    ap.add_argument("--cpu-mem", default=env("CPU_MEM", ""),
                    help="the host's memory, before the reserve (default: MemTotal; cpu: 128GiB)")
    ap.add_argument("--host-reserve", default=env("HOST_RESERVE", ""),
                    help="host memory kept out of the plan's CPU tier (default: 10%% of it, at least 8GiB)")
    ap.add_argument("--nvme", default=env("NVME", ""), help="default: 90%% of the free disk (cpu: 50GiB)")
    ap.add_argument("--init-rate", type=float, default=float(env("INIT_RATE", "0")),
                    help="random initial weights train draws a second (default: 3.5e7 x the cores)")
    ap.add_argument("--nf4-rate", type=float, default=float(env("NF4_RATE", "0")),
                    help="weights train packs to NF4 a second (default: 2e7 x the cores)")
    ap.add_argument("--setup-rate", type=float, default=float(env("SETUP_RATE", "0")),
                    help="full fine-tuning: parameters a second train sets its stores and optimizer state up "
                         "for and puts its weights into (default: 3.5e6 x the cores, measured on the H100 "
                         "before the start-up was parallelised)")
    ap.add_argument("--hw", default=env("HW", ""), help="hardware preset or profile (default: calibrate)")
    ap.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=None,
                    help="memplan calibrate first (default: on cuda)")
    ap.add_argument("--hw-cache", default="", help="the calibrated profile: taken from FILE when it exists, "
                                                   "else written there")
    ap.add_argument("--pcie-gbs", default="", help="pinned host->device GB/s (bench_gpu_cuda) for the profile")
    ap.add_argument("--nvme-dir", default=os.environ.get("ZO_NVME_DIR", "/tmp/zo-nvme"))
    ap.add_argument("--workdir", default=workdir)
    ap.add_argument("--rows", default="")
    ap.add_argument("--phase", default="", help=argparse.SUPPRESS)
    ap.add_argument("--time-limit", type=float, default=570)


def check_executables(a, who):
    for exe in (a.train, a.memplan):
        if not os.access(exe, os.X_OK):
            print("%s: %s is not an executable (build first)" % (who, exe), file=sys.stderr)
            return False
    return True


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


def meminfo(field):
    """A /proc/meminfo field in bytes, 0 when it is not there."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def host_tier(a, cuda):
    """(bytes of the plans' CPU tier, the host memory it comes from, the reserve, where the memory figure
    came from). The machine's memory (MemTotal; --cpu-mem; 128 GiB for the described machine) less the
    reserve (--host-reserve, else 10% of the memory and at least 8 GiB)."""
    if a.cpu_mem:
        total, src = parse_size(a.cpu_mem, "--cpu-mem"), "--cpu-mem"
    elif cuda:
        total, src = meminfo("MemTotal"), "MemTotal"
        if not total:
            raise RuntimeError("no MemTotal in /proc/meminfo: pass --cpu-mem")
    else:
        total, src = 128 * GIB, "the described machine"
    reserve = parse_size(a.host_reserve, "--host-reserve") if a.host_reserve else max(8 * GIB, total // 10)
    if reserve >= total:
        raise ValueError("--host-reserve %s leaves nothing of %s" % (gib(reserve), gib(total)))
    return total - reserve, total, reserve, src


def describe(run):
    a = run.a
    name = ""
    if a.gpu_mem:
        gpu = parse_size(a.gpu_mem, "--gpu-mem")
    elif run.cuda:
        gpu, name = gpu_free_and_name()
        if not gpu:
            raise RuntimeError("no GPU memory reading (nvidia-smi, torch): pass --gpu-mem")
    else:
        gpu = 139 * GIB
    cpu, host, reserve, src = host_tier(a, run.cuda)
    os.makedirs(a.nvme_dir, exist_ok=True)
    if a.nvme:
        nvme = parse_size(a.nvme, "--nvme")
    elif run.cuda:
        st = os.statvfs(a.nvme_dir)
        nvme = max(0, int(st.f_bavail * st.f_frsize * 0.9) - 2 * GIB)
    else:
        nvme = 50 * GIB
    return dict(gpu=gpu, cpu=cpu, host=host, reserve=reserve, host_src=src, nvme=nvme, name=name)


def base_preset(name):
    n = name.upper()
    return "h100-80gb" if "H100" in n else ("a100-80gb" if "A100" in n else "h200-141gb")


# ---- 2. the hardware -----------------------------------------------------------------------

def hardware(run, m):
    """memplan's hardware flags for the machine: a preset, or a profile calibrated here (or by
    an earlier run, --hw-cache), its host link the pinned rate bench_gpu_cuda measured."""
    a = run.a
    avail = meminfo("MemAvailable") if run.cuda else 0
    run.log("# machine: GPU %s free%s, disk %s free under %s" % (
        gib(m["gpu"]), " (%s)" % m["name"] if m["name"] else "", gib(m["nvme"]), a.nvme_dir))
    why = "the kernel, the CUDA driver's host memory, the NVMe files' page cache, train's one fp32 block of " \
          "initial weights"
    run.log("# host tier %s: %s %s less a reserve of %s (%s: %s)%s" % (
        gib(m["cpu"]), m["host_src"], gib(m["host"]), gib(m["reserve"]),
        "--host-reserve" if a.host_reserve else "10%, at least 8 GiB", why,
        "; MemAvailable now %s, not used: it is this moment's, not the machine's" % gib(avail) if avail else ""))
    run.row("host tier of the plans", "info", "%s = %s %s - reserve %s" % (
        gib(m["cpu"]), m["host_src"], gib(m["host"]), gib(m["reserve"])))
    if avail and avail < m["cpu"]:
        run.row("host memory available at start", "info", "MemAvailable %s is below the host tier %s: something "
                "else holds memory (a run may fail to allocate its CPU tier)" % (gib(avail), gib(m["cpu"])))
    hw = a.hw or base_preset(m["name"])
    if a.calibrate:
        prof = a.hw_cache or os.path.join(a.workdir, "hw.json")
        if a.hw_cache and os.path.exists(prof):
            run.log("# hardware profile %s (calibrated by an earlier run)" % prof)
        else:
            r = run.memplan("calibrate", "--base", base_preset(m["name"]), "--nvme-dir", a.nvme_dir,
                            "--out", prof, "--seconds", "2")
            run.log("# " + (r.stderr.strip() or r.stdout.strip()).splitlines()[-1])
        if a.pcie_gbs:
            with open(prof) as f:
                p = json.load(f)
            if p.get("pcie_bw") != float(a.pcie_gbs) * 1e9 or len(p.get("note", "")) > 159:
                p["pcie_bw"] = float(a.pcie_gbs) * 1e9
                # memplan takes a note of at most 159 bytes: the suffix goes first
                tail = "; pcie_bw from bench_gpu_cuda (pinned h2d)"
                p["note"] = p.get("note", "").split("; pcie_bw")[0][:159 - len(tail)] + tail
                with open(prof, "w") as f:
                    json.dump(p, f, indent=1)
        hw = prof
    return ["--hw", hw, "--gpu-mem", m["gpu"], "--cpu-mem", m["cpu"], "--nvme", m["nvme"]]


# ---- 3. the plans ----------------------------------------------------------------------------

def load(path):
    with open(path) as f:
        return json.load(f)


def shares(plan):
    o = plan["placement"]["optimizer"]
    return o.get("gpu", 0), o.get("cpu", 0), o.get("nvme", 0)


def plan_flags(plan):
    """memplan estimate's flags for a plan's configuration (not its model, hardware or batch)."""
    tr, pl = plan["training"], plan["placement"]
    f = ["--dtype", tr["dtype"], "--grad-dtype", tr["grad_dtype"], "--recompute", tr["recompute"],
         "--params", pl["params"], "--grads", pl["grads"], "--checkpoints", pl["checkpoints"],
         "--optimizer", "gpu=%g,cpu=%g,nvme=%g" % shares(plan),
         "--prefetch", plan["buffers"]["prefetch_depth"], "--sub-group", plan["nvme"]["sub_group"],
         "--swap-buffers", plan["nvme"]["swap_buffers"], "--schedule", tr["optimizer_schedule"],
         "--dpu-warmup", tr["dpu_warmup"]]
    if tr.get("optim_dtype", "fp32") != "fp32" or tr.get("master", "fp32") != "fp32":
        f += ["--optim", tr["optimizer"], "--optim-dtype", tr["optim_dtype"], "--master", tr["master"]]
    if tr.get("opt_threads"):
        f += ["--opt-threads", tr["opt_threads"]]
    if tr.get("clip_stale"):
        f += ["--clip-stale"]
    if tr["method"] != "full":
        lo = tr["lora"]
        f += ["--lora", lo["r"], "--lora-targets", lo["targets"], "--lora-alpha", lo["alpha"],
              "--adapters-on", pl["adapters"]]
        if tr["method"] == "qlora":
            f += ["--qlora"]
    return f


def memplan_plan(run, hw_args, common, out, *extra):
    """memplan plan's best for this machine into `out`: the plan, or None when nothing fits."""
    r = run.memplan("plan", *hw_args, *common, "--global-batch", run.a.micro_batch, *extra, "--top", "3",
                    "--json-out", out, ok=(0, 1))
    run.log("# memplan plan %s:\n" % " ".join(str(x) for x in extra) +
            "\n".join("#   " + x for x in r.stdout.strip().splitlines()[:14]))
    return load(out) if r.returncode == 0 else None


def full_plan(run, m, hw_args):
    """The full fine-tuning plan (optimizer over GPU, CPU and NVMe): (plan, source, path) or None.
    memplan plan's best with a share of the optimizer on each tier (--optimizer-min); its best without
    that constraint is logged beside it."""
    a = run.a
    common = ["--model", a.model, "--seq", a.seq, "--dtype", "bf16", "--grad-dtype", "fp32"]
    path = os.path.join(a.workdir, "plan13b.json")
    free = memplan_plan(run, hw_args, common, os.path.join(a.workdir, "memplan-plan-free.json"))
    if free:
        run.row("memplan plan's best, any split", "info", "optimizer gpu %.2f cpu %.2f nvme %.2f, %.3g s/step" % (
            *shares(free), free["predicted"]["step_s"]))
    need = "gpu=0.01,cpu=0.01,nvme=%g" % a.min_nvme
    best = memplan_plan(run, hw_args, common, path, "--optimizer-min", need)
    if not best:
        run.row("plan: optimizer over GPU, CPU and NVMe", "FAIL",
                "memplan plan --optimizer-min %s: nothing fits (GPU %s, host %s, disk %s)" % (
                    need, gib(m["gpu"]), gib(m["cpu"]), gib(m["nvme"])))
        return None
    return best, "memplan plan --optimizer-min %s" % need, path


def predicted(plan):
    """(peak bytes per tier, step s, tokens/s, mfu, model flops) of a plan file."""
    if plan.get("format") != "zoffload-plan":
        raise RuntimeError("not a plan file (memplan plan --json-out FILE, memplan estimate --plan-out FILE)")
    p = plan["predicted"]
    fl = p.get("model_flops") or p["mfu"] * p["step_s"] * plan["hardware"]["peak_flops_16"]
    return p["peak_bytes"], p["step_s"], p["tokens_per_s"], p["mfu"], fl


def check_fits(run, label, plan, m):
    """The plan's predicted peaks against the machine, and its step: rows; True when it fits."""
    peak, step, tps, mfu, _ = predicted(plan)
    caps = dict(gpu=m["gpu"], cpu=m["cpu"], nvme=m["nvme"])
    fit = all(peak[t] <= caps[t] for t in caps)
    run.row("%s plan: predicted peaks" % label, "ok" if fit else "FAIL",
            "GPU %s, CPU %s, NVMe %s" % (gib(peak["gpu"]), gib(peak["cpu"]), gib(peak["nvme"])),
            "GPU <= %s, CPU <= %s, NVMe <= %s" % (gib(m["gpu"]), gib(m["cpu"]), gib(m["nvme"])))
    run.row("%s plan: predicted step" % label, "info", "%.2f s, %.0f tokens/s, MFU %.1f%%" % (step, tps, 100 * mfu))
    return fit


def expected_lines(plan):
    """What train prints of a plan: the placement's optimizer shares, the method line's start and
    its schedule."""
    g, c, n = shares(plan)
    tr = plan["training"]
    meth = tr["method"]
    if meth != "full":
        meth += " (LoRA r %d " % tr["lora"]["r"]
    return "optimizer cpu %.2f nvme %.2f gpu %.2f" % (c, n, g), "# method: " + meth, \
        "optimizer schedule " + tr["optimizer_schedule"]


def method_str(plan):
    """A plan's method and placement in a few words, for the rows."""
    tr = plan["training"]
    lo = " r %d on %s" % (tr["lora"]["r"], tr["lora"]["targets"]) if tr["method"] != "full" else ""
    return "%s%s; %s" % (tr["method"], lo, expected_lines(plan)[0])


def lines_match(plan, lines):
    """'' when train's placement and method lines are the plan's, else what differs."""
    place, meth, sched = expected_lines(plan)
    pl = [ln for ln in lines if ln.startswith("# placement:")]
    me = [ln for ln in lines if ln.startswith("# method:")]
    if not pl or place not in pl[0]:
        return "placement line: %s (expected %s)" % (pl[0][:100] if pl else "none", place)
    if not me or not me[0].startswith(meth) or sched not in me[0]:
        return "method line: %s (expected %s ...; %s)" % (me[0][:100] if me else "none", meth[2:], sched)
    return ""


def train_check_plan(run, path, model, plan, what):
    """`train --check-plan`: the plan against the model, nothing allocated; its placement, method and
    schedule are the plan's."""
    r = subprocess.run([run.a.train, "--check-plan", "--plan", path, "--model", model], capture_output=True,
                       text=True)
    out = (r.stdout + r.stderr).strip()
    lines = out.splitlines()
    bad = "exit %d: %s" % (r.returncode, lines[-1][:150] if lines else "no output") if r.returncode else \
        lines_match(plan, lines) or ("" if "# plan predicts peak bytes" in out else "no predicted peaks")
    run.row("train --check-plan (%s)" % what, "FAIL" if bad else "ok", bad or method_str(plan),
            "exit 0, the plan's placement and method")
    return not bad


def tiny_plan(run, plan, hw_args, name):
    """The same configuration (the plan's flags) planned for the tiny LLaMA, checked by train."""
    path = os.path.join(run.a.workdir, "plan-tiny-%s.json" % name)
    run.memplan("estimate", "--model", TINY, *hw_args, "--seq", 16, "--micro-batch", 1, *plan_flags(plan),
                "--plan-out", path, ok=(0, 1))
    tiny = load(path)
    return (tiny, path) if train_check_plan(run, path, TINY, tiny, "tiny LLaMA, %s" % name) else (None, path)


# ---- 4. the runs -----------------------------------------------------------------------------

def write_tokens(path, vocab, n):
    """n tokens: one block of 256 random ones, repeated. Learnable in a few steps (its
    unigram distribution at least, from a random initialisation's ln(vocab) and above), so a
    loss that does not fall says the update is wrong; all-random tokens would leave nothing to
    learn but the uniform distribution."""
    rng = random.Random(1234)
    block = [rng.randrange(vocab) for _ in range(256)]
    with open(path, "wb") as f:
        f.write(array.array("H", (block[i % len(block)] for i in range(n))).tobytes())


def run_train(run, cmd, limit):
    """train's output line by line (into the log as it comes), stopped at limit s."""
    run.log("## " + " ".join(cmd))
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
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


def setup_s(run, plan):
    """Seconds train spends before its first step: the random weights (and their NF4 packing); with
    full fine-tuning the runtime's stores and optimizer state set up and the weights put into them;
    the NVMe share of the optimizer state written once.

    The full fine-tuning rate is the one measured before train's start-up was parallelised (H100,
    16 cores, 13B with 8-bit AdamW state half on the GPU: 252 s to the first line, ~23 s of it the
    random weights: 13.02e9 / 229 s / 16 = 3.5e6 parameters a second a core; the 1.35B LLaMA's 21-35
    s agree). The parallel start-up (pinned memory touched by every core and registered, the zero
    8-bit moments written as the zero state instead of coded, the conversions, copies, scans and
    zero fills by the OpenMP team) is expected to take that part to a third or less, but it has not
    been measured on a GPU yet: the default stays the measured rate, so the time limit covers the
    start-up; --setup-rate sets the new one once measured (train prints "# start:" lines)."""
    cores = os.cpu_count() or 1
    n = plan["model"]["params"]
    s = n / (run.a.init_rate or 3.5e7 * cores)
    if plan["training"]["method"] == "qlora":
        s += n / (run.a.nf4_rate or 2e7 * cores)
    if plan["training"]["method"] == "full":
        s += n / (run.a.setup_rate or 3.5e6 * cores)
    return s + plan["predicted"]["peak_bytes"]["nvme"] / (plan["hardware"].get("nvme_write_bw") or 1e9)


def train_plan(run, label, path, plan, model, steps, skip, est=None, optional=False, profile=False):
    """`train --plan` for `steps` steps (fewer on CUDA when the time left would not hold them, never
    fewer than skip + 1): a measurement (median tokens/s and step of the steps after the first
    `skip`, the seconds before the first step, the stats file, train's lines) or None with a FAIL
    row (a skip row for an `optional` run when no time is left). `est`: (setup s, step s) to
    expect, else the plan's. `profile`: train --profile (its table in the log with train's other
    lines, and under "profile" in the stats file)."""
    a = run.a
    tr = plan["training"]
    seq, mb, accum = tr["seq"], tr["micro_batch"], tr.get("grad_accum", 1)
    limit = max(30, run.left() - 10)
    if run.cuda:
        init, step_est = est or (setup_s(run, plan), plan["predicted"]["step_s"])
        fit = int((limit - init - 30) / step_est) if step_est else steps
        if fit < skip + 1:
            run.row("%s run" % label, "skip" if optional else "FAIL", "not run: %.0f s left, it needs ~%.0f s" % (
                run.left(), init + 30 + (skip + 1) * step_est))
            return None
        steps = min(steps, fit)
        run.log("# %s: expect the start-up (initial weights, stores, the NVMe share) ~%.0f s, then %d steps of "
                "~%.2f s; %.0f s left" % (label, init, steps, step_est, limit))
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    nv = os.path.join(a.nvme_dir, "run")
    shutil.rmtree(nv, ignore_errors=True)
    os.makedirs(nv, exist_ok=True)
    stats = os.path.join(a.workdir, "stats-%s.json" % slug)
    data = os.path.join(a.workdir, "tokens-%s.bin" % slug)
    write_tokens(data, plan["model"]["vocab"], mb * accum * seq * (steps + 1) + seq + 2)
    cmd = [a.train, "--plan", path, "--model", model, "--data", data, "--device", a.device, "--steps", str(steps),
           "--nvme-dir", nv, "--stats-json", stats] + (["--profile"] if profile else [])
    rc, lines, secs, killed = run_train(run, cmd, limit)
    shutil.rmtree(nv, ignore_errors=True)
    os.unlink(data)
    tok = [float(w[w.index("tok/s") + 1]) for w in (ln.split() for ln in lines)
           if len(w) >= 2 and w[0] == "step" and "tok/s" in w[:-1]]
    loss = [float(w[w.index("loss") + 1]) for w in (ln.split() for ln in lines)
            if len(w) >= 2 and w[0] == "step" and "loss" in w[:-1]]
    if rc != 0:
        why = "stopped at its %.0f s limit" % limit if killed else "exit %d" % rc
        last = [ln for ln in lines if ln.strip()][-1:] or ["no output"]
        run.row("%s: train --plan (%s)" % (label, a.device), "FAIL",
                "%s after %d steps, %.0f s: %s" % (why, len(tok), secs, last[0][:120]))
        return None
    meas = tok[skip:] if len(tok) > skip else tok[-1:]
    tps = statistics.median(meas) if meas else 0.0
    tokens = mb * accum * seq
    return dict(tok=tok, loss=loss, tps=tps, step=tokens / tps if tps else 0.0, stats=load(stats), lines=lines,
                steps=steps, skip=skip, setup=max(0.0, secs - sum(tokens / t for t in tok if t > 0)))


def report(run, label, plan, meas):
    """A run against its plan: on CUDA tokens/s, MFU, step and per-tier peaks against the goals; on
    the CPU backend (a tiny model) that train ran the plan's placement and method."""
    if not run.cuda:
        bad = lines_match(plan, meas["lines"]) or (
            "" if len(meas["tok"]) == meas["steps"] else "%d of %d steps" % (len(meas["tok"]), meas["steps"]))
        run.row("train --plan ran it (%s, CPU backend)" % label, "FAIL" if bad else "ok",
                bad or "%d steps; %s" % (meas["steps"], method_str(plan)))
        run.row("%s losses (CPU backend)" % label, "info", " ".join("%.4f" % x for x in meas["loss"]))
        return
    losses = " ".join("%.4f" % x for x in meas["loss"])
    ls = meas["loss"]
    finite = ls and all(math.isfinite(x) for x in ls)
    # the halves' means: consecutive batches start at other offsets of the data, so one
    # step's loss can sit above the one before while the trend falls
    h = len(ls) // 2
    falling = h > 0 and statistics.mean(ls[len(ls) - h:]) < statistics.mean(ls[:h])
    run.row("%s losses finite and falling" % label, "ok" if finite and falling else "FAIL",
            losses or "no loss lines", "finite; the later half's mean below the first half's")
    peak, step_pred, tps_pred, mfu_pred, flops = predicted(plan)
    peak_flops = flops / (step_pred * mfu_pred) if step_pred and mfu_pred else 0
    mfu = flops / meas["step"] / peak_flops if peak_flops and meas["step"] else 0
    run.row("%s tokens/s (median of steps %d..%d)" % (label, meas["skip"] + 1, len(meas["tok"])), "info",
            "%.0f (plan %.0f); MFU %.1f%% (plan %.1f%%)" % (meas["tps"], tps_pred, 100 * mfu, 100 * mfu_pred))
    r = meas["step"] / step_pred
    run.row("%s step time / predicted" % label, "ok" if abs(r - 1) <= STEP_GOAL else "FAIL",
            "%.2f (%.2f s vs %.2f s)" % (r, meas["step"], step_pred), "within %.0f%%" % (100 * STEP_GOAL))
    # the measured peak is the runtime's allocations: against the plan's
    # (predicted.alloc_bytes: the peak less the CUDA context, the cuBLAS
    # workspace and the allocator allowance), the peak itself in older plans
    alloc = plan["predicted"].get("alloc_bytes", peak)
    for t in ("gpu", "cpu", "nvme"):
        got, want = meas["stats"]["peak_bytes"][t], alloc[t]
        q = got / want if want else float("inf") if got else 1.0
        extra = "; plan total %s" % gib(peak[t]) if peak[t] != alloc[t] else ""
        run.row("%s peak %s / plan allocations" % (label, t), "ok" if abs(q - 1) <= PEAK_GOAL else "FAIL",
                "%.3f (%s vs %s%s)" % (q, gib(got), gib(want), extra), "within %.0f%%" % (100 * PEAK_GOAL))


def profile_row(run, label, meas):
    """train --profile's five longest rows as one row: op, shape, ms per step (% of the step, TFLOP/s
    or GB/s), then the streams' busy time and what the host thread waited on, so that the summary
    says where the step's time went. On the CPU backend the row checks
    that the profile is there."""
    prof = meas["stats"].get("profile") or {}
    ops = prof.get("ops") or []
    check = "%s: where the step goes (train --profile)" % label
    if not ops:
        run.row(check, "FAIL", "no \"profile\" in the stats file")
        return
    def one(o):
        rate = " %.0f TFLOP/s" % o["tflops"] if "tflops" in o else " %.1f GB/s" % o["gbps"] if "gbps" in o else ""
        shape = " " + o["shape"] if o["shape"] else ""
        return "%s%s %.1f ms (%.0f%%%s)" % (o["op"], shape, o["ms_per_step"], o["percent_of_step"], rate)
    def busy(key):  # a stats object of ms per step, the largest first, zeros left out
        d = sorted(((k, v) for k, v in (prof.get(key) or {}).items() if v > 0), key=lambda kv: -kv[1])
        return ", ".join("%s %.1f" % kv for kv in d) or "-"
    run.row(check, "info" if run.cuda else "ok", "step %.0f ms; the 5 longest of %d rows: %s; streams busy (ms): %s; "
            "host thread (ms): %s" % (prof.get("step_ms", 0), len(ops), "; ".join(one(o) for o in ops[:5]),
                                      busy("streams_busy_ms_per_step"), busy("host_ms_per_step")))


def check_and_run(run, label, plan, path, hw_args, name):
    """`train --check-plan` of the plan against --model, then its run: on CUDA the plan itself, on the
    CPU backend the same configuration planned for the tiny LLaMA. (path, model, measurement) of the
    run, the measurement None when it did not run. The QLoRA run is profiled (train --profile):
    its table goes to the log, its five longest ops to a row."""
    a = run.a
    if not train_check_plan(run, path, a.model, plan, label):
        return path, a.model, None
    model = a.model
    if not run.cuda:
        plan, path = tiny_plan(run, plan, hw_args, name)
        if not plan:
            return path, TINY, None
        model = TINY
    profile = name == "qlora"
    meas = train_plan(run, label, path, plan, model, a.steps if run.cuda else 2, 1 if run.cuda else 0,
                      profile=profile)
    if meas:
        report(run, label if run.cuda else "tiny LLaMA, %s" % name, plan, meas)
        if profile:
            profile_row(run, label if run.cuda else "tiny LLaMA, %s" % name, meas)
    return path, model, meas


def run_full(run, m, hw_args):
    """Full fine-tuning of the 13B from its three-way plan: (plan path, model, measurement) or None."""
    made = full_plan(run, m, hw_args)
    if not made:
        return None
    plan, source, path = made
    g, c, n = shares(plan)
    ok = g > 0 and c > 0 and n > 0 and abs(g + c + n - 1) < 1e-6
    run.row("plan: optimizer over GPU, CPU and NVMe (%s)" % source, "ok" if ok else "FAIL",
            "gpu %.2f cpu %.2f nvme %.2f" % (g, c, n), "all three > 0")
    if not check_fits(run, "13B", plan, m) or not ok:
        return None
    return check_and_run(run, "13B", plan, path, hw_args, "full")


def run_full8(run, m, hw_args):
    """Full fine-tuning of the 13B with 8-bit AdamW state (m and v block-wise 8-bit, the fp32 master:
    6 B/param, not 12): memplan plan's best for --optim adamw8bit, which fits the GPU and the host
    without the disk (an H100's 79 GiB and 113 GiB of host memory: about 2.7 s a step where the
    32-bit state's NVMe share makes it about 140 s)."""
    a = run.a
    common = ["--model", a.model, "--seq", a.seq, "--dtype", "bf16", "--grad-dtype", "fp32", "--optim", "adamw8bit"]
    path = os.path.join(a.workdir, "plan13b-8bit.json")
    plan = memplan_plan(run, hw_args, common, path)
    if not plan:
        run.row("8-bit AdamW plan (memplan plan --optim adamw8bit)", "FAIL", "nothing fits")
        return None
    tr = plan["training"]
    run.row("8-bit AdamW plan (memplan plan --optim adamw8bit)", "info",
            "m, v %s, master %s; optimizer gpu %.2f cpu %.2f nvme %.2f; weights %s, recompute %s, schedule %s" % (
                tr["optim_dtype"], tr["master"], *shares(plan), plan["placement"]["params"], tr["recompute"],
                tr["optimizer_schedule"]))
    if check_fits(run, "13B 8-bit AdamW", plan, m):
        return check_and_run(run, "13B 8-bit AdamW", plan, path, hw_args, "full8")
    return None


def run_qlora(run, m, hw_args):
    """QLoRA of the 13B: memplan plan's best for an NF4 base with LoRA r on every linear layer."""
    a = run.a
    common = ["--model", a.model, "--seq", a.seq, "--dtype", "bf16"]
    path = os.path.join(a.workdir, "plan13b-qlora.json")
    plan = memplan_plan(run, hw_args, common, path, "--lora", a.lora_r, "--lora-targets", a.lora_targets, "--qlora")
    if not plan:
        run.row("QLoRA plan (memplan plan)", "FAIL", "nothing fits")
        return
    pl = plan["placement"]
    run.row("QLoRA plan (memplan plan)", "info",
            "r %d on %s; base %s, adapters %s, recompute %s, schedule %s" % (
                plan["training"]["lora"]["r"], plan["training"]["lora"]["targets"], pl["params"], pl["adapters"],
                plan["training"]["recompute"], plan["training"]["optimizer_schedule"]))
    if check_fits(run, "QLoRA 13B", plan, m):
        check_and_run(run, "QLoRA 13B", plan, path, hw_args, "qlora")


# ---- the optimizer schedules --------------------------------------------------------------------

def schedule_plan(run, path, sched):
    """The plan at `path` with the optimizer schedule `sched` (dpu after one serial step) and memplan's
    estimate of it: (plan path, plan, report)."""
    plan = load(path)
    plan["training"]["optimizer_schedule"] = sched
    if sched == "dpu":
        plan["training"]["dpu_warmup"] = 1
    stem = os.path.splitext(path)[0]
    src, out = "%s-%s-in.json" % (stem, sched), "%s-%s.json" % (stem, sched)
    with open(src, "w") as f:
        json.dump(plan, f, indent=1)
    r = run.memplan("estimate", "--plan", src, "--plan-out", out, "--json", ok=(0, 1))
    return out, load(out), json.loads(r.stdout)


def compare_schedules(run, label, path, model, steps, done=None):
    """The plan at `path` trained under each schedule: measured step against memplan's, a table in
    the log and a row per schedule (goal within 15% on CUDA; on the CPU backend the schedule ran as
    asked, the ratios figures only); then the schedule furthest from its prediction profiled, a row
    of where its step went. `done`: a measurement of the plan already made (its schedule)."""
    res = {}
    gpu_share = shares(load(path))[0]
    for s in SCHEDULES:
        if s == "dpu" and gpu_share > 0:  # memplan and offload_init refuse it: that share cannot wait a step
            run.row("%s schedule %s" % (label, s), "skip", "dpu takes no optimizer share on the device; "
                    "this plan has gpu %.2f" % gpu_share)
            continue
        spath, plan, rep = schedule_plan(run, path, s)
        pred, serial = rep["time"]["step_s"], rep["time"]["schedule"]["serial_step_s"]
        if not rep["fits"]:
            run.row("%s schedule %s" % (label, s), "skip", "does not fit: %s" % rep.get("shortfall", "?"))
            continue
        if done and done["stats"]["optimizer"]["schedule"] == s:
            meas = done
        else:  # dpu: its first step is serial, the second has no update to wait for
            skip = 2 if s == "dpu" else 1
            # expect the setup and step of the first run, when one ran (the prediction is the GPU's
            # preset, this runtime's kernels are not)
            first = done or (res[next(iter(res))][2] if res else None)
            est = (first["setup"], max(pred, first["step"])) if first else None
            meas = train_plan(run, "%s %s" % (label, s), spath, plan, model, max(steps, skip + 2), skip, est,
                              optional=True)
        if meas:
            res[s] = (pred, serial, meas)
    if not res:
        return
    base = res.get("serial")
    run.log("# %s: the optimizer schedules (plan %s)" % (label, path))
    run.log("#   %-8s %12s %12s %10s %12s %12s %10s" % ("schedule", "predicted s", "measured s", "meas/pred",
                                                         "meas/serial", "pred/serial", "beside"))
    for s, (pred, serial, meas) in res.items():
        st = meas["stats"]["optimizer"]
        ms = meas["step"] / base[2]["step"] if base else float("nan")
        run.log("#   %-8s %12.4g %12.4g %10.3f %12.3f %12.3f %9.0f%%" % (
            s, pred, meas["step"], meas["step"] / pred, ms, pred / serial, 100 * st["overlap_fraction"]))
        r = meas["step"] / pred
        fig = "%.2f (%.3g s vs %.3g s); / serial %s (plan %.2f); optimizer %.0f%% beside the device" % (
            r, meas["step"], pred, "%.2f" % ms if base else "-", pred / serial, 100 * st["overlap_fraction"])
        if st["schedule"] != s:
            run.row("%s schedule %s: step / predicted" % (label, s), "FAIL", "train ran schedule %s" % st["schedule"])
        elif run.cuda:
            run.row("%s schedule %s: step / predicted" % (label, s), "ok" if abs(r - 1) <= SCHEDULE_GOAL else "FAIL",
                    fig, "within %.0f%%" % (100 * SCHEDULE_GOAL))
        else:
            run.row("%s schedule %s ran (CPU backend)" % (label, s), "ok", fig)
    # the schedule furthest from its prediction once more under train --profile (not timed with
    # the others: the profile's events slow a step), while the time left holds it: where its step went
    worst = max(res, key=lambda k: abs(res[k][2]["step"] / res[k][0] - 1) if res[k][0] else 0)
    spath, plan = schedule_plan(run, path, worst)[:2]
    skip = 2 if worst == "dpu" else 1
    first = res[worst][2]
    meas = train_plan(run, "%s %s profiled" % (label, worst), spath, plan, model, skip + 2, skip,
                      (first["setup"], first["step"]), optional=True, profile=True)
    if meas:
        profile_row(run, "%s schedule %s" % (label, worst), meas)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_common_args(ap, "ZO_13B_", "llama-2-13b", 2048, 4, 4, "/tmp/zo-13b")
    env = os.environ.get
    ap.add_argument("--runs", default=env("ZO_13B_RUNS", ",".join(RUNS)),
                    help="which runs, in the order given (default qlora,full8,full,schedules); schedules "
                         "runs full first when it has not run")
    ap.add_argument("--lora-r", type=int, default=int(env("ZO_13B_LORA_R", "16")), help="QLoRA's rank (16)")
    ap.add_argument("--lora-targets", default=env("ZO_13B_LORA_TARGETS", "all-linear"))
    ap.add_argument("--min-nvme", type=float, default=float(env("ZO_13B_MIN_NVME", "0.1")),
                    help="smallest NVMe share of the optimizer in the full plan (default 0.1)")
    a = ap.parse_args()
    runs = [x for x in a.runs.split(",") if x]
    if not runs or any(x not in RUNS for x in runs):
        print("gpu_13b: --runs %s: expected some of %s" % (a.runs, ",".join(RUNS)), file=sys.stderr)
        return 2
    cuda = a.device.startswith("cuda")
    a.phase = a.phase or ("13b" if cuda else "plan13b")
    if a.calibrate is None:
        a.calibrate = cuda and not a.hw
    if not check_executables(a, "gpu_13b"):
        return 2
    os.makedirs(a.workdir, exist_ok=True)
    run = Run(a)

    m = describe(run)
    hw_args = hardware(run, m)
    full, done = None, False  # the full run's (plan path, model, measurement); whether it was tried
    for what in runs:
        if what == "qlora":
            run_qlora(run, m, hw_args)
        elif what == "full8":
            run_full8(run, m, hw_args)
        elif what == "full" or (what == "schedules" and not done):
            full, done = run_full(run, m, hw_args), True
        if what == "schedules":
            if full and full[2]:
                path, model, meas = full
                compare_schedules(run, "13B" if cuda else "tiny LLaMA", path, model, a.steps if cuda else 3, meas)
            else:  # the full run's row says why
                run.row("13B schedules", "skip", "the full run did not run: nothing to compare with")
    return 1 if run.failed else 0


def fail_row(who, phase_cpu, phase_gpu, e):
    """One line, no traceback; a FAIL row where --rows says."""
    print("%s: %s" % (who, e), file=sys.stderr)
    rows = next((sys.argv[i + 1] for i, x in enumerate(sys.argv[:-1]) if x == "--rows"), "")
    if rows:
        dev = next((sys.argv[i + 1] for i, x in enumerate(sys.argv[:-1]) if x == "--device"), "cuda")
        phase = next((sys.argv[i + 1] for i, x in enumerate(sys.argv[:-1]) if x == "--phase"),
                     phase_cpu if dev == "cpu" else phase_gpu)
        with open(rows, "a") as f:
            f.write("%s\t%s\tFAIL\t%s\t\n" % (phase, who, str(e).replace("\t", " ")[:200]))
    return 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError, KeyError) as e:  # one line, no traceback
        sys.exit(fail_row("gpu_13b.py", "plan13b", "13b", e))
