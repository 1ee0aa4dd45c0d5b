#include "plan_schema.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h" /* defines: zo_file_read_all */
#include "common/units.h"  /* defines: zo_parse_int, zo_parse_double, zo_parse_size */

/* ---- the table -------------------------------------------------------------------- */

typedef enum ftype {
    F_INT,   /* int, an integer in [lo, hi] */
    F_U64,   /* uint64_t, an integer in [lo, hi] */
    F_DBL,   /* double in [lo, hi] */
    F_FLT,   /* float in [lo, hi] */
    F_BOOL,  /* int 0/1, JSON true/false */
    F_STR,   /* char[size] */
    F_NAME,  /* an int-sized enum, one of `names` (its index) */
    F_DTYPE, /* zo_dtype by its name */
    F_TARGETS, /* unsigned ZO_LORA_* bits, written as "q,v" or "all-linear" */
} ftype;

enum {
    F_SHAPE = 1 << 0,     /* the model's shape (a field, or a section of them): absent for a
                             model known only by its size */
    F_COMPARE = 1 << 1,   /* compared with the run's model (zo_plan_check_run) */
    F_SIZE_ONLY = 1 << 2, /* model.params_only: present only for a size-only model */
    F_DERIVED = 1 << 3,   /* model.params: written from the shape, checked against it */
    F_OPTIONAL = 1 << 4,  /* may be absent (plans written before it): then 0, its default */
};

typedef struct field {
    const char *key;
    ftype type;
    size_t off;  /* in the section's struct */
    size_t size; /* F_STR: the buffer */
    double lo, hi;
    const char *const *names; /* F_NAME: NULL-terminated */
    unsigned flags;
} field;

#define P2(n) ((double)(1ull << (n)))
#define INT(s, k, lo, hi, fl) {#k, F_INT, offsetof(s, k), 0, lo, hi, NULL, fl}
#define U64(s, k, lo, hi) {#k, F_U64, offsetof(s, k), 0, lo, hi, NULL, 0}
#define DBL(s, k, lo, hi) {#k, F_DBL, offsetof(s, k), 0, lo, hi, NULL, 0}
#define BOOL(s, k, fl) {#k, F_BOOL, offsetof(s, k), 0, 0, 1, NULL, fl}
#define STR(s, k, fl) {#k, F_STR, offsetof(s, k), sizeof(((s *)0)->k), 0, 0, NULL, fl}
#define NAME(s, k, n, fl) {#k, F_NAME, offsetof(s, k), 0, 0, 0, n, fl}
#define DTYPE(s, k) {#k, F_DTYPE, offsetof(s, k), 0, 0, 0, NULL, 0}
#define FLT(s, k, lo, hi) {#k, F_FLT, offsetof(s, k), 0, lo, hi, NULL, 0}

static const char *const arch_names[] = {"gpt", "llama", NULL};
static const char *const pos_names[] = {"arch", "rotary", "alibi", "learned", NULL}; /* zo_pos */

#define M zo_model_config
static const field model_fields[] = {
    STR(M, name, 0),
    {"params", F_U64, 0, 0, 1, P2(53), NULL, F_DERIVED},
    {"params_only", F_U64, offsetof(M, params_override), 0, 1, P2(53), NULL, F_SIZE_ONLY},
    /* params counts a multimodal checkpoint's text model, its vision tower left out (mm_text) */
    {"text_model_of_multimodal", F_BOOL, offsetof(M, mm_text), 0, 0, 1, NULL, F_OPTIONAL},
    STR(M, family, F_SHAPE),
    NAME(M, arch, arch_names, F_SHAPE | F_COMPARE),
    {"layers", F_INT, offsetof(M, n_layers), 0, 1, P2(20), NULL, F_SHAPE | F_COMPARE},
    INT(M, hidden, 1, P2(24), F_SHAPE | F_COMPARE),
    {"heads", F_INT, offsetof(M, n_heads), 0, 1, P2(20), NULL, F_SHAPE | F_COMPARE},
    {"kv_heads", F_INT, offsetof(M, n_kv_heads), 0, 1, P2(20), NULL, F_SHAPE | F_COMPARE},
    INT(M, head_dim, 1, P2(20), F_SHAPE | F_COMPARE),
    INT(M, ffn, 1, P2(26), F_SHAPE | F_COMPARE),
    INT(M, vocab, 1, P2(26), F_SHAPE | F_COMPARE),
    INT(M, max_seq, 1, P2(24), 0),
    BOOL(M, tied_embeddings, F_SHAPE | F_COMPARE),
    BOOL(M, attn_bias, F_SHAPE | F_COMPARE),
    BOOL(M, out_bias, F_SHAPE | F_COMPARE),
    BOOL(M, norm_bias, F_SHAPE | F_COMPARE),
    {"norm_eps", F_FLT, offsetof(M, norm_eps), 0, 0, 1, NULL, F_SHAPE},
    {"rope_theta", F_FLT, offsetof(M, rope_theta), 0, 0, 1e12, NULL, F_SHAPE},
};

/* What a family adds to the GPT and LLaMA layers (zo_model_config after
 * params_override; all 0 or "" for what the runtime builds). */
static const field features_fields[] = {
    STR(M, act, F_SHAPE),
    {"positions", F_NAME, offsetof(M, pos), 0, 0, 0, pos_names, F_SHAPE | F_COMPARE},
    {"position_offset", F_INT, offsetof(M, pos_offset), 0, 0, P2(24), NULL, F_SHAPE | F_COMPARE},
    INT(M, layer_norms, 0, 64, F_SHAPE | F_COMPARE),
    BOOL(M, parallel_block, F_SHAPE | F_COMPARE),
    BOOL(M, embed_norm, F_SHAPE | F_COMPARE),
    BOOL(M, qk_norm, F_SHAPE | F_COMPARE),
    BOOL(M, head_bias, F_SHAPE | F_COMPARE | F_OPTIONAL),
    BOOL(M, attn_out_nobias, F_SHAPE | F_COMPARE | F_OPTIONAL),
    BOOL(M, qk_norm_heads, F_SHAPE | F_COMPARE | F_OPTIONAL),
    BOOL(M, qk_norm_full, F_SHAPE | F_COMPARE | F_OPTIONAL),
    BOOL(M, post_norms_only, F_SHAPE | F_COMPARE | F_OPTIONAL),
    BOOL(M, attn_sinks, F_SHAPE | F_COMPARE | F_OPTIONAL),
};
#undef M

#define A zo_mla
static const field mla_fields[] = {
    INT(A, q_rank, 0, P2(24), F_SHAPE | F_COMPARE),  INT(A, kv_rank, 0, P2(24), F_SHAPE | F_COMPARE),
    INT(A, qk_nope, 0, P2(20), F_SHAPE | F_COMPARE), INT(A, qk_rope, 0, P2(20), F_SHAPE | F_COMPARE),
    INT(A, v_dim, 0, P2(20), F_SHAPE | F_COMPARE),
};
#undef A

#define E zo_moe
static const field moe_fields[] = {
    INT(E, experts, 0, P2(20), F_SHAPE | F_COMPARE),
    INT(E, top_k, 0, P2(20), F_SHAPE | F_COMPARE),
    INT(E, expert_ffn, 0, P2(26), F_SHAPE | F_COMPARE),
    INT(E, shared_ffn, 0, P2(26), F_SHAPE | F_COMPARE),
    BOOL(E, shared_gate, F_SHAPE | F_COMPARE),
    BOOL(E, router_bias, F_SHAPE | F_COMPARE),
    INT(E, first_dense, 0, P2(20), F_SHAPE | F_COMPARE),
    BOOL(E, norm_topk, F_SHAPE | F_COMPARE | F_OPTIONAL),
    BOOL(E, aux_loss, F_SHAPE | F_COMPARE | F_OPTIONAL),
    {"aux_coef", F_FLT, offsetof(E, aux_coef), 0, 0, 1e6, NULL, F_SHAPE | F_COMPARE | F_OPTIONAL},
    BOOL(E, aux_per_layer, F_SHAPE | F_COMPARE | F_OPTIONAL),
    BOOL(E, seq_aux, F_SHAPE | F_COMPARE | F_OPTIONAL),
    BOOL(E, sparsemixer, F_SHAPE | F_COMPARE | F_OPTIONAL),
    {"jitter_eps", F_FLT, offsetof(E, jitter_eps), 0, 0, 1e6, NULL, F_SHAPE | F_COMPARE | F_OPTIONAL},
    BOOL(E, expert_bias, F_SHAPE | F_COMPARE | F_OPTIONAL),
    BOOL(E, router_logit_bias, F_SHAPE | F_COMPARE | F_OPTIONAL),
    {"glu_limit", F_FLT, offsetof(E, glu_limit), 0, 0, 1e6, NULL, F_SHAPE | F_COMPARE | F_OPTIONAL},
    {"glu_alpha", F_FLT, offsetof(E, glu_alpha), 0, 0, 1e6, NULL, F_SHAPE | F_COMPARE | F_OPTIONAL},
};
#undef E

#define H zo_hw_profile
static const field hw_fields[] = {
    STR(H, name, 0),
    STR(H, gpu, 0),
    INT(H, gpus, 1, P2(24), 0),
    INT(H, gpus_per_node, 1, 1024, 0),
    U64(H, gpu_mem, 1, P2(50)),
    U64(H, cpu_mem, 0, P2(53)),
    U64(H, nvme, 0, P2(53)),
    DBL(H, nvme_read_bw, 0, 1e15),
    DBL(H, nvme_write_bw, 0, 1e15),
    {"nvme_read_bw_busy", F_DBL, offsetof(H, nvme_read_bw_busy), 0, 0, 1e15, NULL, F_OPTIONAL},
    DBL(H, pcie_bw, 0, 1e15),
    DBL(H, nvlink_bw, 0, 1e15),
    {"peers_via_host", F_BOOL, offsetof(H, peers_via_host), 0, 0, 1, NULL, F_OPTIONAL},
    DBL(H, net_bw, 0, 1e15),
    DBL(H, hbm_bw, 0, 1e15),
    DBL(H, peak_flops_16, 0, 1e18),
    DBL(H, peak_flops_32, 0, 1e18),
    DBL(H, cpu_mem_bw, 0, 1e15),
    INT(H, cpu_cores, 0, P2(20), 0),
    DBL(H, gemm_eff_max, 0, 1),
    DBL(H, gemm_flops_half, 0, 1e18),
    DBL(H, hbm_eff, 0, 1),
    DBL(H, coll_eff, 0, 1),
    DBL(H, nvlink_lat, 0, 1),
    DBL(H, net_lat, 0, 1),
    DBL(H, cpu_adam_rate, 0, 1e15),
    DBL(H, cpu_adam_thread_rate, 0, 1e15),
    INT(H, pcie_gen, 0, 6, 0),
    INT(H, pcie_lanes, 0, 32, 0),
    INT(H, measured, 0, 1, 0),
    STR(H, note, 0),
};
#undef H

#define T zo_plan_training
static const field training_fields[] = {
    INT(T, seq, 1, P2(24), 0),
    INT(T, micro_batch, 1, P2(20), 0),
    INT(T, grad_accum, 1, P2(24), 0),
    DTYPE(T, dtype),
    DTYPE(T, grad_dtype),
    NAME(T, optimizer, zo_plan_optimizer_names, 0),
    NAME(T, optim_dtype, zo_plan_opt_state_names, F_OPTIONAL),
    NAME(T, master, zo_plan_master_names, F_OPTIONAL),
    INT(T, loss_chunk, 0, P2(24), F_OPTIONAL),
    NAME(T, recompute, zo_plan_recompute_names, 0),
    INT(T, recompute_layers, 0, P2(20), F_OPTIONAL),
    {"reduce_dtype", F_DTYPE, offsetof(T, reduce_dtype), 0, 0, 0, NULL, F_OPTIONAL},
    BOOL(T, flash_attn, 0),
    BOOL(T, dropout, 0),
    BOOL(T, dp_overlap, 0),
    BOOL(T, fused_grad_accum, 0),
    NAME(T, method, zo_plan_method_names, 0),
    NAME(T, optimizer_schedule, zo_plan_schedule_names, 0),
    INT(T, dpu_warmup, 0, P2(20), 0),
    INT(T, opt_threads, 0, 4096, 0),
    BOOL(T, clip_stale, 0),
};
#undef T

/* training.lora: the adapters of a LoRA or QLoRA plan */
#define LC zo_lora_config
static const field lora_fields[] = {
    INT(LC, r, 1, P2(16), 0),
    FLT(LC, alpha, 1.0 / 64, 1e6),
    {"targets", F_TARGETS, offsetof(LC, targets), 0, 0, 0, NULL, 0},
};
#undef LC

#define R zo_plan_parallel
static const field parallel_fields[] = {
    INT(R, dp, 1, P2(24), 0), INT(R, tp, 1, P2(16), 0), INT(R, pp, 1, P2(16), 0),
    INT(R, vpp, 1, P2(16), 0), BOOL(R, sp, 0), INT(R, ep, 1, P2(16), 0),
    DBL(R, capacity_factor, 0, 64), INT(R, zero, 0, 3, 0),
};
#undef R

#define L zo_plan_placement
static const field placement_fields[] = {
    NAME(L, params, zo_plan_tier_names, 0),
    NAME(L, grads, zo_plan_host_tier_names, 0),
    NAME(L, checkpoints, zo_plan_host_tier_names, 0),
    NAME(L, adapters, zo_plan_tier_names, 0),
};
#undef L

static const field fraction_fields[] = {
    {"gpu", F_DBL, 0 * sizeof(double), 0, 0, 1, NULL, 0},
    {"cpu", F_DBL, 1 * sizeof(double), 0, 0, 1, NULL, 0},
    {"nvme", F_DBL, 2 * sizeof(double), 0, 0, 1, NULL, 0},
};

/* predicted bytes: a model that does not fit may need more than 2^53 */
static const field tier_bytes_fields[] = {
    {"gpu", F_U64, 0 * sizeof(uint64_t), 0, 0, P2(62), NULL, 0},
    {"cpu", F_U64, 1 * sizeof(uint64_t), 0, 0, P2(62), NULL, 0},
    {"nvme", F_U64, 2 * sizeof(uint64_t), 0, 0, P2(62), NULL, 0},
};

#define N zo_plan_nvme
static const field nvme_fields[] = {
    STR(N, dir, 0),
    U64(N, sub_group, 1, P2(50)),
    INT(N, swap_buffers, 1, 64, 0),
};
#undef N

#define B zo_plan_buffers
static const field buffers_fields[] = {
    INT(B, prefetch_depth, 1, ZO_PLAN_MAX_PREFETCH, 0),
    U64(B, comm_bucket_elems, 0, P2(50)),
    INT(B, comm_buckets, 0, 64, 0),
    U64(B, pinned_staging, 0, P2(50)),
    U64(B, cuda_context, 0, P2(50)),
    U64(B, cublas_workspace, 0, P2(50)),
    DBL(B, fragmentation, 0, 1),
};
#undef B

#define D zo_plan_predicted
static const field predicted_fields[] = {
    BOOL(D, fits, 0),
    DBL(D, step_s, 0, 1e15),
    DBL(D, tokens_per_s, 0, 1e18),
    DBL(D, mfu, 0, 1e3),
};
#undef D

/* An object of the plan: its fields, where its struct lives in zo_plan, and
 * whether it may be absent (then has_off is the offset of its has_* flag). */
typedef struct section {
    const char *path;   /* dotted, "" for the top */
    int parent;         /* index in sections[], -1 for the top */
    const field *f;
    size_t n;
    size_t off;
    size_t has_off;     /* NO_FLAG: present whenever its parent is */
    const char *format; /* the object carries "format" (this) and "version" */
    int version;
    unsigned flags;     /* F_SHAPE: absent, with all its children, for a size-only model */
} section;

#define NO_FLAG ((size_t)-1)
#define FIELDS(a) a, sizeof a / sizeof a[0]
#define AT(m) offsetof(zo_plan, m)
enum {
    S_TOP, S_MODEL, S_FEATURES, S_MLA, S_MOE, S_HARDWARE, S_TRAINING, S_LORA, S_PARALLEL, S_PLACEMENT, S_OPTIMIZER, S_NVME,
    S_BUFFERS, S_PREDICTED, S_PEAK, S_CAPACITY, S_ALLOC,
};
/* In the order they are read and written; a parent before its children. */
static const section sections[] = {
    [S_TOP] = {"", -1, NULL, 0, 0, NO_FLAG, ZO_PLAN_FORMAT, ZO_PLAN_VERSION, 0},
    [S_MODEL] = {"model", S_TOP, FIELDS(model_fields), AT(model), NO_FLAG, NULL, 0, 0},
    [S_FEATURES] = {"model.features", S_MODEL, FIELDS(features_fields), AT(model), NO_FLAG, NULL, 0,
                    F_SHAPE},
    [S_MLA] = {"model.features.mla", S_FEATURES, FIELDS(mla_fields), AT(model.mla), NO_FLAG, NULL,
               0, F_SHAPE},
    [S_MOE] = {"model.features.moe", S_FEATURES, FIELDS(moe_fields), AT(model.moe), NO_FLAG, NULL,
               0, F_SHAPE},
    [S_HARDWARE] = {"hardware", S_TOP, FIELDS(hw_fields), AT(hardware), AT(has_hardware),
                    ZO_HW_FORMAT, ZO_HW_VERSION, 0},
    [S_TRAINING] = {"training", S_TOP, FIELDS(training_fields), AT(training), NO_FLAG, NULL, 0, 0},
    [S_LORA] = {"training.lora", S_TRAINING, FIELDS(lora_fields), AT(training.lora),
                AT(training.has_lora), NULL, 0, 0},
    [S_PARALLEL] = {"parallel", S_TOP, FIELDS(parallel_fields), AT(parallel), NO_FLAG, NULL, 0, 0},
    [S_PLACEMENT] = {"placement", S_TOP, FIELDS(placement_fields), AT(placement), NO_FLAG, NULL, 0, 0},
    [S_OPTIMIZER] = {"placement.optimizer", S_PLACEMENT, FIELDS(fraction_fields),
                     AT(placement.optimizer), NO_FLAG, NULL, 0, 0},
    [S_NVME] = {"nvme", S_TOP, FIELDS(nvme_fields), AT(nvme), NO_FLAG, NULL, 0, 0},
    [S_BUFFERS] = {"buffers", S_TOP, FIELDS(buffers_fields), AT(buffers), NO_FLAG, NULL, 0, 0},
    [S_PREDICTED] = {"predicted", S_TOP, FIELDS(predicted_fields), AT(predicted),
                     AT(has_predicted), NULL, 0, 0},
    [S_PEAK] = {"predicted.peak_bytes", S_PREDICTED, FIELDS(tier_bytes_fields),
                AT(predicted.peak_bytes), NO_FLAG, NULL, 0, 0},
    [S_CAPACITY] = {"predicted.capacity_bytes", S_PREDICTED, FIELDS(tier_bytes_fields),
                    AT(predicted.capacity_bytes), NO_FLAG, NULL, 0, 0},
    [S_ALLOC] = {"predicted.alloc_bytes", S_PREDICTED, FIELDS(tier_bytes_fields),
                 AT(predicted.alloc_bytes), AT(predicted.has_alloc), NULL, 0, 0},
};
#define N_SECTIONS (sizeof sections / sizeof sections[0])

_Static_assert(sizeof(zo_arch) == sizeof(int) && sizeof(zo_pos) == sizeof(int) &&
                   sizeof(zo_dtype) == sizeof(int) &&
                   sizeof(zo_plan_tier) == sizeof(int) && sizeof(zo_plan_recompute) == sizeof(int) &&
                   sizeof(zo_plan_optimizer) == sizeof(int) &&
                   sizeof(zo_plan_method) == sizeof(int) && sizeof(zo_plan_schedule) == sizeof(int) &&
                   sizeof(((zo_lora_config *)0)->targets) == sizeof(int),
               "F_NAME and F_DTYPE fields are stored as int");

/* ---- values ------------------------------------------------------------------------- */

static int is_integer_type(ftype t) { return t == F_INT || t == F_U64; }

static void fmt_num(double v, ftype t, char *buf, size_t len)
{
    if (is_integer_type(t) && v == floor(v) && fabs(v) < 1e18) snprintf(buf, len, "%.0f", v);
    else snprintf(buf, len, "%g", v);
}

static double get_num(const field *f, const void *base)
{
    const char *p = (const char *)base + f->off;
    switch (f->type) {
    case F_INT:
    case F_BOOL:
    case F_NAME:
    case F_DTYPE:
    case F_TARGETS: return *(const int *)p;
    case F_U64: return (double)*(const uint64_t *)p;
    case F_DBL: return *(const double *)p;
    case F_FLT: return *(const float *)p;
    case F_STR: break;
    }
    return 0;
}

static void set_num(const field *f, void *base, double v)
{
    char *p = (char *)base + f->off;
    switch (f->type) {
    case F_INT:
    case F_BOOL:
    case F_NAME:
    case F_DTYPE:
    case F_TARGETS: *(int *)p = (int)v; break;
    case F_U64: *(uint64_t *)p = (uint64_t)v; break;
    case F_DBL: *(double *)p = v; break;
    case F_FLT: *(float *)p = (float)v; break;
    case F_STR: break;
    }
}

static size_t n_names(const char *const *names)
{
    size_t n = 0;
    while (names[n]) n++;
    return n;
}

/* The range check of a number, the one message for it (ZO_ERR_INVALID): the
 * reader puts the file and the field before it, a flag its name. */
static zo_status check_number(const field *f, double v)
{
    char sv[48], lo[48], hi[48];
    if (is_integer_type(f->type) && isfinite(v) && v != floor(v))
        return zo_error(ZO_ERR_INVALID, "%g is not an integer", v);
    if (!(v >= f->lo && v <= f->hi)) {
        fmt_num(v, f->type, sv, sizeof sv);
        fmt_num(f->lo, f->type, lo, sizeof lo);
        fmt_num(f->hi, f->type, hi, sizeof hi);
        return zo_error(ZO_ERR_INVALID, "%s is out of range [%s, %s]", sv, lo, hi);
    }
    return ZO_OK;
}

/* A field's value in memory, as the reader would check it. */
static zo_status check_value(const field *f, const void *base, const char *prefix)
{
    const char *p = (const char *)base + f->off;
    int i = *(const int *)p;
    char names[64];
    switch (f->type) {
    case F_STR:
        if (!memchr(p, '\0', f->size))
            return zo_error(ZO_ERR_INVALID, "field \"%s%s\" is not terminated", prefix, f->key);
        return ZO_OK;
    case F_NAME:
        if (i < 0 || (size_t)i >= n_names(f->names)) {
            zo_plan_names_list(f->names, names, sizeof names);
            return zo_error(ZO_ERR_INVALID, "field \"%s%s\" = %d is not one of %s", prefix, f->key,
                            i, names);
        }
        return ZO_OK;
    case F_DTYPE:
        if (i < 0 || i >= ZO_DTYPE_COUNT)
            return zo_error(ZO_ERR_INVALID, "field \"%s%s\" = %d is not a dtype", prefix, f->key, i);
        return ZO_OK;
    case F_BOOL:
        if (i != 0 && i != 1)
            return zo_error(ZO_ERR_INVALID, "field \"%s%s\" = %d is not 0 or 1", prefix, f->key, i);
        return ZO_OK;
    case F_TARGETS:
        if (!(*(const unsigned *)p & ZO_LORA_ALL_LINEAR) || (*(const unsigned *)p & ~ZO_LORA_ALL_LINEAR))
            return zo_error(ZO_ERR_INVALID, "field \"%s%s\" = 0x%x names no target layers", prefix,
                            f->key, *(const unsigned *)p);
        return ZO_OK;
    default:
        if (check_number(f, get_num(f, base)) != ZO_OK)
            return zo_error_wrap(ZO_ERR_INVALID, "field \"%s%s\"", prefix, f->key);
        return ZO_OK;
    }
}

/* ---- defaults and checks --------------------------------------------------------------- */

void zo_plan_defaults(zo_plan *p, const zo_model_config *m)
{
    memset(p, 0, sizeof *p);
    p->model = *m;
    p->training = (zo_plan_training){.seq = m->max_seq > 0 ? m->max_seq : 1,
                                     .micro_batch = 1,
                                     .grad_accum = 1,
                                     .dtype = ZO_DTYPE_BF16,
                                     .grad_dtype = ZO_DTYPE_BF16,
                                     .optimizer = ZO_PLAN_ADAMW,
                                     .recompute = ZO_PLAN_RECOMPUTE_NONE,
                                     .flash_attn = 1,
                                     .dp_overlap = 1,
                                     .method = ZO_PLAN_FULL,
                                     .optimizer_schedule = ZO_PLAN_SCHED_SERIAL,
                                     .dpu_warmup = 10};
    p->parallel = (zo_plan_parallel){.dp = 1, .tp = 1, .pp = 1, .vpp = 1, .ep = 1};
    p->placement.optimizer[ZO_PLAN_GPU] = 1.0;
    snprintf(p->nvme.dir, sizeof p->nvme.dir, "%s", ZO_PLAN_NVME_DIR_PLACEHOLDER);
    p->nvme.sub_group = 1u << 20;
    p->nvme.swap_buffers = 3;
    p->buffers.prefetch_depth = 2;
}

static int skip_field(const field *f, const zo_model_config *m)
{
    if (f->flags & F_DERIVED) return 1;
    if (f->flags & F_SIZE_ONLY) return !m->params_override;
    if (f->flags & F_SHAPE) return m->params_override != 0;
    return 0;
}

/* Whether a section is there, given that its parent is: its has_* flag in
 * the plan `p` (NULL: writing one object alone, no flags), its shape for the
 * model `m` (NULL: not a model's). */
static int section_here(const section *s, const zo_plan *p, const zo_model_config *m)
{
    if (s->has_off != NO_FLAG && p && !*(const int *)((const char *)p + s->has_off)) return 0;
    return !((s->flags & F_SHAPE) && m && m->params_override);
}

static int section_present(const section *s, const zo_plan *p)
{
    for (; s; s = s->parent >= 0 ? &sections[s->parent] : NULL)
        if (!section_here(s, p, &p->model)) return 0;
    return 1;
}

/* The key of a section in its parent ("mla" of "model.features.mla"). */
static const char *section_key(const section *s)
{
    const char *key = strrchr(s->path, '.');
    return key ? key + 1 : s->path;
}

/* Whether section i is the model's or one of its children's. */
static int in_model(int i)
{
    for (; i >= 0; i = sections[i].parent)
        if (i == S_MODEL) return 1;
    return 0;
}

static void field_prefix(const section *s, char *buf, size_t len)
{
    snprintf(buf, len, "%s%s", s->path, s->path[0] ? "." : "");
}

/* training.lora is there exactly for a LoRA or QLoRA plan, and its adapters
 * exist in the model (GPT-2 has no gate); only adapters have a placement of
 * their own. */
static zo_status check_method(const zo_plan_training *t, const zo_plan_placement *pl,
                              const zo_model_config *m)
{
    const char *name = zo_plan_method_name(t->method);
    if (t->method == ZO_PLAN_FULL) {
        if (t->has_lora)
            return zo_error(ZO_ERR_INVALID, "field \"training.lora\" is given but \"training.method\" "
                            "is full (adapters are trained with method lora or qlora)");
        if (pl->adapters != ZO_PLAN_GPU)
            return zo_error(ZO_ERR_INVALID, "field \"placement.adapters\" is %s but "
                            "\"training.method\" is full: a plan without adapters says gpu",
                            zo_plan_tier_name(pl->adapters));
        return ZO_OK;
    }
    if (!t->has_lora)
        return zo_error(ZO_ERR_INVALID, "field \"training.method\" is %s: missing object "
                        "\"training.lora\"", name);
    if (m->params_override)
        return zo_error(ZO_ERR_INVALID, "field \"training.method\" is %s: the adapters need the "
                        "model's shape, and \"model.params_only\" has none", name);
    zo_status st = zo_lora_check(m, &t->lora);
    return st == ZO_OK ? ZO_OK : zo_error_wrap(st, "field \"training.lora\"");
}

/* What no single field says: the shape is sane and has the parameters the
 * file says, the optimizer's fractions sum to 1. */
static zo_status check_whole(zo_plan *p, uint64_t params_read)
{
    zo_status st;
    if ((st = zo_model_config_validate(&p->model)) != ZO_OK) return zo_error_wrap(st, "model");
    uint64_t n = zo_model_params(&p->model);
    if (params_read && params_read != n)
        return zo_error(ZO_ERR_INVALID, "field \"model.params\" = %llu, but the shape has %llu "
                        "parameters", (unsigned long long)params_read, (unsigned long long)n);
    if ((st = zo_plan_fractions_check(p->placement.optimizer, 1, "field \"placement.optimizer\"",
                                      "the fractions")) != ZO_OK)
        return st;
    return check_method(&p->training, &p->placement, &p->model);
}

zo_status zo_plan_check(const zo_plan *p, const char *what)
{
    zo_status st;
    char prefix[64];
    for (size_t i = 0; i < N_SECTIONS; i++) {
        const section *s = &sections[i];
        if (!section_present(s, p)) continue;
        field_prefix(s, prefix, sizeof prefix);
        const void *base = (const char *)p + s->off;
        for (size_t k = 0; k < s->n; k++) {
            if (skip_field(&s->f[k], &p->model)) continue;
            if ((st = check_value(&s->f[k], base, prefix)) != ZO_OK)
                return zo_error_wrap(st, "%s", what);
        }
    }
    zo_plan q = *p; /* validating the shape fills derived fields */
    if ((st = check_whole(&q, 0)) != ZO_OK) return zo_error_wrap(st, "%s", what);
    return ZO_OK;
}

static const field *find_field(const char *name)
{
    for (size_t i = 0; i < N_SECTIONS; i++) {
        size_t n = strlen(sections[i].path);
        if (n && (strncmp(name, sections[i].path, n) || name[n] != '.')) continue;
        const char *key = name + (n ? n + 1 : 0);
        for (size_t k = 0; k < sections[i].n; k++)
            if (!strcmp(sections[i].f[k].key, key)) return &sections[i].f[k];
    }
    return NULL;
}

static int is_number_type(ftype t) { return t == F_INT || t == F_U64 || t == F_DBL || t == F_FLT; }

zo_status zo_plan_field_range(const char *name, double *lo, double *hi)
{
    const field *f = find_field(name);
    if (!f || !is_number_type(f->type))
        return zo_error(ZO_ERR_NOT_FOUND, "plan field \"%s\": no such number", name);
    *lo = f->lo;
    *hi = f->hi;
    return ZO_OK;
}

zo_status zo_plan_field_check(const char *name, double value)
{
    const field *f = find_field(name);
    if (!f || !is_number_type(f->type))
        return zo_error(ZO_ERR_NOT_FOUND, "plan field \"%s\": no such number", name);
    return check_number(f, value);
}

/* A flag's value, parsed, against its field's range. */
static zo_status flag_check(const char *flag, const char *field, double v)
{
    zo_status st = zo_plan_field_check(field, v);
    return st != ZO_OK ? zo_error_wrap(st, "%s", flag) : ZO_OK;
}

zo_status zo_plan_flag_int(const char *s, const char *flag, const char *field, long *out)
{
    zo_status st = zo_parse_int(s, flag, LONG_MIN, LONG_MAX, out);
    return st != ZO_OK ? st : flag_check(flag, field, (double)*out);
}

zo_status zo_plan_flag_double(const char *s, const char *flag, const char *field, double *out)
{
    zo_status st = zo_parse_double(s, flag, -HUGE_VAL, HUGE_VAL, out);
    return st != ZO_OK ? st : flag_check(flag, field, *out);
}

zo_status zo_plan_flag_u64(const char *s, const char *flag, const char *field, int count,
                           uint64_t *out)
{
    zo_status st = count ? zo_parse_count(s, flag, out) : zo_parse_size(s, flag, 1, out);
    return st != ZO_OK ? st : flag_check(flag, field, (double)*out);
}

/* ---- writing ------------------------------------------------------------------------- */

static int add_field(cJSON *o, const field *f, const void *base)
{
    const char *p = (const char *)base + f->off;
    cJSON *v;
    switch (f->type) {
    case F_STR: v = cJSON_CreateString(p); break;
    case F_BOOL: v = cJSON_CreateBool(*(const int *)p); break;
    case F_NAME: v = cJSON_CreateString(f->names[*(const int *)p]); break;
    case F_DTYPE: v = cJSON_CreateString(zo_dtype_name((zo_dtype) * (const int *)p)); break;
    case F_TARGETS: {
        char t[64];
        v = cJSON_CreateString(zo_lora_targets_str(*(const unsigned *)p, t, sizeof t));
        break;
    }
    default: v = cJSON_CreateNumber(get_num(f, base)); break;
    }
    return v && cJSON_AddItemToObject(o, f->key, v);
}

static int add_fields(cJSON *o, const section *s, const void *base, const zo_model_config *m)
{
    if (s->format && (!cJSON_AddStringToObject(o, "format", s->format) ||
                      !cJSON_AddNumberToObject(o, "version", s->version)))
        return 0;
    for (size_t k = 0; k < s->n; k++) {
        const field *f = &s->f[k];
        if (m && skip_field(f, m)) {
            if ((f->flags & F_DERIVED) && !cJSON_AddNumberToObject(o, f->key, (double)zo_model_params(m)))
                return 0;
            continue;
        }
        if (!add_field(o, f, base)) return 0;
    }
    return 1;
}

/* Section i into `o`, its fields then its children, from `base` (the
 * section's struct); `p` and `m` as for section_here. */
static int write_section(cJSON *o, int i, const char *base, const zo_plan *p,
                         const zo_model_config *m)
{
    if (!add_fields(o, &sections[i], base, m)) return 0;
    for (size_t c = 0; c < N_SECTIONS; c++) {
        const section *s = &sections[c];
        if (s->parent != i || !section_here(s, p, m)) continue;
        cJSON *child = cJSON_AddObjectToObject(o, section_key(s));
        if (!child || !write_section(child, (int)c, base + (s->off - sections[i].off), p, m))
            return 0;
    }
    return 1;
}

/* One object alone (a plan, the model, a hardware profile). */
static cJSON *section_json(int i, const void *base, const zo_plan *p, const zo_model_config *m)
{
    cJSON *o = cJSON_CreateObject();
    if (o && !write_section(o, i, base, p, m)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

zo_status zo_plan_write_json(const zo_plan *p, const char *what, cJSON **out)
{
    zo_status st = zo_plan_check(p, what);
    if (st != ZO_OK) return st;
    if (!(*out = section_json(S_TOP, p, p, &p->model)))
        return zo_error(ZO_ERR_NOMEM, "%s: out of memory writing the plan", what);
    return ZO_OK;
}

cJSON *zo_plan_model_write_json(const zo_model_config *m)
{
    return section_json(S_MODEL, m, NULL, m);
}

cJSON *zo_hw_profile_write_json(const zo_hw_profile *hw)
{
    return section_json(S_HARDWARE, hw, NULL, NULL);
}

/* ---- reading ------------------------------------------------------------------------- */

typedef struct reader {
    const char *path;   /* the file, for messages */
    const char *prefix; /* "hardware." */
    unsigned flags;     /* ZO_HW_READ_PARTIAL */
} reader;

static zo_status read_field(const reader *r, const cJSON *o, const field *f, void *base,
                            int required, double *derived)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f->key);
    if (!v) {
        if (!required) return ZO_OK;
        return zo_error(ZO_ERR_FORMAT, "%s: missing field \"%s%s\"", r->path, r->prefix, f->key);
    }
    char *p = (char *)base + f->off;
    char names[64];
    switch (f->type) {
    case F_STR:
        if (!cJSON_IsString(v))
            return zo_error(ZO_ERR_FORMAT, "%s: field \"%s%s\" must be a string", r->path, r->prefix,
                            f->key);
        if (strlen(v->valuestring) >= f->size)
            return zo_error(ZO_ERR_FORMAT, "%s: field \"%s%s\" is longer than %zu bytes", r->path,
                            r->prefix, f->key, f->size - 1);
        memcpy(p, v->valuestring, strlen(v->valuestring) + 1);
        return ZO_OK;
    case F_BOOL:
        if (!cJSON_IsBool(v))
            return zo_error(ZO_ERR_FORMAT, "%s: field \"%s%s\" must be true or false", r->path,
                            r->prefix, f->key);
        *(int *)p = cJSON_IsTrue(v);
        return ZO_OK;
    case F_NAME:
        zo_plan_names_list(f->names, names, sizeof names);
        if (cJSON_IsString(v))
            for (size_t i = 0; f->names[i]; i++)
                if (!strcmp(v->valuestring, f->names[i])) {
                    *(int *)p = (int)i;
                    return ZO_OK;
                }
        return zo_error(ZO_ERR_FORMAT, "%s: field \"%s%s\" must be %s", r->path, r->prefix, f->key,
                        names);
    case F_DTYPE: {
        zo_dtype d;
        if (!cJSON_IsString(v) || zo_dtype_parse(v->valuestring, &d) != ZO_OK)
            return zo_error(ZO_ERR_FORMAT, "%s: field \"%s%s\" must be fp32, fp16 or bf16", r->path,
                            r->prefix, f->key);
        *(int *)p = (int)d;
        return ZO_OK;
    }
    case F_TARGETS: {
        unsigned bits;
        if (!cJSON_IsString(v) || zo_lora_targets_parse(v->valuestring, &bits) != ZO_OK)
            return zo_error(ZO_ERR_FORMAT, "%s: field \"%s%s\" must be a comma-separated list of "
                            "q, k, v, o, gate, up, down, or all-linear", r->path, r->prefix, f->key);
        *(unsigned *)p = bits;
        return ZO_OK;
    }
    default:
        if (!cJSON_IsNumber(v))
            return zo_error(ZO_ERR_FORMAT, "%s: field \"%s%s\" must be a number", r->path, r->prefix,
                            f->key);
        /* the range first: converting a double outside the type's range is undefined */
        if (check_number(f, v->valuedouble) != ZO_OK)
            return zo_error_wrap(ZO_ERR_FORMAT, "%s: field \"%s%s\"", r->path, r->prefix, f->key);
        if (f->flags & F_DERIVED) *derived = v->valuedouble;
        else set_num(f, base, v->valuedouble);
        return ZO_OK;
    }
}

static int is_child(const section *s, const char *key)
{
    size_t n = strlen(s->path);
    for (size_t i = 0; i < N_SECTIONS; i++) {
        const section *c = &sections[i];
        if (c->parent < 0 || &sections[c->parent] != s) continue;
        if (!strcmp(c->path + (n ? n + 1 : 0), key)) return 1;
    }
    return 0;
}

static int is_known(const reader *r, const section *s, const char *key)
{
    for (size_t k = 0; k < s->n; k++)
        if (!strcmp(s->f[k].key, key)) return 1;
    if (s->format && (!strcmp(key, "format") || !strcmp(key, "version"))) return 1;
    if ((r->flags & ZO_HW_READ_PARTIAL) && !strcmp(key, "base")) return 1;
    return is_child(s, key);
}

/* "format" and "version" of an object that carries them. */
static zo_status read_format(const reader *r, const cJSON *o, const section *s)
{
    int required = !(r->flags & ZO_HW_READ_PARTIAL);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const char *hint = s->parent < 0 ? " (not a plan: `memplan estimate --json` prints a report; "
                                       "plans come from `memplan plan --json FILE` and `memplan "
                                       "estimate --plan-out FILE`)"
                                     : "";
    if (!fmt && required)
        return zo_error(ZO_ERR_FORMAT, "%s: missing field \"%sformat\" (\"%s\")%s", r->path,
                        r->prefix, s->format, hint);
    if (fmt && (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, s->format)))
        return zo_error(ZO_ERR_FORMAT, "%s: field \"%sformat\" must be \"%s\"%s", r->path, r->prefix,
                        s->format, hint);
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version");
    if (!ver && required)
        return zo_error(ZO_ERR_FORMAT, "%s: missing field \"%sversion\"", r->path, r->prefix);
    if (ver && (!cJSON_IsNumber(ver) || ver->valuedouble != s->version))
        return zo_error(ZO_ERR_FORMAT, "%s: field \"%sversion\": this reader knows version %d "
                        "of \"%s\" only", r->path, r->prefix, s->version, s->format);
    return ZO_OK;
}

/* One object: its fields (missing ones first), then anything unknown. */
static zo_status read_object(const reader *r, const cJSON *o, const section *s, void *base,
                             const zo_model_config *m, double *derived)
{
    zo_status st;
    if (s->format && (st = read_format(r, o, s)) != ZO_OK) return st;
    for (size_t k = 0; k < s->n; k++) {
        const field *f = &s->f[k];
        /* the shape is required unless model.params_only (read before it) is there */
        int required = !(r->flags & ZO_HW_READ_PARTIAL) && !(f->flags & (F_SIZE_ONLY | F_OPTIONAL)) &&
                       !((f->flags & F_SHAPE) && m->params_override);
        if ((st = read_field(r, o, f, base, required, derived)) != ZO_OK) return st;
    }
    for (const cJSON *c = o->child; c; c = c->next) {
        if (!is_known(r, s, c->string))
            return zo_error(ZO_ERR_FORMAT, "%s: unknown field \"%s%s\"", r->path, r->prefix, c->string);
        /* JSON readers disagree on which of two equal keys counts: neither does */
        for (const cJSON *d = o->child; d != c; d = d->next)
            if (!strcmp(d->string, c->string))
                return zo_error(ZO_ERR_FORMAT, "%s: field \"%s%s\" appears twice", r->path,
                                r->prefix, c->string);
    }
    return ZO_OK;
}

zo_status zo_hw_profile_read_json(const cJSON *o, const char *path, const char *prefix,
                                  unsigned flags, zo_hw_profile *hw)
{
    if (!cJSON_IsObject(o))
        return zo_error(ZO_ERR_FORMAT, "%s: the hardware profile is not an object", path);
    reader r = {path, prefix, flags};
    const section *s = &sections[S_HARDWARE];
    zo_status st = read_object(&r, o, s, hw, NULL, NULL);
    /* a partial profile over a preset (or nothing) must end up complete */
    for (size_t k = 0; k < s->n && st == ZO_OK && (flags & ZO_HW_READ_PARTIAL); k++)
        if ((st = check_value(&s->f[k], hw, prefix)) != ZO_OK) st = zo_error_wrap(ZO_ERR_FORMAT, "%s", path);
    return st;
}

static zo_status parse_json(const char *text, size_t len, const char *path, cJSON **out)
{
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (*out) return ZO_OK;
    int line = 1, col = 1;
    for (const char *p = text; end && p < end && p < text + len; p++) {
        if (*p == '\n') line++, col = 1;
        else col++;
    }
    return zo_error(ZO_ERR_FORMAT, "%s:%d:%d: malformed JSON", path, line, col);
}

zo_status zo_plan_read(const char *text, size_t len, const char *path, zo_plan *out)
{
    cJSON *doc;
    zo_status st = parse_json(text, len, path, &doc);
    if (st != ZO_OK) return st;
    memset(out, 0, sizeof *out);
    if (!cJSON_IsObject(doc)) {
        st = zo_error(ZO_ERR_FORMAT, "%s: a plan is a JSON object", path);
        goto out_free_doc;
    }
    const cJSON *obj[N_SECTIONS] = {doc};
    double params = 0;
    for (size_t i = 0; i < N_SECTIONS && st == ZO_OK; i++) {
        const section *s = &sections[i];
        char prefix[64];
        field_prefix(s, prefix, sizeof prefix);
        if (i != S_TOP) {
            if (!obj[s->parent]) continue; /* an optional parent is absent */
            obj[i] = cJSON_GetObjectItemCaseSensitive(obj[s->parent], section_key(s));
            if (!obj[i]) {
                /* optional, or a size-only model's shape (its model was read first) */
                if (s->has_off != NO_FLAG || !section_here(s, NULL, &out->model)) continue;
                st = zo_error(ZO_ERR_FORMAT, "%s: missing object \"%s\"", path, s->path);
                break;
            }
            if (!cJSON_IsObject(obj[i])) {
                st = zo_error(ZO_ERR_FORMAT, "%s: field \"%s\" must be an object", path, s->path);
                break;
            }
            if (s->has_off != NO_FLAG) *(int *)((char *)out + s->has_off) = 1;
        }
        reader r = {path, prefix, 0};
        st = read_object(&r, obj[i], s, (char *)out + s->off, &out->model, &params);
    }
    if (st == ZO_OK) {
        if (!out->model.family[0])
            snprintf(out->model.family, sizeof out->model.family, "custom");
        if ((st = check_whole(out, (uint64_t)params)) != ZO_OK)
            st = zo_error_wrap(ZO_ERR_FORMAT, "%s", path);
    }
out_free_doc:
    cJSON_Delete(doc);
    return st;
}

zo_status zo_plan_load(const char *path, zo_plan *out)
{
    char *text;
    size_t len;
    zo_status st = zo_file_read_all(path, ZO_PLAN_MAX_BYTES, "a plan", &text, &len);
    if (st != ZO_OK) return st;
    st = zo_plan_read(text, len, path, out);
    free(text);
    return st;
}

/* ---- the run against the plan ---------------------------------------------------------- */

zo_status zo_plan_runtime_check(const zo_plan *p, const char *path)
{
    const zo_plan_training *t = &p->training;
    /* by op: dense layers, every one, their kept outputs on the device (what
     * memplan plans); full fine-tuning, LoRA and QLoRA alike */
    if (t->recompute == ZO_PLAN_RECOMPUTE_OPS && (p->model.moe.experts || p->placement.checkpoints == ZO_PLAN_CPU))
        return zo_error(ZO_ERR_UNSUPPORTED, "%s: field \"training.recompute\" is ops with %s: the runtime "
                        "recomputes by op in dense layers, checkpoints on the GPU "
                        "(plan with --recompute full or none)", path,
                        p->model.moe.experts ? "experts (model.moe)" : "placement.checkpoints cpu");
    const char *key = zo_model_run_gap(&p->model, p->parallel.capacity_factor);
    if (key)
        return zo_error(ZO_ERR_UNSUPPORTED, "%s: field \"%s\" on gpt-oss: the runtime routes gpt-oss dropless "
                        "(plan without --capacity-factor)", path, key);
    return ZO_OK;
}

const char *zo_model_run_gap(const zo_model_config *m, double capacity_factor)
{
    /* gpt-oss: dropless (tf_init's refusal) */
    return zo_model_gpt_oss(m) && capacity_factor > 0 ? "parallel.capacity_factor" : NULL;
}

zo_status zo_plan_check_run(const zo_plan *p, const zo_model_config *m, int world_size,
                            const char *path)
{
    uint64_t want = zo_model_params(&p->model), have = zo_model_params(m);
    if (want != have)
        return zo_error(ZO_ERR_INVALID, "%s: the plan is for model \"%s\" of %llu parameters; the "
                        "run's model \"%s\" has %llu", path, p->model.name,
                        (unsigned long long)want, m->name, (unsigned long long)have);
    for (int i = 0; i < (int)N_SECTIONS && !p->model.params_override; i++) {
        const section *s = &sections[i];
        if (!in_model(i)) continue;
        size_t at = s->off - AT(model); /* the section's struct inside a zo_model_config */
        for (size_t k = 0; k < s->n; k++) {
            const field *f = &s->f[k];
            if (!(f->flags & F_COMPARE)) continue;
            int a = (int)get_num(f, (const char *)&p->model + at), b = (int)get_num(f, (const char *)m + at);
            if (a == b) continue;
            if (f->type == F_NAME)
                return zo_error(ZO_ERR_INVALID, "%s: the plan's %s.%s is %s; the run's model \"%s\" "
                                "has %s", path, s->path, f->key, f->names[a], m->name, f->names[b]);
            return zo_error(ZO_ERR_INVALID, "%s: the plan's %s.%s is %d; the run's model \"%s\" "
                            "has %d", path, s->path, f->key, a, m->name, b);
        }
    }
    long ranks = (long)p->parallel.dp * p->parallel.tp * p->parallel.pp;
    if (ranks != world_size)
        return zo_error(ZO_ERR_INVALID, "%s: the plan is for %ld ranks (parallel.dp %d x tp %d x "
                        "pp %d); this run has %d", path, ranks, p->parallel.dp, p->parallel.tp,
                        p->parallel.pp, world_size);
    return zo_plan_runtime_check(p, path);
}
