#!/usr/bin/env python3
"""torch_side_by_side: `train` against PyTorch on the same device, same model
shape, batch, sequence, data and AdamW settings (issue 18).

Per model (default on CUDA: GPT-2 small and a 1.3B LLaMA, bf16, batch 8 x 1024):
  ours resident   train --params gpu --optimizer gpu (everything on the GPU)
  torch eager     fp32 parameters, bf16 autocast, AdamW(fused=True)
  ours streamed   train --params cpu --optimizer cpu (weights streamed, CPU AdamW;
                  --schedule overlap: the update beside the device's work, serial's
                  results bit for bit; --streamed-schedule changes it)
  torch FSDP      one rank, CPUOffload(offload_params=True), bf16 MixedPrecision
  torch compile   the eager model under torch.compile, where it runs
  ours resident g16  (not in the default list: --contenders ...,ours-resident-g16)
                  ours resident under ZO_ATTENTION_GRADS=16bit: the attention
                  backward at PyTorch's own precision (P, dS, dO rounded once
                  to bf16, as its fused attention does; docs/gpu-cuda.md)
Each contender runs in a process of its own, in that (alternating) order; the
figure is the median tokens/s of the steps after the warm-up ones. The ratios
come last: ours resident / eager (goal >= 1) and ours streamed / FSDP CPU
offload (goal >= 1.5). The rows (--rows) are written as they are made: a
contender's when it ends, a model's ratios when its contenders have run, so
a run stopped at a time limit keeps what it measured.

Then, after every model's timed runs and while the time left holds it
(--profile-steps, 0: none), ours resident and ours streamed of each model
run once more under `train --profile` (the profile's events slow a step, so
these runs are not timed with the others): the table goes to the log, and a
row per run says where the step went: the step's ms, the ops' totals by
kind, the streams' busy time and (streamed) what the host thread waited on.

The PyTorch model is plain torch built from the shape memplan reports for the
same --model (`memplan estimate --json`, the `model` object), and its
parameter count must equal memplan's exact count (checked before anything
runs; --shapes-only checks GPT-2, the 1.3B LLaMA and LLaMA-2-13B on the meta
device and exits). --device cpu --tiny is the smoke test ctest runs: the tiny
GPT-2 and LLaMA of tests/fixtures/gpu on the CPU backend against CPU torch.

Exit: 0 every contender ran (FSDP and compile may be unavailable on CPU),
1 one failed or a check did not hold, 2 bad usage, 77 no torch here.
Goals met or missed are rows in --rows (scripts/gpu-check.sh's summary).
"""
import argparse
import array
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HYPER = dict(lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip=1.0)  # train's defaults

MODELS = {  # name: memplan/train --model, batch, seq, steps, warm-up steps
    "gpt2": dict(model="gpt2", batch=8, seq=1024, steps=12, warmup=3),
    "llama-1.3b": dict(model=os.path.join(ROOT, "bench/configs/llama-1.3b.json"), batch=8, seq=1024,
                       steps=8, warmup=3),
}
TINY = {
    "tiny-gpt2": dict(model=os.path.join(ROOT, "tests/fixtures/gpu/tiny_gpt2.json"), batch=2, seq=16,
                      steps=4, warmup=1),
    "tiny-llama": dict(model=os.path.join(ROOT, "tests/fixtures/gpu/tiny_llama.json"), batch=2, seq=32,
                       steps=4, warmup=1),
}
SHAPES = ["gpt2", os.path.join(ROOT, "bench/configs/llama-1.3b.json"), "llama-2-13b"]
CONTENDERS = ["ours-resident", "torch-eager", "ours-streamed", "torch-fsdp-offload", "torch-compile"]
CAP_S = {"ours-resident": 240, "torch-eager": 150, "ours-streamed": 300, "torch-fsdp-offload": 300,
         "torch-compile": 300, "ours-resident-g16": 240}


def log(msg):
    print(msg, flush=True)


# ---- the model in plain torch ---------------------------------------------------------

def build_model(m, device, dtype=None):
    """A GPT-2 or LLaMA transformer with the shape of memplan's `model` object."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    gpt = m["arch"] == "gpt"
    L, h, nh, kvh, hd = m["layers"], m["hidden"], m["heads"], m["kv_heads"], m["head_dim"]
    ffn, V, S = m["ffn"], m["vocab"], m["max_seq"]
    q_dim, kv_dim = nh * hd, kvh * hd
    kw = dict(device=device, dtype=dtype)
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h, **kw))
            self.bias = nn.Parameter(torch.zeros(h, **kw)) if m["norm_bias"] else None

        def forward(self, x):
            y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + m["norm_eps"])
            y = y.to(x.dtype) * self.weight.to(x.dtype)
            return y + self.bias.to(x.dtype) if self.bias is not None else y

    def norm():
        if not gpt:
            return RMSNorm()
        ln = nn.LayerNorm(h, eps=m["norm_eps"], **kw)
        if not m["norm_bias"]:
            ln.bias = None
        return ln

    def rope(x, pos):  # x: (B, heads, T, hd), rotate-half form
        half = hd // 2
        inv = 1.0 / (m["rope_theta"] ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
        ang = pos[:, None].float() * inv[None, :]
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = norm(), norm()
            self.qkv = nn.Linear(h, q_dim + 2 * kv_dim, bias=m["attn_bias"], **kw)
            self.o = nn.Linear(q_dim, h, bias=m["out_bias"], **kw)
            if gpt:
                self.up = nn.Linear(h, ffn, bias=m["out_bias"], **kw)
            else:
                self.gate = nn.Linear(h, ffn, bias=m["out_bias"], **kw)
                self.up = nn.Linear(h, ffn, bias=m["out_bias"], **kw)
            self.down = nn.Linear(ffn, h, bias=m["out_bias"], **kw)

        def attn(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(x).split([q_dim, kv_dim, kv_dim], dim=-1)
            q = q.view(B, T, nh, hd).transpose(1, 2)
            k = k.view(B, T, kvh, hd).transpose(1, 2)
            v = v.view(B, T, kvh, hd).transpose(1, 2)
            if not gpt:
                pos = torch.arange(T, device=x.device)
                q, k = rope(q, pos), rope(k, pos)
            if kvh != nh:
                k = k.repeat_interleave(nh // kvh, dim=1)
                v = v.repeat_interleave(nh // kvh, dim=1)
            if sdpa is not None:
                y = sdpa(q, k, v, is_causal=True)
            else:  # torch < 2.0
                s = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
                y = s.masked_fill(mask, float("-inf")).softmax(-1).to(v.dtype) @ v
            return self.o(y.transpose(1, 2).reshape(B, T, q_dim))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            z = self.ln2(x)
            if gpt:
                z = F.gelu(self.up(z), approximate="tanh")
            else:
                z = F.silu(self.gate(z)) * self.up(z)
            return x + self.down(z)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, h, **kw)
            self.wpe = nn.Embedding(S, h, **kw) if gpt else None
            self.blocks = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = norm()
            self.head = None if m["tied_embeddings"] else nn.Linear(h, V, bias=False, **kw)

        def forward(self, idx):
            x = self.wte(idx)
            if self.wpe is not None:
                x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in self.blocks:
                x = b(x)
            x = self.ln_f(x)
            return F.linear(x, self.wte.weight if self.head is None else self.head.weight)

    model = Model()
    model.block_class = Block
    return model


def init_weights(model, n_layers):
    import torch
    proj = 0.02 / math.sqrt(2 * max(n_layers, 1))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                p.normal_(0.0, proj if name.endswith(("o.weight", "down.weight")) else 0.02)


def param_groups(model, wd):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": other, "weight_decay": 0.0}]


def count_params(model):
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


# ---- data: the sequential batches of train ----------------------------------------

def write_tokens(path, vocab, n, seed=1234):
    import random
    rng = random.Random(seed)
    arr = array.array("H", (rng.randrange(vocab) for _ in range(n)))
    with open(path, "wb") as f:
        f.write(arr.tobytes())


def read_tokens(path):
    arr = array.array("H")
    with open(path, "rb") as f:
        arr.frombytes(f.read())
    return arr


def batch(tokens, step, B, S):
    """train's batches: row i of step k starts at ((k*B + i) * S) mod (N - S - 1)."""
    n = len(tokens)
    xs, ys = [], []
    for i in range(B):
        s = ((step * B + i) * S) % (n - S - 1)
        xs.append(tokens[s:s + S].tolist())
        ys.append(tokens[s + 1:s + S + 1].tolist())
    return xs, ys


# ---- workers: one PyTorch contender per process ---------------------------------------

def worker(spec):
    import torch
    import torch.nn.functional as F
    kind, m, dev_name = spec["kind"], spec["model"], spec["device"]
    B, S, steps = spec["batch"], spec["seq"], spec["steps"]
    cuda = dev_name.startswith("cuda")
    dev = torch.device(dev_name)
    if cuda and dev.index is None:
        dev = torch.device("cuda", 0)
    torch.manual_seed(1)
    tokens = read_tokens(spec["data"])
    H = HYPER
    bf16 = torch.bfloat16
    fsdp = None

    if kind == "fsdp":
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.setdefault("MASTER_PORT", str(s.getsockname()[1]))
        dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
        if cuda:
            torch.cuda.set_device(dev)
        model = build_model(m, "cpu")
        init_weights(model, m["layers"])
        block = model.block_class
        try:  # FSDP1: the API the issue names
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, CPUOffload, MixedPrecision
            try:
                from torch.distributed.fsdp.wrap import ModuleWrapPolicy
                wrap = ModuleWrapPolicy({block})
            except ImportError:  # torch < 2.1
                import functools
                from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
                wrap = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={block})
            extra = {"device_id": dev} if cuda else {}
            model = FSDP(model, auto_wrap_policy=wrap, cpu_offload=CPUOffload(offload_params=True),
                         mixed_precision=MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16),
                         use_orig_params=True, **extra)
            fsdp = "FSDP1 CPUOffload(offload_params=True)"
        except Exception as e1:  # FSDP2 where FSDP1 is gone
            from torch.distributed.fsdp import fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy
            mp = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=torch.float32)
            for b in model.blocks:
                fully_shard(b, mp_policy=mp, offload_policy=CPUOffloadPolicy())
            fully_shard(model, mp_policy=mp, offload_policy=CPUOffloadPolicy())
            fsdp = "FSDP2 CPUOffloadPolicy (FSDP1: %s)" % str(e1).splitlines()[0][:80]
        try:  # the parameters are on the CPU: fused CPU AdamW where torch has it
            opt = torch.optim.AdamW(param_groups(model, H["weight_decay"]), lr=H["lr"],
                                    betas=(H["beta1"], H["beta2"]), eps=H["eps"], fused=True)
            fsdp += ", AdamW fused on CPU"
        except Exception:
            opt = torch.optim.AdamW(param_groups(model, H["weight_decay"]), lr=H["lr"],
                                    betas=(H["beta1"], H["beta2"]), eps=H["eps"])
    else:
        model = build_model(m, dev)
        init_weights(model, m["layers"])
        kw = {"fused": True} if cuda else {}
        opt = torch.optim.AdamW(param_groups(model, H["weight_decay"]), lr=H["lr"],
                                betas=(H["beta1"], H["beta2"]), eps=H["eps"], **kw)
        if kind == "compile":
            if not hasattr(torch, "compile"):
                print("torch.compile is not in torch %s" % torch.__version__, file=sys.stderr)
                return 1
            model = torch.compile(model)

    def clip():
        if hasattr(model, "clip_grad_norm_"):
            return model.clip_grad_norm_(H["clip"])
        return torch.nn.utils.clip_grad_norm_(model.parameters(), H["clip"])

    print("INFO " + json.dumps({"kind": kind, "torch": torch.__version__, "fsdp": fsdp,
                                "params": count_params(model)}), flush=True)
    amp = kind != "fsdp"  # FSDP's MixedPrecision casts the parameters itself
    for step in range(steps):
        xs, ys = batch(tokens, step, B, S)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        x = torch.tensor(xs, dtype=torch.long, device=dev)
        y = torch.tensor(ys, dtype=torch.long, device=dev)
        if amp:
            with torch.autocast(device_type=dev.type, dtype=bf16):
                logits = model(x)
        else:
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        loss.backward()
        clip()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = loss.item()  # waits for the device, as train reads its loss
        dt = time.perf_counter() - t0
        mem = torch.cuda.max_memory_allocated(dev) if cuda else 0
        print("STEP " + json.dumps({"step": step, "loss": lv, "tok_s": B * S / dt, "mem": mem}), flush=True)
    if kind == "fsdp":
        import torch.distributed as dist
        dist.destroy_process_group()
    return 0


# ---- the parent: contenders, table, ratios -----------------------------------------

def memplan_model(memplan, model, seq, batch_):
    r = subprocess.run([memplan, "estimate", "--model", model, "--seq", str(seq), "--micro-batch", str(batch_),
                        "--json"], capture_output=True, text=True)
    if r.returncode not in (0, 1) or not r.stdout.strip():
        raise RuntimeError("memplan estimate --model %s: exit %d: %s" % (model, r.returncode, r.stderr.strip()))
    return json.loads(r.stdout)


def ours_cmd(args, name, cfg, data, steps):
    """train's command line for ours-resident or ours-streamed."""
    cmd = [args.train, "--model", cfg["model"], "--data", data, "--device", args.device, "--dtype", "bf16",
           "--micro-batch", str(cfg["batch"]), "--seq", str(cfg["seq"]), "--steps", str(steps),
           "--recompute", "none", "--checkpoints", "gpu"]
    return cmd + (["--params", "gpu", "--optimizer", "gpu"] if name.startswith("ours-resident") else
                  ["--params", "cpu", "--optimizer", "cpu", "--prefetch", "2", "--schedule", args.streamed_schedule])


def run_contender(args, name, cfg, m, data, limit):
    """Returns dict(ok, tok_s list, loss list, note)."""
    B, S, steps = cfg["batch"], cfg["seq"], cfg["steps"]
    if name.startswith("ours"):
        cmd = ours_cmd(args, name, cfg, data, steps)
    else:
        kind = name.split("-")[1]
        spec = dict(kind=kind, model=m, device=args.device, batch=B, seq=S, steps=steps, data=data)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    res = dict(ok=False, tok_s=[], loss=[], mem=0, note="", cmd=" ".join(cmd[:12]))
    log("## %s: %s" % (name, " ".join(cmd) if name.startswith("ours") else "worker " + name))
    t0 = time.time()
    env = dict(os.environ, ZO_ATTENTION_GRADS="16bit") if name == "ours-resident-g16" else None
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        for line in out.splitlines():
            log("   " + line)
        res["note"] = "stopped at its %d s limit" % limit
        return res
    for line in (r.stdout + r.stderr).splitlines():
        log("   " + line)
        if name.startswith("ours"):
            w = line.split()
            # train's step line: "step K loss L lr X norm N tok/s T mem ..." (named fields)
            if len(w) >= 4 and w[0] == "step" and w[2] == "loss" and "tok/s" in w[:-1]:
                res["loss"].append(float(w[3]))
                res["tok_s"].append(float(w[w.index("tok/s") + 1]))
        elif line.startswith("STEP "):
            d = json.loads(line[5:])
            res["loss"].append(d["loss"])
            res["tok_s"].append(d["tok_s"])
            res["mem"] = max(res["mem"], d["mem"])
        elif line.startswith("INFO "):
            d = json.loads(line[5:])
            if d.get("fsdp"):
                res["note"] = d["fsdp"]
            if d["kind"] == "eager" and d["params"] != m["params"]:
                res["note"] = "parameter count %d != memplan's %d" % (d["params"], m["params"])
                return res
    if r.returncode != 0 or len(res["tok_s"]) < steps:
        tail = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()][-1:] or ["no output"]
        res["note"] = "exit %d after %d steps: %s" % (r.returncode, len(res["tok_s"]), tail[0][:160])
        return res
    res["ok"] = True
    res["secs"] = time.time() - t0
    return res


def profile_run(args, name, model, cfg, data, limit):
    """ours-resident or ours-streamed once more under train --profile (--profile-steps steps): its
    table to the log, and a row of where the step went (from --stats-json's "profile"). False when the
    run failed or left no profile."""
    stats = os.path.join(args.workdir, "profile-%s-%s.json" % (model, name))
    if os.path.exists(stats):
        os.remove(stats)
    cmd = ours_cmd(args, name, cfg, data, args.profile_steps) + ["--profile", "--stats-json", stats]
    check = "%s %s: where the step goes (train --profile, %d steps)" % (model, name, args.profile_steps)
    log("## %s, profiled: %s" % (name, " ".join(cmd)))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        row(args.rows, check, "skip", "stopped at its %d s limit" % limit)
        return True
    for line in (r.stdout + r.stderr).splitlines():
        if line.startswith("# profile:") or r.returncode != 0:
            log("   " + line)
    prof = {}
    if r.returncode == 0 and os.path.exists(stats):
        with open(stats) as f:
            prof = json.load(f).get("profile") or {}
    if not prof.get("ops"):
        row(args.rows, check, "FAIL", "exit %d, no \"profile\" in %s" % (r.returncode, stats))
        return False
    def top(d, n):
        return ", ".join("%s %.1f" % kv for kv in sorted(d.items(), key=lambda kv: -kv[1])[:n])
    text = "step %.1f ms; by op (ms): %s; streams busy (ms): %s" % (
        prof.get("step_ms", 0), top(prof.get("by_op_ms_per_step") or {}, 6),
        top(prof.get("streams_busy_ms_per_step") or {}, 4))
    host = {k: v for k, v in (prof.get("host_ms_per_step") or {}).items() if v > 0}
    if name == "ours-streamed" and host:
        text += "; host thread (ms): %s" % top(host, 5)
    row(args.rows, check, "info", text)
    return True


def median_after(xs, warm):
    rest = xs[warm:] if len(xs) > warm else xs
    return statistics.median(rest) if rest else 0.0


def row(rows, check, status, figure, goal=""):
    if rows:
        with open(rows, "a") as f:
            f.write("torch\t%s\t%s\t%s\t%s\n" % (check, status, figure, goal))


def check_shapes(args, names):
    """Each torch model on the meta device has memplan's exact parameter count."""
    import torch
    bad = 0
    for name in names:
        m = memplan_model(args.memplan, name, 8, 1)["model"]
        n = count_params(build_model(m, torch.device("meta")))
        ok = n == m["params"]
        bad += not ok
        log("shape %-40s torch %14d  memplan %14d  %s" % (os.path.basename(name), n, m["params"],
                                                          "ok" if ok else "MISMATCH"))
        row(args.rows, "shape %s: torch params = memplan's" % os.path.basename(name),
            "ok" if ok else "FAIL", "%d vs %d" % (n, m["params"]))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--train", default=os.path.join(ROOT, "build-gpu/examples/train"))
    ap.add_argument("--memplan", default=os.path.join(ROOT, "build-gpu/planner/memplan"))
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--models", default=os.environ.get("ZO_TORCH_MODELS", ""),
                    help="comma-separated: gpt2, llama-1.3b (default both; --tiny: tiny-gpt2, tiny-llama)")
    ap.add_argument("--tiny", action="store_true", help="the tiny fixture models (the CPU smoke test)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--steps", type=int, default=0, help="steps per contender (default per model)")
    ap.add_argument("--streamed-schedule", default="overlap", choices=["serial", "overlap", "dpu"],
                    help="train --schedule of ours-streamed (default overlap: serial's results bit for bit)")
    ap.add_argument("--profile-steps", type=int, default=4,
                    help="steps of the profiled runs of ours after the timed ones (0: none; default 4)")
    ap.add_argument("--workdir", default="/tmp/zo-torch-side-by-side")
    ap.add_argument("--rows", default="", help="append summary rows (tab-separated) to this file")
    ap.add_argument("--time-limit", type=float, default=3600, help="seconds for everything")
    ap.add_argument("--shapes-only", action="store_true", help="check the parameter counts and exit")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        return worker(json.loads(args.worker))
    try:
        import torch
    except ImportError:
        print("skipped: %s cannot import torch" % sys.executable)
        return 77
    t_end = time.time() + args.time_limit
    for exe in (args.train, args.memplan):
        if not os.access(exe, os.X_OK):
            print("torch_side_by_side: %s is not an executable (build first)" % exe, file=sys.stderr)
            return 2
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("torch_side_by_side: --device %s: torch sees no CUDA device" % args.device, file=sys.stderr)
        return 2
    log("# torch_side_by_side: torch %s, device %s%s, python %s" % (
        torch.__version__, args.device, " (%s)" % torch.cuda.get_device_name(0) if cuda else "",
        sys.executable))

    bad = check_shapes(args, SHAPES + ([TINY[k]["model"] for k in TINY] if args.tiny else []))
    if args.shapes_only or bad:
        return 1 if bad else 0

    table = TINY if args.tiny else MODELS
    names = [n for n in (args.models.split(",") if args.models else table) if n]
    for n in names:
        if n not in table:
            print("torch_side_by_side: unknown model %s (%s)" % (n, ", ".join(table)), file=sys.stderr)
            return 2
    contenders = [c for c in args.contenders.split(",") if c]
    for c in contenders:
        if c not in CAP_S:
            print("torch_side_by_side: --contenders: unknown %s (%s)" % (c, ", ".join(CAP_S)), file=sys.stderr)
            return 2
    os.makedirs(args.workdir, exist_ok=True)
    results = {}
    failed = 0
    last = []
    datas = {}
    for name in names:
        cfg = dict(table[name])
        if args.steps:
            cfg["steps"] = args.steps
        m = memplan_model(args.memplan, cfg["model"], cfg["seq"], cfg["batch"])
        data = os.path.join(args.workdir, "tokens-%d.bin" % m["model"]["vocab"])
        need = cfg["batch"] * cfg["seq"] * (cfg["steps"] + 1) + cfg["seq"] + 2
        if not os.path.exists(data) or os.path.getsize(data) < 2 * need:
            write_tokens(data, m["model"]["vocab"], need)
        for c in contenders:
            left = t_end - time.time()
            limit = int(min(CAP_S[c] if cuda else 120, left - 10))
            if limit < 20:
                results[(name, c)] = dict(ok=False, tok_s=[], loss=[], note="not run: out of time")
                continue
            results[(name, c)] = r = run_contender(args, c, cfg, m["model"], data, limit)
            r["median"] = median_after(r["tok_s"], cfg["warmup"])
            r["flops_tok"] = m["time"]["model_flops"] / (cfg["batch"] * cfg["seq"] * m["config"]["grad_accum"])
            optional = c in ("torch-compile", "torch-fsdp-offload") and not cuda
            if not r["ok"] and not optional and c != "torch-compile":
                failed = 1
            # sanity: a random model's first loss is near ln(vocab) on both sides
            if r["ok"] and r["loss"]:
                l0, lnv = r["loss"][0], math.log(m["model"]["vocab"])
                if abs(l0 - lnv) > 0.25 * lnv:
                    r["note"] += " first loss %.3f far from ln(vocab) %.3f" % (l0, lnv)
                    r["ok"] = False
                    failed = 1
            status = "ok" if r["ok"] else ("skip" if c == "torch-compile" or not cuda else "FAIL")
            row(args.rows, "%s %s tokens/s (B %d x S %d, bf16)" % (name, c, cfg["batch"], cfg["seq"]),
                "info" if r["ok"] else status, ("%.0f" % r["median"]) if r["ok"] else (r["note"] or "failed"))
        last += ratios(args, results, name, cuda)
        datas[name] = (cfg, data)
    # the profiled runs after every model's timed ones, which come first when time is short
    for name in names:
        cfg, data = datas[name]
        for c in ("ours-resident", "ours-streamed") if args.profile_steps > 0 else ():
            if c not in contenders or not results[(name, c)]["ok"]:
                continue
            left = t_end - time.time()
            limit = int(min(90 if cuda else 60, left - 10))
            if limit < 20:
                row(args.rows, "%s %s: where the step goes (train --profile, %d steps)" % (
                    name, c, args.profile_steps), "skip", "not run: out of time")
                continue
            if not profile_run(args, c, name, cfg, data, limit):
                failed = 1

    # ---- the table, then the ratios -------------------------------------------------
    log("")
    log("%-11s %-20s %12s %9s %10s  %s" % ("model", "contender", "tokens/s", "TFLOP/s", "loss 0", "note"))
    for (name, c), r in results.items():
        if r["ok"]:
            log("%-11s %-20s %12.0f %9.1f %10.4f  %s" % (name, c, r["median"], r["median"] * r["flops_tok"] / 1e12,
                                                     r["loss"][0], r["note"]))
        else:
            log("%-11s %-20s %12s %9s %10s  %s" % (name, c, "-", "-", "-", r["note"] or "failed"))
    log("")
    log("ratios (tokens/s, ours over PyTorch; > 1: ours faster)")
    for line in last:
        log(line[1])
    log("side by side: " + ("; ".join(x[0] for x in last if x[0]) if any(x[0] for x in last) else "no ratio"))
    return failed


PAIRS = [("ours-resident", "torch-eager", 1.0), ("ours-resident-g16", "torch-eager", None),
         ("ours-resident", "torch-compile", None),
         ("ours-streamed", "torch-fsdp-offload", 1.5)]


def ratios(args, results, name, cuda):
    """One model's ratios, ours over PyTorch, each a row once its two contenders have run: a list of
    (short form for the last line or "", the table's line)."""
    out = []
    for a, b, goal in PAIRS:
        ra, rb = results.get((name, a)), results.get((name, b))
        if not ra or not rb:
            continue
        label = "%s: %s / %s" % (name, a, b)
        if ra["ok"] and rb["ok"] and rb["median"] > 0:
            v = ra["median"] / rb["median"]
            met = goal is None or v >= goal
            status = "info" if goal is None or not cuda else ("ok" if met else "FAIL")
            row(args.rows, label, status, "%.2f" % v, ">= %.1f" % goal if goal else "")
            out.append(("%s %.2f" % (label, v), "  %-50s %6.2f%s" % (label, v, "" if goal is None else
                                                                  "   (goal >= %.1f: %s)" % (
                                                                      goal, "met" if met else "MISSED"))))
        else:
            out.append(("", "  %-50s      -   (%s)" % (label, "; ".join(x["note"] for x in (ra, rb) if x["note"]))))
    return out


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError) as e:  # one line, no traceback
        print("torch_side_by_side: %s" % e, file=sys.stderr)
        sys.exit(1)
