#!/usr/bin/python3
"""test_generate_torch: `generate`'s greedy tokens against PyTorch's.

For a family (GPT-2, head size 64, tied head; LLaMA, head size 128, GQA), a
small model of the family's real head size is written as a Hugging Face
folder (config.json, model.safetensors), and two prompts of different lengths
go through `generate` as one batch, greedy, 32 new tokens each, fp32. The
reference is an independent greedy decode here: the float64 PyTorch models of
fixtures/gpu/make_fixtures.py (written after Hugging Face's modeling code,
sharing nothing with the C code) run over the whole sequence for every new
token, no cache, and take the argmax of the last position. The tokens must be
the same, for:

  resident   the weights on the device
  streamed   the weights in pinned host memory, streamed block by block into
             two device slots, the device's memory (--device-mem) three
             quarters of the model's weights: the same model resident there
             is refused (exit 1, naming the capacity)
  nvme       the weights read from NVMe block by block, the same device memory
  lora       a PEFT adapter directory written here (random A and B, B nonzero)
             over the resident base, and over the streamed base; the reference
             is make_lora_fixtures.py's forward, y = x W^T + b + (alpha/r)(x A^T) B^T
  qlora      the same adapters over an NF4 base (--qlora): the reference's base
             linear weights go through make_lora_fixtures.py's NF4 round trip
  eos        --eos set to a token the first prompt's decode reaches: each
             sequence stops at it (kept), as the reference's cut there

The smallest gap between PyTorch's two largest logits over every step is
printed: the tokens are compared where the choice is not a near tie.

Usage: test_generate_torch.py --generate PATH [--family NAME ...] [--workdir DIR]
Exit: 0 every check held, 1 one did not, 2 bad usage or generate failed where
it should not, 77 this python has no torch.
(ctest runs one family per test through tests/run_python.sh: test_generate_torch_*.)
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

try:
    import torch
except ImportError:
    print(f"skipped: {sys.executable} cannot import torch (apt-get install python3-torch)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fixtures", "gpu"))
sys.path.insert(0, os.path.join(HERE, "fixtures", "lora"))
import make_fixtures as mf  # noqa: E402  (the models, float64; the safetensors writer)
import make_lora_fixtures as mlf  # noqa: E402  (LoRA's forward and NF4, written after PEFT and the paper)

NEW = 32
PROMPT_LENS = (5, 11)

FAMILIES = {
    "gpt2": dict(
        seed=41,
        config={"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 6, "n_embd": 128,
                "n_head": 2, "n_positions": 128, "n_ctx": 128, "vocab_size": 128, "layer_norm_epsilon": 1e-5,
                "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                "eos_token_id": 127, "torch_dtype": "float32"},
        lora=dict(r=4, alpha=8.0, targets=["q", "v", "o", "up", "down"],
                  peft=["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"])),
    "llama": dict(
        seed=42,
        config={"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4,
                "hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
                "intermediate_size": 384, "vocab_size": 128, "max_position_embeddings": 128,
                "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                "tie_word_embeddings": False, "eos_token_id": 127, "torch_dtype": "float32"},
        lora=dict(r=8, alpha=16.0, targets=["q", "k", "v", "o", "gate", "up", "down"],
                  peft=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])),
}


# ---- the PyTorch side -------------------------------------------------------------------------

def greedy(fwd, prompts):
    """Each prompt's NEW greedy tokens (the whole sequence through the model for each), and the
    smallest gap between the two largest logits met; an end-of-sequence token is not special
    here: eos_token_id is set to one the prompts and the decode never reach (checked)."""
    outs, gap = [], math.inf
    with torch.no_grad():
        for p in prompts:
            ids = list(p)
            for _ in range(NEW):
                logits = fwd(torch.tensor([ids]))[0, -1]
                top = torch.topk(logits, 2).values
                gap = min(gap, float(top[0] - top[1]))
                ids.append(int(torch.argmax(logits)))
            outs.append(ids[len(p):])
    return outs, gap


def write_adapter(d, c, spec, params, g):
    """A PEFT adapter directory: adapter_config.json as PEFT writes it and random A, B
    (kaiming-uniform A as PEFT's init, B nonzero so that the adapters change the tokens)."""
    os.makedirs(d, exist_ok=True)
    gpt = c["model_type"] == "gpt2"
    W = mlf.linear_weights(c, params, 0)
    ad, tensors = {}, []
    for mod, peft in mlf.module_list(c, spec["targets"]):
        out_f, in_f = W[mod].shape
        A = (torch.rand(spec["r"], in_f, generator=g) * 2 - 1) / math.sqrt(in_f)
        Bm = 0.5 * torch.randn(out_f, spec["r"], generator=g) / math.sqrt(spec["r"])
        ad[mod] = (A, Bm)
        tensors += [(peft + ".lora_A.weight", A), (peft + ".lora_B.weight", Bm)]
    mf.write_safetensors(os.path.join(d, "adapter_model.safetensors"), tensors)
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec["r"], "lora_alpha": spec["alpha"],
                   "target_modules": spec["peft"], "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": gpt,
                   "base_model_name_or_path": None, "inference_mode": True}, f, indent=1)
    return ad


# ---- the generate side ------------------------------------------------------------------------

def run_generate(gen, d, prompts, extra):
    """generate's ids per prompt (--print-ids), its exit status and output."""
    cmd = [gen, "--model", os.path.join(d, "model"), "--dtype", "fp32", "--threads", "2",
           "--max-new-tokens", str(NEW), "--print-ids"]
    for p in prompts:
        cmd += ["--prompt-ids", ",".join(str(t) for t in p)]
    cmd += extra
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ids = [[int(t) for t in line.split()] for line in r.stdout.splitlines() if line.strip()]
    return ids, r.returncode, r.stdout + r.stderr, " ".join(cmd)


class Checks:
    def __init__(self):
        self.failed = 0

    def tokens(self, what, got, want):
        ok = got == want
        first = next((f"prompt {j}, token {k}: {g[k]} against {w[k]}" for j, (g, w) in enumerate(zip(got, want))
                      for k in range(min(len(g), len(w))) if g[k] != w[k]), "")
        print(f"  {what:<44} {'ok' if ok else 'MISMATCH ' + (first or f'{got} against {want}')}")
        self.failed += not ok

    def fact(self, what, ok):
        print(f"  {what}: {'ok' if ok else 'FAILED'}")
        self.failed += not ok


def check_family(gen, name, workdir):
    spec = FAMILIES[name]
    c = spec["config"]
    gpt = c["model_type"] == "gpt2"
    g = torch.Generator().manual_seed(spec["seed"])
    params = (mf.gpt2_params if gpt else mf.llama_params)(c, g, std=1.0)
    V = c["vocab_size"]
    prompts = [torch.randint(0, V - 1, (n,), generator=g).tolist() for n in PROMPT_LENS]
    d = os.path.join(workdir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "model"))
    os.makedirs(os.path.join(d, "nvme"))
    with open(os.path.join(d, "model", "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    mf.write_safetensors(os.path.join(d, "model", "model.safetensors"),
                         list(params.items()) + (mf.gpt2_buffers(c) if gpt else []))
    model_bytes = 4 * sum(v.numel() for v in params.values())
    cap = str(model_bytes * 3 // 4)
    ck = Checks()
    print(f"{name}: {model_bytes // 4} parameters ({model_bytes} bytes fp32), head size "
          f"{(c['n_embd'] // c['n_head']) if gpt else c['hidden_size'] // c['num_attention_heads']}, prompts of "
          f"{PROMPT_LENS} tokens, {NEW} new tokens each; device memory {cap} bytes where the weights stream")

    fwd = (lambda idx: mf.gpt2_forward(c, params, idx)) if gpt else (lambda idx: mf.llama_forward(c, params, idx))
    want, gap = greedy(fwd, prompts)
    ck.fact(f"the end-of-sequence id 127 is in no prompt or greedy decode (smallest top-2 logit gap {gap:.2e})",
            all(127 not in p for p in prompts + want))
    runs = [
        ("resident", ["--params-on", "gpu"]),
        ("streamed from host, prefetch 1", ["--params-on", "cpu", "--prefetch", "1", "--device-mem", cap]),
        ("streamed from host, prefetch 2", ["--params-on", "cpu", "--prefetch", "2"]),
        ("read from NVMe, prefetch 1", ["--params-on", "nvme", "--nvme-dir", os.path.join(d, "nvme"),
                                        "--prefetch", "1", "--device-mem", cap]),
    ]
    for what, extra in runs:
        got, rc, out, cmd = run_generate(gen, d, prompts, extra)
        if rc != 0:
            print(out)
            print(f"generate exited {rc}: {cmd}")
            return ck.failed + 1
        ck.tokens(what, got, want)
    # a sequence stops at its end-of-sequence token (--eos: the sixth token the first prompt gets),
    # which it keeps, the other going on to its own or to the count
    eos = want[0][5]
    cut = [w[: w.index(eos) + 1] if eos in w else w for w in want]
    got, rc, out, cmd = run_generate(gen, d, prompts, ["--eos", str(eos)])
    ck.fact(f"--eos {eos}: exit {rc}", rc == 0)
    ck.tokens(f"stopped at --eos {eos} ({[len(x) for x in cut]} tokens)", got, cut)
    # the device memory the streamed runs had holds no resident model
    _, rc, out, _ = run_generate(gen, d, prompts, ["--params-on", "gpu", "--device-mem", cap])
    ck.fact(f"resident in {cap} bytes of device memory is refused (exit {rc}, the capacity named)",
            rc == 1 and "capacity" in out)

    # adapters over the base, and over an NF4 base
    lspec = spec["lora"]
    adir = os.path.join(d, "adapter")
    ad = write_adapter(adir, c, lspec, params, g)
    s = lspec["alpha"] / lspec["r"]
    for nf4 in (0, 1):
        W = mlf.linear_weights(c, params, nf4)
        want_l, gap_l = greedy(lambda idx: mlf.forward(c, params, W, ad, s, idx), prompts)
        moved = want_l != want
        ck.fact(f"{'QLoRA' if nf4 else 'LoRA'} reference: the adapters change the tokens (top-2 gap {gap_l:.2e})",
                moved)
        for what, extra in [("resident base", []), ("streamed base", ["--params-on", "cpu", "--prefetch", "1"])]:
            if nf4 and extra:
                continue
            got, rc, out, cmd = run_generate(gen, d, prompts, ["--adapter", adir] + (["--qlora"] if nf4 else []) +
                                             extra)
            if rc != 0:
                print(out)
                print(f"generate exited {rc}: {cmd}")
                return ck.failed + 1
            ck.tokens(f"{'QLoRA' if nf4 else 'LoRA'} r {lspec['r']}, {what}", got, want_l)
    return ck.failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generate", required=True, help="the generate program")
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES), help="default: every family")
    ap.add_argument("--workdir", default="generate_torch", help="where the models and adapters go")
    a = ap.parse_args()
    torch.set_num_threads(1)
    failed = 0
    for name in a.family or FAMILIES:
        failed += check_family(a.generate, name, a.workdir)
    print(f"{failed} check(s) failed" if failed else "every check held")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
