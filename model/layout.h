/* The parameter layout of a transformer: blocks, tensors, offsets.
 *
 * A model is a sequence of blocks that the runtime moves independently:
 *   block 0          embedding: token embedding (+ learned positions for GPT)
 *   blocks 1..L      transformer layer l = block - 1
 *   block L+1        head: final norm (+ output projection when untied; when
 *                    tied, the head uses block 0's token embedding and stores
 *                    nothing for it)
 * Each block owns ONE flat parameter buffer (any zo_dtype; the layout counts
 * elements, not bytes). Every tensor is a view at an element offset into its
 * block's buffer, packed in order without padding, so the sum of all tensor
 * sizes equals zo_model_params(cfg) exactly.
 *
 * Our layout: linear weights are [out, in] row-major (y = x W^T), whatever
 * the checkpoint stores; GPT-2's Conv1D weights are [in, out] in Hugging Face
 * files and are transposed on load and save (hf_transposed = 1).
 *
 * Tensor names are the Hugging Face names as the original checkpoints spell
 * them: GPT-2 without the "transformer." prefix ("h.0.attn.c_attn.weight", as
 * in the openai-community/gpt2 files; the loader also accepts the prefix),
 * LLaMA with "model." ("model.layers.0.self_attn.q_proj.weight") and
 * "lm_head.weight".
 *
 * The transformer reaches tensors by role (model_layout_view) rather than by
 * name. Fused views exist for both architectures because the tensors are
 * contiguous: QKV_W is [q + 2 kv, h] (rows q, then k, then v), GATE_UP_W is
 * [2 ffn, h] (rows gate, then up), so one GEMM computes all of them. */
#ifndef ZO_MODEL_LAYOUT_H
#define ZO_MODEL_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "common/model_config.h" /* defines: zo_model_config */
#include "common/status.h"       /* defines: zo_status */

#define MODEL_BLOCK_EMBED 0
#define MODEL_TENSOR_NAME_MAX 96

/* What a tensor (or a fused view of adjacent tensors) does. Names below are
 * GPT-2 / LLaMA; a role a model lacks has no view (model_layout_view NULL). */
typedef enum model_role {
    /* embedding block */
    MODEL_ROLE_TOK_EMB = 0, /* [vocab, h]    wte.weight / model.embed_tokens.weight */
    MODEL_ROLE_POS_EMB,     /* [max_seq, h]  wpe.weight (GPT only) */
    /* layer blocks */
    MODEL_ROLE_LN1_W,      /* [h]            ln_1.weight / input_layernorm.weight */
    MODEL_ROLE_LN1_B,      /* [h]            ln_1.bias (norm_bias) */
    MODEL_ROLE_QKV_W,      /* [q+2kv, h]     fused view; GPT: attn.c_attn.weight itself */
    MODEL_ROLE_QKV_B,      /* [q+2kv]        fused view (attn_bias) */
    MODEL_ROLE_Q_W,        /* [q, h]         q_proj.weight; GPT: rows of c_attn */
    MODEL_ROLE_K_W,        /* [kv, h]        k_proj.weight */
    MODEL_ROLE_V_W,        /* [kv, h]        v_proj.weight */
    MODEL_ROLE_Q_B,        /* [q]            (attn_bias) */
    MODEL_ROLE_K_B,        /* [kv] */
    MODEL_ROLE_V_B,        /* [kv] */
    MODEL_ROLE_ATTN_OUT_W, /* [h, q]         attn.c_proj.weight / o_proj.weight */
    MODEL_ROLE_ATTN_OUT_B, /* [h]            (out_bias) */
    MODEL_ROLE_LN2_W,      /* [h]            ln_2.weight / post_attention_layernorm.weight
                                             (Gemma-2: pre_feedforward_layernorm.weight) */
    MODEL_ROLE_LN2_B,      /* [h]            (norm_bias) */
    MODEL_ROLE_MLP_GATE_W, /* [ffn, h]       gate_proj.weight (LLaMA only) */
    MODEL_ROLE_MLP_UP_W,   /* [ffn, h]       mlp.c_fc.weight / up_proj.weight */
    MODEL_ROLE_MLP_GATE_UP_W, /* [2ffn, h]   fused view gate|up (LLaMA only) */
    MODEL_ROLE_MLP_GATE_B, /* [ffn]          (out_bias, LLaMA) */
    MODEL_ROLE_MLP_UP_B,   /* [ffn]          mlp.c_fc.bias / up_proj.bias (out_bias) */
    MODEL_ROLE_MLP_GATE_UP_B, /* [2ffn]      fused view (out_bias, LLaMA) */
    MODEL_ROLE_MLP_DOWN_W, /* [h, ffn]       mlp.c_proj.weight / down_proj.weight */
    MODEL_ROLE_MLP_DOWN_B, /* [h]            (out_bias) */
    /* head block */
    MODEL_ROLE_NORM_W,     /* [h]            ln_f.weight / model.norm.weight */
    MODEL_ROLE_NORM_B,     /* [h]            ln_f.bias (norm_bias) */
    MODEL_ROLE_LM_HEAD_W,  /* [vocab, h]     lm_head.weight (untied only) */
    /* mixture-of-experts layers (Mixtral, Qwen2-MoE): the router, then the
     * experts one after another, each gate, up, down (the views are expert
     * 0's; expert e's are model_layout_expert_offset further), then
     * Qwen2-MoE's shared expert as the MLP_* roles (its width shared_ffn)
     * and its sigmoid gate */
    MODEL_ROLE_ROUTER_W,      /* [experts, h] block_sparse_moe.gate.weight / mlp.gate.weight
                                 (Granite-MoE: block_sparse_moe.router.layer.weight; its
                                 experts' slices of input_linear and output_linear: hf_fused) */
    MODEL_ROLE_EXPERT_GATE_W, /* [expert_ffn, h] experts.0.w1.weight / experts.0.gate_proj.weight */
    MODEL_ROLE_EXPERT_UP_W,   /* [expert_ffn, h] experts.0.w3.weight / experts.0.up_proj.weight */
    MODEL_ROLE_EXPERT_DOWN_W, /* [h, expert_ffn] experts.0.w2.weight / experts.0.down_proj.weight */
    MODEL_ROLE_SHARED_GATE_W, /* [1, h]       mlp.shared_expert_gate.weight */
    /* Qwen3's RMSNorms over each head of q and of k (qk_norm); Cohere's
     * LayerNorms (use_qk_norm: qk_norm_heads) have a weight row per head,
     * [n_heads, head_dim] and [n_kv_heads, head_dim] */
    MODEL_ROLE_Q_NORM_W,      /* [head_dim]   self_attn.q_norm.weight */
    MODEL_ROLE_K_NORM_W,      /* [head_dim]   self_attn.k_norm.weight */
    /* Gemma-2's norms of the attention's and the MLP's outputs (layer_norms
     * 4), before each residual add; its LN2 is pre_feedforward_layernorm */
    MODEL_ROLE_POST_ATTN_NORM_W, /* [h]        post_attention_layernorm.weight */
    MODEL_ROLE_POST_MLP_NORM_W,  /* [h]        post_feedforward_layernorm.weight */
    /* BLOOM's LayerNorm on the word embeddings (embed_norm), in block 0 */
    MODEL_ROLE_EMB_NORM_W,       /* [h]        word_embeddings_layernorm.weight */
    MODEL_ROLE_EMB_NORM_B,       /* [h]        word_embeddings_layernorm.bias */
    /* a biased output layer (head_bias: Phi's) */
    MODEL_ROLE_LM_HEAD_B,        /* [vocab]    lm_head.bias */
    /* DeepSeek-V2's latent attention (mla.kv_rank): q from Q_W (q_proj,
     * [heads (nope + rope), h]) or through q's low rank (q_rank); keys and
     * values from the latent c_kv and the one rotary key. Rows permuted
     * from the file's (hf_rope_rows): each head's rotary dims first */
    MODEL_ROLE_Q_A_W,            /* [q_rank, h]  self_attn.q_a_proj.weight */
    MODEL_ROLE_Q_A_NORM_W,       /* [q_rank]     self_attn.q_a_layernorm.weight */
    MODEL_ROLE_Q_B_W,            /* [heads (nope + rope), q_rank] self_attn.q_b_proj.weight */
    MODEL_ROLE_KV_A_W,           /* [rope + kv_rank, h] self_attn.kv_a_proj_with_mqa.weight
                                    (ours: the rotary key's rows, then c_kv's) */
    MODEL_ROLE_KV_A_NORM_W,      /* [kv_rank]    self_attn.kv_a_layernorm.weight */
    MODEL_ROLE_KV_B_W,           /* [heads (nope + v), kv_rank] self_attn.kv_b_proj.weight */
    /* gpt-oss: a sink logit per query head; the router's logit bias; each
     * expert's gate and up as the row ranges [0, ffn) and [ffn, 2 ffn) of
     * one [2 ffn, h] tensor (and their biases of one [2 ffn]), read from
     * mlp.experts.gate_up_proj [E, h, 2 ffn] (its columns interleaved: gate
     * 2j, up 2j + 1; model/layout.c), and the down projection's bias */
    MODEL_ROLE_SINKS,            /* [heads]      self_attn.sinks */
    MODEL_ROLE_ROUTER_B,         /* [experts]    mlp.router.bias */
    MODEL_ROLE_EXPERT_GATE_UP_W, /* [2 ffn, h]   expert 0's of mlp.experts.gate_up_proj */
    MODEL_ROLE_EXPERT_GATE_UP_B, /* [2 ffn]      expert 0's of mlp.experts.gate_up_proj_bias */
    MODEL_ROLE_EXPERT_GATE_B,    /* [ffn]        its gate rows */
    MODEL_ROLE_EXPERT_UP_B,      /* [ffn]        its up rows */
    MODEL_ROLE_EXPERT_DOWN_B,    /* [h]          expert 0's of mlp.experts.down_proj_bias */
    MODEL_ROLE_COUNT,
} model_role;

/* One tensor as stored: a named view into its block's buffer. */
typedef struct model_tensor {
    char name[MODEL_TENSOR_NAME_MAX]; /* Hugging Face name (see above) */
    int block;                        /* index of the owning block */
    model_role role;
    int layer;                        /* transformer layer, -1 for embedding/head */
    size_t offset;                    /* elements into the block buffer */
    size_t numel;
    int ndim;                         /* 1 or 2 */
    int64_t shape[2];                 /* our layout: linear weights [out, in] */
    int hf_transposed;                /* 1 where HF stores [in, out] (GPT-2 Conv1D) */
    int hf_head_rows;                 /* GPT-NeoX's and Falcon's query_key_value (and its
                                       * lora_B): HF groups the rows per kv head, [Q q heads, k, v]
                                       * of group 0, then of group 1, ... (G = hf_head_groups
                                       * groups, heads of d = hf_head_rows rows); ours are
                                       * [all q | all k | all v]. 0: the same rows */
    int hf_head_groups;
    int hf_rope_rows, hf_rope_period, hf_rope_at; /* rotary rows stored in interleaved pairs
                                       * ("rotate every two": GPT-J's and Cohere's q_proj and
                                       * k_proj, DeepSeek-V2's q_proj, q_b_proj and
                                       * kv_a_proj_with_mqa, and their lora_B): in each run of
                                       * hf_rope_period rows (a head) the file's hf_rope_rows rows
                                       * from hf_rope_at are the pairs (2i, 2i + 1); ours put them
                                       * first, de-interleaved (2i at i, 2i + 1 at hf_rope_rows /
                                       * 2 + i), as the rotate-half kernels pair them (q.k is
                                       * unchanged when q and k are permuted alike), then the
                                       * run's other rows in order. 0: the same rows */
    int64_t hf_fused[3];              /* a slice of a tensor that the file stores fused over the
                                       * experts (Granite-MoE's input_linear [E, 2 ffn, h], whose
                                       * rows [0, ffn) of expert e are its gate and [ffn, 2 ffn) its
                                       * up, and output_linear [E, h, ffn]): that tensor's shape
                                       * ([2] 0: a 2-D one, gpt-oss's biases [E, n]), every slice
                                       * of it under its name; hf_fused_at its first element (each
                                       * slice is a contiguous run of the file's, hf_transposed: a
                                       * matrix of it stored [in, out], hf_rope_rows: its rows
                                       * interleaved). [0] 0: a tensor of its own */
    size_t hf_fused_at;
    int hf_rope_elems;                /* with hf_rope_rows, the runs are of elements, not
                                       * rows (rows of one element): Cohere's q_norm and
                                       * k_norm weights [heads, head_dim] (use_qk_norm), whose
                                       * columns follow q_proj's and k_proj's rows */
    int lora;                         /* in a LoRA adapter layout (model/lora.h): MODEL_LORA_A
                                       * or MODEL_LORA_B, role then names the adapted weight;
                                       * 0 in a model's layout */
} model_tensor;

/* A view by role: a tensor, or a fused run of adjacent tensors. */
typedef struct model_view {
    size_t offset;    /* elements into the block buffer */
    size_t numel;
    int ndim;
    int64_t shape[2];
    int tensor;       /* index into model_layout.tensors; -1 for a fused or sub view */
} model_view;

typedef struct model_layout {
    zo_model_config cfg;   /* the shape it was built from */
    int n_layers;
    int n_blocks;          /* n_layers + 2 */
    size_t *block_numel;   /* [n_blocks] elements of each block buffer */
    int n_tensors;
    model_tensor *tensors; /* in buffer order, block by block */
    model_tensor **by_name; /* [n_tensors] the tensors in order of name, ties in buffer order
                             * (model_layout_find's binary search); NULL: found by a scan */
    model_view *views;     /* [n_blocks * MODEL_ROLE_COUNT]; numel 0 = absent */
    size_t total_numel;    /* == zo_model_params(cfg), less the experts outside the window */
    /* The routed experts an MoE layer block holds (expert parallelism: a
     * rank's share): experts expert_first .. expert_first + expert_count - 1
     * of cfg.moe.experts, one after another (model_layout_expert_stride);
     * local expert i is global expert expert_first + i, and its tensors keep
     * the global Hugging Face names (experts.{expert_first + i}). The router
     * scores every expert. Without a window: 0 and cfg.moe.experts. */
    int expert_first, expert_count;
} model_layout;

/* Build the layout of `cfg` (validated first). Fails with ZO_ERR_INVALID for a
 * config that only knows its total (params_override). */
zo_status model_layout_init(model_layout *l, const zo_model_config *cfg);
/* The same holding only the routed experts [first, first + count) in each
 * MoE layer block (the expert window above); ZO_ERR_INVALID for a window
 * outside the model's experts. */
zo_status model_layout_init_experts(model_layout *l, const zo_model_config *cfg, int first, int count);
void model_layout_free(model_layout *l);

/* Elements from expert e's tensor of an MoE role (EXPERT_*) to expert
 * e + 1's: the experts are laid out one after another, gate, up, down. */
size_t model_layout_expert_stride(const model_layout *l);

/* Whether t is a slice of a fused file tensor other than its first (its
 * elements are written with the first's: the file holds one tensor). */
static inline int model_tensor_fused_rest(const model_tensor *t) { return t->hf_fused[0] && t->hf_fused_at; }
/* The dimensions and elements of the fused file tensor t is a slice of. */
static inline int model_tensor_fused_ndim(const model_tensor *t) { return t->hf_fused[2] ? 3 : 2; }
static inline uint64_t model_tensor_fused_numel(const model_tensor *t)
{
    return (uint64_t)t->hf_fused[0] * (uint64_t)t->hf_fused[1] * (uint64_t)(t->hf_fused[2] ? t->hf_fused[2] : 1);
}

/* Marks t (GPT-NeoX's or Falcon's query_key_value weight or bias, or its
 * lora_B) as grouped per kv head in the file: hf_head_rows, hf_head_groups
 * from c. */
void model_tensor_set_head_rows(model_tensor *t, const zo_model_config *c);
/* Marks t (GPT-J's or Cohere's q_proj or k_proj weight, or its lora_B) as
 * holding its rotary pairs interleaved at the start of each head in the
 * file: model_tensor_set_rope_rows with c's rotary dims, head_dim, 0. */
void model_tensor_set_rot_pairs(model_tensor *t, const zo_model_config *c);

/* Marks t as holding `rope` rotary rows from row `at` of each run of
 * `period` rows, interleaved in the file (hf_rope_rows; DeepSeek-V2's latent
 * attention: the last rows of each head or of kv_a_proj_with_mqa). */
void model_tensor_set_rope_rows(model_tensor *t, int rope, int period, int at);
/* With hf_rope_rows: the file's row of our row `row` of t, and ours of
 * the file's row `file_row` (the identity without). */
size_t model_tensor_rope_file_row(const model_tensor *t, size_t row);
size_t model_tensor_rope_our_row(const model_tensor *t, size_t file_row);

/* The tensor with this name (our spelling; model_layout_match_hf in
 * safetensors.h accepts checkpoint spellings), or NULL; of the slices of a
 * fused file tensor, which share its name, the first in buffer order. */
const model_tensor *model_layout_find(const model_layout *l, const char *name);
/* Sorts l's tensors by name into l->by_name, so that model_layout_find
 * takes log n comparisons (DeepSeek-V3's 45 thousand tensors: a scan for
 * each was a billion); the layout builders call it last. */
zo_status model_layout_index(model_layout *l);

/* The view of `role` in `block`, or NULL when that block has no such role
 * (e.g. LN1_B in LLaMA, LM_HEAD_W when tied, POS_EMB in LLaMA). */
const model_view *model_layout_view(const model_layout *l, int block, model_role role);

/* Block indices. */
static inline int model_layout_layer_block(int layer) { return layer + 1; }
static inline int model_layout_block_layer(int block) { return block - 1; } /* (a layer's block) */
static inline int model_layout_head_block(const model_layout *l) { return l->n_blocks - 1; }

/* Block kind name for messages: "embedding", "layer 3", "head". */
const char *model_layout_block_name(const model_layout *l, int block, char *buf, size_t len);

/* Role name for messages ("qkv_w"). */
const char *model_role_name(model_role r);

/* Whether AdamW decays this tensor: 2-D weight matrices only (the
 * embeddings and linear weights), never norms (Cohere's q/k norm weights
 * are 2-D, a row per head) or biases. */
static inline int model_tensor_decays(const model_tensor *t)
{
    return t->ndim == 2 && t->role != MODEL_ROLE_Q_NORM_W && t->role != MODEL_ROLE_K_NORM_W;
}

#endif
