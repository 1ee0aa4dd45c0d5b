#!/usr/bin/python3
"""test_generate_torch: `generate`'s greedy tokens against PyTorch's.

For a family (GPT-2, head size 64, tied head; LLaMA, head size 128, GQA; Granite, head size 64,
GQA, its four multipliers;
Qwen3, head size 128 with its q/k norms, GQA, tied, YaRN rope scaling; GPT-NeoX, head size 64,
16 rotary dimensions, parallel residual; Falcon, head size 64, multi-query with
one norm, or grouped kv heads with two; OPT, head size 64, learned positions
from row 2, ReLU; Phi, head size 80, 32 rotary dimensions, one norm, a biased
output layer; GPT-J, head size 64, 24 rotary dimensions interleaved in pairs, one
norm, a biased output layer; Cohere2, head size 64, GQA, layers over a window of 12 keys with
the interleaved rotary and global layers without rotary, whose keys are cached unturned; Phi-3
with longrope past its original length, crossed during the decode or by the prompt, against
greedy_longrope's decode, Hugging Face's rule written here; gpt-oss, head size 64, GQA, the sinks
in the cached attention, layers over a window of 12 keys and full ones, biased experts with the
clamped GLU, test_e2e_torch's reference), a
small model of the family's real head size is written as a Hugging Face
folder (config.json, model.safetensors), and two prompts of different lengths
go through `generate` as one batch, greedy, 32 new tokens each, fp32. The
reference is an independent greedy decode here: the float64 PyTorch models of
fixtures/gpu/make_fixtures.py (written after Hugging Face's modeling code,
sharing nothing with the C code) run over the whole sequence, no cache, and
take the argmax of each position: the model being causal, one forward of a
prompt and the resident run's tokens gives every step's logits, and those
tokens are the greedy decode where each position's argmax is the next one (a
decode that differs anywhere is redone token by token, a forward for every
new token, and so is what the tokens are compared with). The tokens must be
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

DeepSeek-V2 (latent attention) runs every case over its latent cache (generate's
default, kv_b_proj absorbed into the queries), and the resident run, LoRA's
resident run and QLoRA's again with --mla-cache full (every head's key and
value); --stats-json's kv_cache_bytes must be L x sequences x context x
(qk_rope + kv_lora_rank) x 4 under latent, 2 L x sequences x context x heads x
(qk_nope + qk_rope) x 4 under full.

For the mixtures of experts (Mixtral: 8 experts, 2 a token, renormalized;
Qwen2-MoE: 8 experts, 3 a token, norm_topk_prob false, a shared expert behind
its sigmoid gate; Qwen3-MoE: Qwen3's q/k norms, 8 experts, 2 a token,
renormalized; 4 layers, head size 128) the reference is test_e2e_torch.py's
float64 model written after Hugging Face's sparse MoE blocks (softmax over every
expert, the top k, each expert on its tokens), run the same way; its expert
choices must be clear of near ties. The same runs (resident, streamed, NVMe,
eos), and LoRA on the routed experts' projections and the attention's (PEFT's
names, the reference computing with W + scale B A), resident and streamed, and
QLoRA (the base's linear weights through the NF4 round trip, the router and the
shared expert's gate not).

The smallest gap between PyTorch's two largest logits over every step is
printed: the tokens are compared where the choice is not a near tie.

Usage: test_generate_torch.py --generate PATH [--family NAME ...] [--workdir DIR]
Exit: 0 every check held, 1 one did not, 2 bad usage or generate failed where
it should not, 77 this python has no torch.
(ctest runs one family per test through tests/run_python.sh, test_generate_torch_*, or a
few: test_generate_torch_gpt2 runs GPT-2, OPT, Phi and GPT-J.)
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
import test_e2e_torch as e2e  # noqa: E402  (the float64 MoE model after Hugging Face's, its adapters' merge)

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
    # Qwen3: the q/k norms before RoPE, so the cached keys are normed ones; head_dim 128 with q
    # (4 x 128) wider than hidden_size, GQA; a YaRN rope_scaling (Qwen3's long-context kind) whose
    # ramp at head 128 and rope_theta 1e6 runs from pair 4 to pair 14 of 64 (beta_fast 8, beta_slow
    # 1 over max_position_embeddings 128: pairs to 4 kept, from 14 divided by 2, blended between),
    # cos and sin times 0.1 ln 2 + 1: the cache is built from the same frequencies
    "qwen3": dict(
        seed=46,
        config={"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 4,
                "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
                "intermediate_size": 384, "vocab_size": 128, "max_position_embeddings": 128,
                "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "attention_bias": False,
                "use_sliding_window": False, "tie_word_embeddings": True, "eos_token_id": 127,
                "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 8.0},
                "torch_dtype": "float32"},
        lora=dict(r=8, alpha=16.0, targets=["q", "k", "v", "o", "gate", "up", "down"],
                  peft=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])),
    # Phi-3: fused qkv_proj and gate_up_proj, a window (24) the sequences (5 or 11 + 32) pass,
    # longrope within its original length (64: short_factor, cos and sin times
    # sqrt(1 + ln 2 / ln 64)); PEFT's fused adapters, named by our targets
    "phi3": dict(
        seed=52,
        config=dict(e2e.FAMILIES["phi3"]["config"], num_hidden_layers=4, hidden_size=256,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                    sliding_window=24, eos_token_id=127,
                    rope_scaling={"type": "longrope", "short_factor": [1 + (i % 4) / 4 for i in range(64)],
                                  "long_factor": [1 + i for i in range(64)]}),
        lora=dict(r=4, alpha=8.0, targets=["v", "o", "up", "down"],
                  peft=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])),
        # Phi-3 generating past its original length (24): short_factor while every position is within it,
    # then at the step whose longest sequence first holds 25 tokens (the 11-token prompt's 14th new
    # token; the 5-token one, at 19, follows the batch's longest) one forward over every token so far
    # with long_factor rebuilds the caches, long_factor from there on (greedy_longrope)
    "phi3_cross": dict(
        seed=93,
        config=dict(e2e.FAMILIES["phi3"]["config"], num_hidden_layers=4, hidden_size=256,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                    original_max_position_embeddings=24, sliding_window=24, eos_token_id=127,
                    rope_scaling={"type": "longrope", "short_factor": [1 + (i % 4) / 4 for i in range(64)],
                                  "long_factor": [1 + i for i in range(64)]}),
        lora=dict(r=4, alpha=8.0, targets=["v", "o", "up", "down"],
                  peft=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])),
    # Gemma: head_dim 256, one kv head, GeGLU, (1 + w) norms, the embedding times sqrt(hidden)
    "gemma": dict(
        seed=53,
        config=dict(e2e.FAMILIES["gemma"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                    eos_token_id=127),
        lora=dict(r=8, alpha=16.0, targets=["q", "k", "v", "o", "gate", "up", "down"],
                  peft=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])),
    # Gemma-2: Gemma's with the norms after attention and MLP, scores scaled and soft-capped
    # (they pass the cap of 5), the logits capped (greedy tokens do not see that cap: tanh keeps
    # the order), a window of 24 (the sequences, 5 or 11 + 32, pass it) on the even layers
    "gemma2": dict(
        seed=54,
        config=dict(e2e.FAMILIES["gemma2"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                    sliding_window=24, eos_token_id=127),
        scale={"model.embed_tokens.weight": 0.125},
        lora=dict(r=8, alpha=16.0, targets=["q", "k", "v", "o", "gate", "up", "down"],
                  peft=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])),
    # mixtures of experts, 4 layers so that the streamed runs' device memory (three quarters of
    # the weights) holds the two slots of whole MoE layers
    "mixtral": dict(
        seed=43, moe=True,
        config={"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_hidden_layers": 4,
                "hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
                "intermediate_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2,
                "vocab_size": 128, "max_position_embeddings": 128, "hidden_act": "silu",
                "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "sliding_window": None,
                "router_jitter_noise": 0.0, "tie_word_embeddings": False, "eos_token_id": 127,
                "torch_dtype": "float32"},
        lora=dict(r=4, alpha=8.0, targets="q_proj,o_proj,w1,w2,w3")),
    "qwen2_moe": dict(
        seed=45, moe=True,
        config={"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_hidden_layers": 4,
                "hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
                "intermediate_size": 160, "moe_intermediate_size": 48, "shared_expert_intermediate_size": 96,
                "num_experts": 8, "num_experts_per_tok": 3, "norm_topk_prob": False,
                "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 128,
                "max_position_embeddings": 128, "hidden_act": "silu", "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0, "use_sliding_window": False, "tie_word_embeddings": False,
                "eos_token_id": 127, "torch_dtype": "float32"},
        lora=dict(r=4, alpha=16.0, targets="all-linear")),
    # Qwen3-MoE: Qwen3's attention (q/k norms, head_dim 128 with q 2 x 128 wider than hidden), 8
    # routed experts, 2 a token, renormalized, no shared expert
    "qwen3_moe": dict(
        seed=47, moe=True,
        config={"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 4,
                "hidden_size": 192, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
                "intermediate_size": 160, "moe_intermediate_size": 48, "num_experts": 8,
                "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1,
                "mlp_only_layers": [], "vocab_size": 128, "max_position_embeddings": 128,
                "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "attention_bias": False,
                "use_sliding_window": False, "tie_word_embeddings": False, "eos_token_id": 127,
                "torch_dtype": "float32"},
        lora=dict(r=4, alpha=16.0, targets="all-linear")),
}
# DeepSeekMoE: test_e2e_torch's (a dense first layer, then MoE layers of 6 routed experts, 3 a
# token, and two ungated shared experts) with 4 layers; adapters on every linear layer (the dense
# layer's MLP, the routed and shared experts, the attention)
FAMILIES["deepseek"] = dict(
    seed=49, moe=True,
    config=dict(e2e.FAMILIES["deepseek"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                eos_token_id=127),
    lora=dict(r=4, alpha=16.0, targets="all-linear"))
# DeepSeek-V2: test_e2e_torch's (latent attention, q_lora_rank null, 3 heads of qk_nope 64 + qk_rope 32
# interleaved in the file, v_head_dim 64, yarn factor 40 with both mscales: by default the cache holds
# each position's latent [k_pe | c_kv] and kv_b_proj is absorbed; --mla-cache full, each head's key
# [k_pe | k_nope] and value [v | 0] as the decompressed attention reads them) with 4 layers and the prompts
# plus new tokens past the original 64 positions; its q_lora_rank kind with DeepSeek-V2's head shape
# and 6 layers (with 4, two weight slots of its fat layers pass the streamed runs' device memory).
# Adapters on every linear layer but the router (latent attention's q_proj, kv_a_proj_with_mqa,
# kv_b_proj, o_proj among them), resident, streamed and over an NF4 base
FAMILIES["deepseek_v2"] = dict(
    seed=61, moe=True,
    config=dict(e2e.FAMILIES["deepseek_v2"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                eos_token_id=127),
    lora=dict(r=4, alpha=16.0, targets="all-linear"))
FAMILIES["deepseek_v2_q"] = dict(
    FAMILIES["deepseek_v2"], seed=58, lora=dict(r=4, alpha=16.0, targets="q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj"),
    config=dict(e2e.FAMILIES["deepseek_v2_q"]["config"], num_hidden_layers=6, max_position_embeddings=128,
                eos_token_id=127))
# DeepSeek-V3: test_e2e_torch's (deepseek_v2_q's layers, sigmoid routing chosen with a random
# e_score_correction_bias in 4 groups keep 2, routed_scaling_factor 2.5) with 4 layers
FAMILIES["deepseek_v3"] = dict(
    FAMILIES["deepseek_v2"], seed=63, lora=dict(r=4, alpha=16.0, targets="all-linear"),
    config=dict(e2e.FAMILIES["deepseek_v3"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                eos_token_id=127))
# GLM-4.5: test_e2e_torch's (GQA at head 128, q/k/v biased, half of each head rotated, a dense first
# layer, V3's router in 4 groups keep 2 with a random correction, scale 2.5, one shared expert) with 4
# layers; and with use_qk_norm. Adapters on every linear layer but the router
FAMILIES["glm4_moe"] = dict(
    seed=68, moe=True, lora=dict(r=4, alpha=16.0, targets="all-linear"),
    config=dict(e2e.FAMILIES["glm4_moe"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                eos_token_id=127))
FAMILIES["glm4_moe_qk"] = dict(
    FAMILIES["glm4_moe"], seed=71, lora=None,
    config=dict(FAMILIES["glm4_moe"]["config"], use_qk_norm=True))
# OLMoE: test_e2e_torch's (pre-norm layers with q/k norms over the whole projections, so the
# cached keys are normed ones; GQA; 6 experts, 3 a token, not renormalized) with 4 layers;
# adapters on every linear layer but the router
FAMILIES["olmoe"] = dict(
    seed=74, moe=True, lora=dict(r=4, alpha=16.0, targets="all-linear"),
    config=dict(e2e.FAMILIES["olmoe"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                eos_token_id=127))
# Gemma-3 (text): its q/k norms, local layers 0, 1 and 3 (a window of 24, base 10000), layer 2
# global (rope_theta 1e6, linear rope_scaling 8)
FAMILIES["gemma3_text"] = dict(
    FAMILIES["gemma2"], seed=55,
    config=dict(e2e.FAMILIES["gemma3_text"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                sliding_window=24, eos_token_id=127))
# SmolLM3: test_e2e_torch's (heads of 128 over 1 kv head, tied, rope_theta 5e6) with 8 layers, the
# fourth and the eighth NoPE (no_rope_layers absent: no_rope_layer_interval 4), so that the cache
# holds unturned keys for them; LLaMA's adapters
FAMILIES["smollm3"] = dict(
    seed=59, lora=FAMILIES["llama"]["lora"],
    config=dict({k: v for k, v in e2e.FAMILIES["smollm3"]["config"].items() if k != "no_rope_layers"},
                num_hidden_layers=8, max_position_embeddings=128, eos_token_id=127))
# OLMo-2: test_e2e_torch's (norms on the attention's and the MLP's outputs alone, q/k norms over
# the whole projections before RoPE, so the cached keys are normed ones; GQA) with 4 layers
# and LLaMA's adapters (PEFT's seven modules)
FAMILIES["olmo2"] = dict(
    seed=56, lora=FAMILIES["llama"]["lora"],
    config=dict(e2e.FAMILIES["olmo2"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                eos_token_id=127))
# EXAONE 4.0: test_e2e_torch's (output norms alone, per-head q/k norms before RoPE, so the cached
# keys are normed ones; GQA; llama3's rope_scaling) with its layers as a layer_types list (0 and 2
# sliding over a window of 12 keys and turned, 1 and 3 global without rotary, their keys cached as
# projected), each prompt and its 32 new tokens past the window; LLaMA's adapters (PEFT's seven)
FAMILIES["exaone4"] = dict(
    seed=61, lora=FAMILIES["llama"]["lora"],
    config=dict({k: v for k, v in e2e.FAMILIES["exaone4"]["config"].items() if k != "sliding_window_pattern"},
                max_position_embeddings=128, eos_token_id=127, sliding_window=12,
                layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]))
# OLMo-3: test_e2e_torch's layers, 4 of them without layer_types (Olmo3Config's default: three
# sliding layers of four, their rotary unscaled, yarn's on the fourth), a window of 24, which the
# sequences (5 or 11 + 32) pass
FAMILIES["olmo3"] = dict(
    FAMILIES["olmo2"], seed=58,
    config=dict({k: v for k, v in e2e.FAMILIES["olmo3"]["config"].items() if k != "layer_types"},
                num_hidden_layers=4, max_position_embeddings=128, sliding_window=24, eos_token_id=127))


# GPT-NeoX (query_key_value interleaved per head in the file, rotary on a quarter of each 64-wide
# head, the erf GELU, a parallel residual, embed_out), Falcon-7B's kind (multi-query, one norm, no
# biases, tied) and Falcon-40B's (the new decoder architecture: 2 kv groups, ln_attn and ln_mlp,
# biases, untied): test_e2e_torch's models with 4 layers (GPT-NeoX's llama3 and Falcon's linear
# rope_scaling included), and Falcon-RW's (ALiBi in bfloat16 at the key positions, before the
# scale; sequential, biases); PEFT's four modules as adapters
for _name, _seed in (("gpt_neox", 54), ("falcon", 61), ("falcon_new", 59), ("falcon_rw", 67)):
    FAMILIES[_name] = dict(
        seed=_seed,
        config=dict(e2e.FAMILIES[_name]["config"], num_hidden_layers=4, max_position_embeddings=128,
                    eos_token_id=127),
        lora=dict(r=4, alpha=8.0, targets=["q", "o", "up", "down"],
                  peft=["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]))
# BLOOM: test_e2e_torch's model with 4 layers (ALiBi over 3 heads of 64, the embedding norm
# scaled down), PEFT's four modules
FAMILIES["bloom"] = dict(
    seed=65,
    config=dict(e2e.FAMILIES["bloom"]["config"], n_layer=4, eos_token_id=127),
    scale={"transformer.word_embeddings_layernorm.weight": 0.1, "transformer.word_embeddings_layernorm.bias": 0.1},
    lora=dict(r=4, alpha=8.0, targets=["q", "o", "up", "down"],
              peft=["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]))
# OPT: test_e2e_torch's model with 4 layers (learned positions from row 2, ReLU, tied); q and v
# apart (PEFT's default targets for OPT) with out_proj, fc1 and fc2
FAMILIES["opt"] = dict(
    seed=63,
    config=dict(e2e.FAMILIES["opt"]["config"], num_hidden_layers=4, max_position_embeddings=128, eos_token_id=127),
    lora=dict(r=4, alpha=8.0, targets=["q", "v", "o", "up", "down"],
              peft=["q_proj", "v_proj", "out_proj", "fc1", "fc2"]))

# Phi-2's kind: test_e2e_torch's model with 4 layers (heads of 80, 32 rotary dimensions, one norm
# before the parallel attention and MLP, the biased lm_head); q, k, v apart with dense, fc1 and fc2
FAMILIES["phi"] = dict(
    seed=69,
    config=dict(e2e.FAMILIES["phi"]["config"], num_hidden_layers=4, max_position_embeddings=128, eos_token_id=127),
    lora=dict(r=4, alpha=8.0, targets=["q", "k", "v", "o", "up", "down"],
              peft=["q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"]))

# ERNIE 4.5: test_e2e_torch's (heads of 128 wider than hidden, GQA, rotary pairs interleaved in the
# file, every linear layer biased, tied) with 4 layers; LLaMA's adapters (q's and k's lora_B in the
# file's row order)
FAMILIES["ernie4_5"] = dict(
    seed=75, lora=FAMILIES["llama"]["lora"],
    config=dict(e2e.FAMILIES["ernie4_5"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                eos_token_id=127))

# Seed-OSS: test_e2e_torch's (q, k, v biased, heads of 128 wider than hidden, GQA, untied) with 4
# layers; LLaMA's adapters (PEFT's seven modules)
FAMILIES["seed_oss"] = dict(
    seed=73, lora=FAMILIES["llama"]["lora"],
    config=dict(e2e.FAMILIES["seed_oss"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                eos_token_id=127))

# StarCoder2 (starcoder2-3b's kind): test_e2e_torch's model with 4 layers (heads of 128 over 1 kv
# head, every linear layer biased, LayerNorms with biases, sequential, tied) over a window of 24
# keys, which the sequences (5 or 11 + 32) pass; PEFT's six modules
FAMILIES["starcoder2"] = dict(
    seed=72,
    config=dict(e2e.FAMILIES["starcoder2"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                sliding_window=24, eos_token_id=127),
    lora=dict(r=4, alpha=8.0, targets=["q", "k", "v", "o", "up", "down"],
              peft=["q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "c_proj"]))

# Granite (granite-3.x's kind): test_e2e_torch's model with 4 layers (heads of 64, GQA, the
# embeddings times 12, the scores times 1/64, each residual branch times 0.22, the logits over 8,
# which greedy tokens do not see); its own lm_head here (tied, the embedding times 12 dominates the
# residual and the decode repeats its input, which no adapter changes; test_e2e_torch trains it
# tied); PEFT's seven modules, o_proj and down_proj (the branches' ends) among them
FAMILIES["granite"] = dict(
    seed=71,
    config=dict(e2e.FAMILIES["granite"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                eos_token_id=127, tie_word_embeddings=False),
    lora=dict(r=8, alpha=16.0, targets=["q", "k", "v", "o", "gate", "up", "down"],
              peft=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
# Granite-MoE (granite-3.0/3.1 a400m and a800m's kind): test_e2e_torch's model with 4 layers and 8
# experts of 64 (2 a token), its experts fused in the file, the multipliers on; its own lm_head as
# Granite's here; LoRA on the attention's four projections (PEFT adapts no ParallelExperts), over
# the resident, the streamed and an NF4 base (each expert's gate, up and down quantized apart, as
# the runtime holds them)
FAMILIES["granitemoe"] = dict(
    seed=83, moe=True,
    config=dict(e2e.FAMILIES["granitemoe"]["config"], num_hidden_layers=4, num_local_experts=8,
                intermediate_size=64, max_position_embeddings=128, eos_token_id=127, tie_word_embeddings=False),
    lora=dict(r=4, alpha=8.0, targets="q_proj,k_proj,v_proj,o_proj"))
# the same with an original length of 8 the longer prompt (11) passes: long_factor from the prompts'
# forward on, for both sequences (the batch's longest decides), no crossing
FAMILIES["phi3_past"] = dict(
    FAMILIES["phi3_cross"], seed=92, config=dict(FAMILIES["phi3_cross"]["config"], original_max_position_embeddings=8))
# Phi-3.5-MoE: test_e2e_torch's model with 4 layers and 8 experts of 64 (2 a token by the sparsemixer
# at router_jitter_noise 0.3), LayerNorms with a bias, q/k/v/o and lm_head biased, a window of 24 keys,
# longrope's short factors and short_mscale (the 43 positions stay within its original 64: Phi-3's
# phi3_cross and phi3_past generate past theirs); LoRA on q, o and the experts, over the resident, the streamed and an NF4 base
FAMILIES["phimoe"] = dict(
    seed=89, moe=True,
    config=dict(e2e.FAMILIES["phimoe"]["config"], num_hidden_layers=4, num_local_experts=8, intermediate_size=64,
                max_position_embeddings=128, sliding_window=24, eos_token_id=127),
    lora=dict(r=4, alpha=8.0, targets="q_proj,o_proj,w1,w2,w3"))
# gpt-oss: test_e2e_torch's model (sinks, q/k/v/o biased, GQA at head 64, yarn, a biased router over 4
# biased experts, 2 a token, the GLU clamped at 1.5) with 4 layers alternating a window of 12 keys, which
# each prompt and its 32 new tokens pass, and full attention: the sinks in the cached attention; LoRA on
# the attention's q, k, v and o (its experts are not Linear modules PEFT adapts)
FAMILIES["gpt_oss"] = dict(
    seed=97, moe=True, lora=dict(r=4, alpha=8.0, targets="q_proj,k_proj,v_proj,o_proj"),
    config=dict(e2e.FAMILIES["gpt_oss"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                sliding_window=12, layer_types=["sliding_attention", "full_attention"] * 2, eos_token_id=127))
# the same past an original length of 24 (rope_scaling's: PhiMoE's), which the longer sequence crosses
# after 14 new tokens: long_factor and long_mscale from the crossing's forward on; no adapters (phimoe's
# run them over the same layers)
FAMILIES["phimoe_cross"] = dict(
    FAMILIES["phimoe"], seed=95, lora=None,
    config=dict(FAMILIES["phimoe"]["config"],
                rope_scaling=dict(FAMILIES["phimoe"]["config"]["rope_scaling"], original_max_position_embeddings=24)))
# GPT-J: test_e2e_torch's model with 4 layers (4 heads of 64, 24 rotary dimensions interleaved in
# pairs, one norm before the parallel attention and MLP, the biased lm_head); q, k, v apart (q's and
# k's lora_B in the file's row order) with out_proj, fc_in and fc_out
FAMILIES["gptj"] = dict(
    seed=71,
    config=dict(e2e.FAMILIES["gptj"]["config"], n_layer=4, n_positions=128, eos_token_id=127),
    lora=dict(r=4, alpha=8.0, targets=["q", "k", "v", "o", "up", "down"],
              peft=["q_proj", "k_proj", "v_proj", "out_proj", "fc_in", "fc_out"]))
# Cohere (Command-R's and Aya's kind): test_e2e_torch's model with 4 layers (4 heads of 64 over 2 kv
# heads, one LayerNorm without a bias before the parallel attention and MLP, rotary interleaved in
# pairs, tied, the logits times 0.25); PEFT's seven modules (q's and k's lora_B in the file's row order)
FAMILIES["cohere"] = dict(
    seed=75,
    config=dict(e2e.FAMILIES["cohere"]["config"], num_hidden_layers=4, max_position_embeddings=128,
                eos_token_id=127),
    lora=dict(r=8, alpha=16.0, targets=["q", "k", "v", "o", "gate", "up", "down"],
              peft=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
# command-r-plus's kind: the same with use_qk_norm (a LayerNorm on each q and k head, a weight row per
# head)
FAMILIES["cohere_qk"] = dict(
    FAMILIES["cohere"], seed=79, config=dict(FAMILIES["cohere"]["config"], use_qk_norm=True))

# Cohere2 (Command-R7B's and Command-A's kind): test_e2e_torch's model with its layers as a layer_types
# list (layers 0 and 2 sliding over a window of 12 keys with the interleaved rotary, 1 and 3 global
# without rotary, their keys cached as projected), each prompt and its 32 new tokens past the window;
# PEFT's seven modules (q's and k's lora_B in the file's row order in every layer)
FAMILIES["cohere2"] = dict(
    FAMILIES["cohere"], seed=83,
    config=dict({k: v for k, v in e2e.FAMILIES["cohere2"]["config"].items() if k != "sliding_window_pattern"},
                max_position_embeddings=128, eos_token_id=127, sliding_window=12,
                layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]))

# ---- the PyTorch side -------------------------------------------------------------------------

def greedy(fwd, prompts, guess=None):
    """Each prompt's NEW greedy tokens (the whole sequence through the model for each), and the
    smallest gap between the two largest logits met; an end-of-sequence token is not special
    here: eos_token_id is set to one the prompts and the decode never reach (checked).

    guess (optional): a decode per prompt, generate's, to check rather than redo token by token.
    The model is causal, so the logits at row i of one forward of prompt + guess are those of the
    forward of its first i + 1 tokens (to float64's last bits): where each row's argmax is the
    guess's next token, the guess is the greedy decode and the gaps are those rows'. A guess
    that stops short (at an end-of-sequence id) is continued token by token from its end; one
    that differs anywhere is dropped and the whole decode redone token by token (e2e.MIN_GAP,
    the experts' ties, as before it), so that the result never depends on the guess."""
    keep = e2e.MIN_GAP[0]
    if guess is not None and len(guess) == len(prompts):
        outs, gap = [], math.inf
        with torch.no_grad():
            for p, g in zip(prompts, guess):
                g = list(g[:NEW])
                ids = list(p) + g
                if g:
                    logits = fwd(torch.tensor([ids[:-1]]))[0, len(p) - 1:]  # (len(g), V)
                    top = torch.topk(logits, 2).values
                    if torch.argmax(logits, dim=-1).tolist() != g:
                        break
                    gap = min(gap, float((top[:, 0] - top[:, 1]).min()))
                for _ in range(NEW - len(g)):
                    logits = fwd(torch.tensor([ids]))[0, -1]
                    top = torch.topk(logits, 2).values
                    gap = min(gap, float(top[0] - top[1]))
                    ids.append(int(torch.argmax(logits)))
                outs.append(ids[len(p):])
            else:
                return outs, gap
        e2e.MIN_GAP[0] = keep
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


def longrope_original(c):
    """longrope's original length (Phi-3's top-level key, PhiMoE's rope_scaling's), or None."""
    rs = c.get("rope_scaling") or {}
    if rs.get("type", rs.get("rope_type")) != "longrope":
        return None
    return c["original_max_position_embeddings"] if c["model_type"] == "phi3" else \
        rs["original_max_position_embeddings"]


def longrope_as(c, kind):
    """c with both factor lists (and mscales) set to its `kind` ("long" or "short") ones: its forward
    turns by those at every length."""
    rs = c["rope_scaling"]
    other = dict(rs, short_factor=rs[kind + "_factor"], long_factor=rs[kind + "_factor"])
    if kind + "_mscale" in rs:
        other["short_mscale"] = other["long_mscale"] = rs[kind + "_mscale"]
    return dict(c, rope_scaling=other)


def longrope_crossing(c, prompts, fwd_of):
    """For a longrope config whose generation passes its original length: (the original length, the
    forward fwd_of gives for longrope_as(c, "long")). None otherwise."""
    orig = longrope_original(c)
    if orig is None or max(len(p) for p in prompts) + NEW - 1 <= orig:
        return None
    return orig, fwd_of(longrope_as(c, "long"))


def greedy_longrope(fwd, prompts, orig, fwd_long, guess=None):
    """The prompts' NEW greedy tokens as Hugging Face's Phi-3 generates them as one batch past the
    original length `orig`: a forward whose positions reach past orig (its longest sequence's
    length, so the batch's longest decides for every sequence) turns every position by long_factor,
    short_factor otherwise; at the step whose longest sequence first holds orig + 1 tokens the cache
    is dropped and every token so far goes through again. So each step's logits are those of the
    whole sequence so far through the model with the factors of that step's longest length: fwd
    (short_factor within orig) or fwd_long (long_factor at every length).

    guess (optional): generate's decode, checked as greedy checks one: the steps before the
    crossing are rows of one short forward of the prompt and the guess up to orig tokens, those
    from it rows of one long forward of the whole; a guess that differs anywhere (or stops
    short) is dropped and the decode done token by token."""
    kx = max(0, orig + 1 - max(len(p) for p in prompts))  # the first step that turns by long_factor
    with torch.no_grad():
        if guess is not None and len(guess) == len(prompts) and all(len(g) >= NEW for g in guess):
            outs, gap = [], math.inf
            for p, g in zip(prompts, guess):
                ids, n = list(p) + list(g[:NEW]), len(p)
                rows = ([fwd(torch.tensor([ids[:n + kx - 1]]))[0, n - 1:]] if kx else []) + \
                    ([fwd_long(torch.tensor([ids[:-1]]))[0, n - 1 + kx:]] if kx < NEW else [])
                logits = torch.cat(rows)
                if torch.argmax(logits, dim=-1).tolist() != ids[n:]:
                    break
                top = torch.topk(logits, 2).values
                gap = min(gap, float((top[:, 0] - top[:, 1]).min()))
                outs.append(ids[n:])
            else:
                return outs, gap
        seqs, gap = [list(p) for p in prompts], math.inf
        for _ in range(NEW):
            f = fwd_long if max(len(q) for q in seqs) > orig else fwd
            for q in seqs:
                logits = f(torch.tensor([q]))[0, -1]
                top = torch.topk(logits, 2).values
                gap = min(gap, float(top[0] - top[1]))
                q.append(int(torch.argmax(logits)))
    return [q[len(p):] for q, p in zip(seqs, prompts)], gap


def reference(c, fwd_of, prompts, guess):
    """greedy over fwd_of(c), or greedy_longrope where longrope's generation passes its original
    length."""
    cross = longrope_crossing(c, prompts, fwd_of)
    if cross:
        return greedy_longrope(fwd_of(c), prompts, *cross, guess)
    return greedy(fwd_of(c), prompts, guess)


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


def run_ok(gen, d, prompts, extra):
    """generate's ids per prompt, or None (its output and command printed) when it failed."""
    got, rc, out, cmd = run_generate(gen, d, prompts, extra)
    if rc != 0:
        print(out)
        print(f"generate exited {rc}: {cmd}")
        return None
    return got


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
    gpt, moe = c["model_type"] == "gpt2", spec.get("moe", False)
    g = torch.Generator().manual_seed(spec["seed"])
    params = e2e.moe_params(c, g) if moe else mf.PARAMS.get(c["model_type"], mf.llama_params)(c, g, std=1.0)
    # tensors scaled where the model as drawn repeats its input: Gemma-2's embedding back to
    # Gemma's, BLOOM's embedding norm (its unit-scale output through the tied head)
    for tensor, gain in spec.get("scale", {}).items():
        params[tensor] = params[tensor] * gain
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
    # (DeepSeek-V3's score corrections, held apart in fp32, are no block's weights)
    model_bytes = 4 * sum(v.numel() for k, v in params.items() if not e2e.buffer(k))
    cap = str(model_bytes * 3 // 4)
    ck = Checks()
    print(f"{name}: {model_bytes // 4} parameters ({model_bytes} bytes fp32), head size "
          f"{mf.head_dim(c)}, prompts of "
          f"{PROMPT_LENS} tokens, {NEW} new tokens each; device memory {cap} bytes where the weights stream")

    def fwd_of(cc):
        return (lambda idx: e2e.moe_forward(cc, params, idx)[0]) if moe else \
            (lambda idx: mf.FORWARD.get(cc["model_type"], mf.llama_forward)(cc, params, idx))
    mla = bool(c.get("kv_lora_rank"))
    runs = [
        ("resident", ["--params-on", "gpu"]),
        ("streamed from host, prefetch 1", ["--params-on", "cpu", "--prefetch", "1", "--device-mem", cap]),
        ("streamed from host, prefetch 2", ["--params-on", "cpu", "--prefetch", "2"]),
        ("read from NVMe, prefetch 1", ["--params-on", "nvme", "--nvme-dir", os.path.join(d, "nvme"),
                                        "--prefetch", "1", "--device-mem", cap]),
    ] + ([("resident, --mla-cache full", ["--params-on", "gpu", "--mla-cache", "full"])] if mla else [])
    # the resident run first: its tokens are the guess greedy checks in one forward a prompt
    first = run_ok(gen, d, prompts, runs[0][1])
    if first is None:
        return ck.failed + 1
    e2e.MIN_GAP[0] = math.inf
    want, gap = reference(c, fwd_of, prompts, first)
    if moe:
        ck.fact(f"the reference's expert choices clear of ties (smallest gap {e2e.MIN_GAP[0]:.1e} > "
                f"{e2e.TIE_GAP:.0e})", e2e.MIN_GAP[0] > e2e.TIE_GAP)
    ck.fact(f"the end-of-sequence id 127 is in no prompt or greedy decode (smallest top-2 logit gap {gap:.2e})",
            all(127 not in p for p in prompts + want))
    for what, extra in runs:
        got = first if extra is runs[0][1] else run_ok(gen, d, prompts, extra)
        if got is None:
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

    if mla:
        check_cache_bytes(ck, gen, c, d, prompts)
    if moe:
        check_experts_apart(ck, gen, c, params, d, prompts, want, model_bytes)
        if spec["lora"] is None:  # (latent attention: LoRA refused by name; phimoe_cross: phimoe's; glm4_moe_qk: glm4_moe's)
            return ck.failed
        return ck.failed + check_moe_adapters(gen, c, params, spec["lora"], d, prompts, want, g)
    # adapters over the base, and over an NF4 base
    lspec = spec["lora"]
    adir = os.path.join(d, "adapter")
    ad = write_adapter(adir, c, lspec, params, g)
    s = lspec["alpha"] / lspec["r"]
    for nf4 in (0, 1):
        W = mlf.linear_weights(c, params, nf4)
        flags = ["--adapter", adir] + (["--qlora"] if nf4 else [])
        first = run_ok(gen, d, prompts, flags)  # the resident base's tokens: greedy's guess
        if first is None:
            return ck.failed + 1
        want_l, gap_l = reference(c, lambda cc: (lambda idx: mlf.forward(cc, params, W, ad, s, idx)), prompts,
                                  first)
        moved = want_l != want
        # an adapted decode that reaches the end-of-sequence id stops there (kept), as generate
        # stops at the config's eos_token_id (the base's decode is checked to reach none)
        want_l = [w[: w.index(127) + 1] if 127 in w else w for w in want_l]
        ck.fact(f"{'QLoRA' if nf4 else 'LoRA'} reference: the adapters change the tokens (top-2 gap {gap_l:.2e})",
                moved)
        for what, extra in [("resident base", []), ("streamed base", ["--params-on", "cpu", "--prefetch", "1"])]:
            if nf4 and extra:
                continue
            got = run_ok(gen, d, prompts, flags + extra) if extra else first
            if got is None:
                return ck.failed + 1
            ck.tokens(f"{'QLoRA' if nf4 else 'LoRA'} r {lspec['r']}, {what}", got, want_l)
    return ck.failed


def rope_row_order(c, key, rows):
    """The runtime's order of a latent-attention weight's rows (docs/transformer.md, "NF4"): per
    run of P rows, the R rotary ones first, deinterleaved (the even dims of the file's run at A,
    then the odd ones), then the others in the file's order; None for every other tensor.
    q_proj and q_b_proj: P = qk_nope + qk_rope, A = qk_nope; kv_a_proj_with_mqa: P = kv_lora_rank +
    qk_rope, A = kv_lora_rank; R = qk_rope."""
    if not c.get("kv_lora_rank"):
        return None
    R, nope, kvr = c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["kv_lora_rank"]
    if key.endswith((".q_proj.weight", ".q_b_proj.weight")):
        P, A = nope + R, nope
    elif key.endswith(".kv_a_proj_with_mqa.weight"):
        P, A = kvr + R, kvr
    else:
        return None
    order = []
    for r in range(rows):
        i, base = r % P, r - r % P
        order.append(base + (i - R if i - R < A else i) if i >= R else
                     base + A + 2 * (i if i < R // 2 else i - R // 2) + (i >= R // 2))
    return order


def nf4_base(params, c=None):
    """The weights QLoRA computes with: every linear weight of the layers through the NF4 round
    trip but an MoE layer's router and shared expert gate (kept in the model dtype); Granite-MoE's
    fused experts each expert's gate, up and down apart (the runtime's tensors), its router
    (router.layer) kept; gpt-oss's each expert's gate_up_proj as the runtime's [2 f, h] tensor (gate
    rows, then up rows, each row a column of the file's x @ W layout: NF4's blocks of 64 run along
    them) and its down_proj as [h, f], its router and every bias kept; Cohere's 2-D q/k norm weights
    are norms, kept too. A latent-attention
    weight is quantized in the runtime's row order (rope_row_order), which changes its blocks of 64
    only where a row is not a multiple of 64 wide (deepseek_v2_q's q_b_proj, 48)."""
    def nf4(w):
        return mlf.nf4_dequantize(mlf.nf4_quantize(w.contiguous().reshape(-1).float()), w.numel()) \
            .double().view(w.shape)

    def nf4_rows(k, w):
        order = rope_row_order(c, k, w.shape[0]) if c else None
        if order is None:
            return nf4(w)
        out = torch.empty_like(w, dtype=torch.float64)
        out[order] = nf4(w[order])
        return out
    p = dict(params)
    for k, w in params.items():
        if k.endswith(".input_linear.weight"):  # [E, 2 f, h]: each expert's gate rows, then its up rows
            f = w.shape[1] // 2
            p[k] = torch.stack([torch.cat([nf4(w[e, :f]), nf4(w[e, f:])]) for e in range(w.shape[0])])
        elif k.endswith(".output_linear.weight"):  # [E, h, f]
            p[k] = torch.stack([nf4(w[e]) for e in range(w.shape[0])])
        elif k.endswith(".experts.gate_up_proj"):  # gpt-oss [E, h, 2 f]: column 2j gate j, 2j + 1 up j
            out = torch.empty_like(w, dtype=torch.float64)
            f = w.shape[2] // 2
            for e in range(w.shape[0]):
                q = nf4(torch.cat([w[e][:, 0::2].T, w[e][:, 1::2].T]))
                out[e][:, 0::2], out[e][:, 1::2] = q[:f].T, q[f:].T
            p[k] = out
        elif k.endswith(".experts.down_proj"):  # gpt-oss [E, f, h]: the runtime's [h, f] an expert
            p[k] = torch.stack([nf4(w[e].T).T for e in range(w.shape[0])])
        elif k.endswith(("_bias", ".sinks", ".router.weight")):  # (gpt-oss's 2-D biases, its router)
            continue
        elif k.startswith("model.layers.") and w.dim() == 2 and not k.endswith(("norm.weight", ".gate.weight",
                                                                                  ".router.layer.weight",
                                                                                  ".shared_expert_gate.weight")):
            p[k] = nf4_rows(k, w)
    return p


def routed_experts(c, params, prompts, want):
    """The experts each of generate's forwards routes some token to, layer by layer, by the
    reference: the prompts' forward (every row of each prompt padded to the longest with its last
    token, as generate pads it), then each later token of every sequence at its position; with
    longrope past its original length, the crossing's forward (every token so far, padded the same
    way) in place of that step's token, each forward at its factors (greedy_longrope's rule). A
    forward's count is that of the distinct experts per layer; summed over the forwards."""
    k = e2e.moe_shape(c)[1]
    t = max(len(p) for p in prompts)
    orig = longrope_original(c)
    orig = orig if orig is not None else math.inf

    def routers(ids, kind):  # every layer's router logits over the sequence's rows, at kind's factors
        cc = longrope_as(c, kind) if orig < math.inf else c
        with torch.no_grad():
            return e2e.moe_forward(cc, params, torch.tensor([ids]))[1]

    moe_layers = [l for l in range(c["num_hidden_layers"]) if not e2e.dense_layer(c, l)]

    def choose(r, l):  # a layer's choices from its router logits (DeepSeek's gate: e2e.deepseek_route)
        if not e2e.deepseek(c):
            return torch.topk(r, k, dim=-1).indices
        with torch.no_grad():
            return e2e.deepseek_route(c, r, params.get(f"model.layers.{l}.mlp.gate.e_score_correction_bias"))[1]

    def chosen(rs, rows):  # per layer, the experts the given rows of the sequence choose
        return [set(choose(r[rows], l).flatten().tolist()) for r, l in zip(rs, moe_layers)]

    def whole(n):  # one forward of every sequence's first n tokens, padded to the longest's n
        sets = [set() for _ in range(L)]
        for p, w in zip(prompts, want):
            q = (p + w)[:n - t + len(p)]
            for l, s in enumerate(chosen(routers(q + [q[-1]] * (n - len(q)), "long" if n > orig else "short"),
                                         slice(0, n))):
                sets[l] |= s
        return sum(len(s) for s in sets)

    L = c["num_hidden_layers"]
    total = whole(t)
    # the forward of each sequence's token i - 1 (the last has none after it) routes as row
    # len(p) + i - 1 of one forward of the whole sequence (the model is causal)
    kinds = {"long" if t + i > orig else "short" for i in range(1, NEW)}
    full = {kind: [routers(p + w[:NEW - 1], kind) for p, w in zip(prompts, want)] for kind in kinds}
    for i in range(1, NEW):
        if t <= orig and t + i == orig + 1:  # the crossing
            total += whole(t + i)
            continue
        sets = [set() for _ in range(L)]
        for p, rs in zip(prompts, full["long" if t + i > orig else "short"]):
            row = len(p) + i - 1
            for l, s in enumerate(chosen(rs, slice(row, row + 1))):
                sets[l] |= s
        total += sum(len(s) for s in sets)
    return total


def check_cache_bytes(ck, gen, c, d, prompts):
    """Latent attention's cache, as generate's --stats-json reports what it allocated: the latent
    [k_pe | c_kv] of each position and layer, or every head's key and value under --mla-cache full
    (fp32; one new token, so the context is the longest prompt and 1)."""
    L, H, B, ctx = c["num_hidden_layers"], c["num_attention_heads"], len(prompts), max(map(len, prompts)) + 1
    rope, nope, kvr = c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["kv_lora_rank"]
    want = {"latent": L * B * ctx * (rope + kvr) * 4, "full": 2 * L * B * ctx * H * (nope + rope) * 4}
    stats = os.path.join(d, "cache.json")
    for kind in ("latent", "full"):
        # (--max-new-tokens 1 after run_generate's own: the last one counts)
        if run_ok(gen, d, prompts, ["--max-new-tokens", "1", "--mla-cache", kind, "--stats-json", stats]) is None:
            ck.failed += 1
            return
        with open(stats) as fh:
            js = json.load(fh)
        got = js.get("kv_cache_bytes")
        ck.fact(f"--mla-cache {kind}: the cache's {got} bytes are {want[kind]} (latent / full "
                f"{want['latent'] / want['full']:.3f})", got == want[kind] and js.get("mla_cache") == kind)


def check_experts_apart(ck, gen, c, params, d, prompts, want, model_bytes):
    """Streamed from host, the routed experts go to the device apart from their layer's dense part,
    only those a forward routes to: the weight bytes copied are each forward's dense parts plus
    exactly the experts the reference routed to, and fewer than whole layers would move."""
    E, _, f, _ = e2e.moe_shape(c)
    h = c["hidden_size"]
    L = sum(not e2e.dense_layer(c, l) for l in range(c["num_hidden_layers"]))  # the MoE layers
    # an expert's gate, up and down, fp32 (gpt-oss's with their biases: 2f + h)
    eb = (3 * f * h + (2 * f + h if e2e.gpt_oss(c) else 0)) * 4
    stats = os.path.join(d, "stats.json")
    if run_ok(gen, d, prompts, ["--params-on", "cpu", "--prefetch", "1", "--stats-json", stats]) is None:
        ck.failed += 1
        return
    with open(stats) as fh:
        js = json.load(fh)
    fetched = routed_experts(c, params, prompts, want)
    # and the embedding once more: prefetch 1 loads the next forward's first block while the last
    # forward's head computes (the runtime does not know no forward follows)
    emb = 4 * params["model.embed_tokens.weight"].numel()
    moved = NEW * (model_bytes - L * E * eb) + fetched * eb + emb
    whole = NEW * model_bytes + emb
    print(f"  experts apart: {js.get('experts_fetched')} experts fetched of {NEW * L * E} in {NEW} forwards, "
          f"{js['bytes_moved']['weights']} weight bytes copied ({js['bytes_moved']['weights'] / whole:.3f} of the "
          f"{whole} whole layers move)")
    ck.fact(f"experts fetched: the {fetched} the reference routed to", js.get("experts_fetched") == fetched)
    ck.fact(f"weight bytes copied: the dense parts and those experts, {moved}",
            js["bytes_moved"]["weights"] == moved and moved < whole)


def check_moe_adapters(gen, c, params, spec, d, prompts, want, g):
    """PEFT adapters on an MoE model (the routed experts' projections among them, under PEFT's
    key names), written here with B nonzero: the tokens against the reference computing with
    W + scale B A, over the resident and the streamed base, and over an NF4 base."""
    ck = Checks()
    r, scale = spec["r"], spec["alpha"] / spec["r"]
    adir = os.path.join(d, "adapter")
    ad, mods = e2e.write_moe_adapter(adir, c, params, spec, g, 0.3)
    n_exp = sum(".experts." in m for m in mods)
    for nf4 in (0, 1):
        base = nf4_base(params, c) if nf4 else params
        p = e2e.with_adapters(base, ad, scale)
        # the adapted decode may reach the end-of-sequence id: not special here, as in the reference
        flags = ["--adapter", adir, "--eos", "none"] + (["--qlora"] if nf4 else [])
        first = run_ok(gen, d, prompts, flags)  # the resident base's tokens: greedy's guess
        if first is None:
            return ck.failed + 1
        e2e.MIN_GAP[0] = math.inf
        want_l, gap_l = reference(c, lambda cc: (lambda idx: e2e.moe_forward(cc, p, idx)[0]), prompts, first)
        what = "QLoRA" if nf4 else "LoRA"
        ck.fact(f"{what} reference on {len(mods)} modules ({n_exp} routed experts'): the adapters change the "
                f"tokens (top-2 gap {gap_l:.2e}, expert choices' gap {e2e.MIN_GAP[0]:.1e})",
                want_l != want and e2e.MIN_GAP[0] > e2e.TIE_GAP)
        runs = [("resident base", []), ("streamed base", ["--params-on", "cpu", "--prefetch", "1"])]
        if c.get("kv_lora_rank"):  # latent attention: the resident base again over the full cache
            runs.append(("resident base, --mla-cache full", ["--mla-cache", "full"]))
        for where, extra in runs:
            got = run_ok(gen, d, prompts, flags + extra) if extra else first
            if got is None:
                return ck.failed + 1
            ck.tokens(f"{what} r {r}, {where}", got, want_l)
    return ck.failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generate", required=True, help="the generate program")
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES), help="default: every family")
    ap.add_argument("--workdir", default="generate_torch", help="where the models and adapters go")
    a = ap.parse_args()
    torch.set_num_threads(1)
    # (a ctest entry may run several families: the last line names those that failed)
    failed = {}
    for name in a.family or FAMILIES:
        n = check_family(a.generate, name, a.workdir)
        if n:
            failed[name] = n
    print(f"{sum(failed.values())} check(s) failed: " + ", ".join(f"{n} in {k}" for k, n in failed.items())
          if failed else "every check held")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
