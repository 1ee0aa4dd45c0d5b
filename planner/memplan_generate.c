/* memplan generate: the bytes generation needs per tier (the weights where
 * they are placed, the key/value cache of a batch and a context, the
 * forward's buffers), whether it fits, and the predicted time per token
 * (docs/memplan.md, "Generation"; the model: planner/generate.c). */
#include <stdio.h>
#include <string.h>

#include "common/fileio.h"      /* defines: zo_file_write_json */
#include "common/plan_schema.h" /* defines: zo_plan, zo_plan_write_json */
#include "common/units.h"       /* defines: zo_format_bytes, zo_parse_int */
#include "planner/generate.h"   /* defines: plan_gen, plan_gen_estimate_run */
#include "planner/memplan_cli.h"

static const char usage_generate[] =
    "usage: memplan generate --model NAME|CONFIG.json [options]\n"
    "\n"
    "Size generation with the runtime's `generate`: the weights where --params places them\n"
    "(resident on the GPU, or streamed from CPU memory or NVMe a block at a time into device\n"
    "slots), the key/value cache of --batch sequences of --prompt + --new-tokens positions,\n"
    "the forward's buffers; the predicted time per token, bound by the slowest of the GPU's\n"
    "work and the links the streamed weights cross, and the time to the first tokens.\n"
    "\n"
    "model and hardware: as 'memplan estimate' (--model, --hw, --gpu, --host, --gpu-mem,\n"
    "  --cpu-mem, --nvme, --pcie; a custom shape with --layers ... --vocab)\n"
    "generation:\n"
    "  --batch N               sequences generated together (default 1)\n"
    "  --prompt N              tokens of the longest prompt (default 128)\n"
    "  --new-tokens N          tokens generated after each prompt (default 128)\n"
    "  --dtype fp16|bf16|fp32  weights, activations and the cache (default bf16; fp16 on V100)\n"
    "  --mla-cache latent|full latent attention (DeepSeek-V2): the compressed latent cache with\n"
    "                          kv_b_proj absorbed (default), or every head's key and value, as\n"
    "                          generate's --mla-cache\n"
    "adapters (generate --adapter DIR):\n"
    "  --lora R [--lora-targets LIST] [--qlora] [--adapters-on gpu|cpu|nvme]\n"
    "                          PEFT adapters of rank R over the base (QLoRA: an NF4 base)\n"
    "placement and buffers:\n"
    "  --params gpu|cpu|nvme   the weights (with --lora: the base) resident or streamed (default gpu)\n"
    "  --prefetch N            streamed blocks loaded ahead (default 2)\n"
    "  --sub-group N           elements a resident store takes a put in (default 1M: its pinned staging)\n"
    "  --cuda-context SIZE, --cublas-workspace SIZE, --fragmentation F  reserved, as 'memplan estimate'\n"
    "output:\n"
    "  --json                  the report as JSON instead of the table\n"
    "  --json-out FILE         the same report written to FILE\n"
    "  --plan-out FILE         a plan for 'generate --plan FILE': placement, batch, context (its\n"
    "                          prompt buffers hold the whole context), dtype, the predicted peaks\n"
    "\n"
    "exit status: 0 fits, 1 does not fit, 2 bad input\n";

enum { OPT_BATCH = OPT_END + 1, OPT_PROMPT, OPT_NEW_TOKENS, OPT_MLA_CACHE };

static const struct option generate_opts[] = {
    MODEL_HW_OPTIONS,
    {"lora", required_argument, 0, OPT_LORA},
    {"lora-targets", required_argument, 0, OPT_LORA_TARGETS},
    {"lora-alpha", required_argument, 0, OPT_LORA_ALPHA},
    {"qlora", no_argument, 0, OPT_QLORA},
    {"adapters-on", required_argument, 0, OPT_ADAPTERS_ON},
    {"dtype", required_argument, 0, OPT_DTYPE},
    {"prefetch", required_argument, 0, OPT_PREFETCH},
    {"sub-group", required_argument, 0, OPT_SUB_GROUP},
    {"cuda-context", required_argument, 0, OPT_CUDA_CONTEXT},
    {"cublas-workspace", required_argument, 0, OPT_CUBLAS_WS},
    {"fragmentation", required_argument, 0, OPT_FRAG},
    {"json", no_argument, 0, OPT_JSON},
    {"json-out", required_argument, 0, OPT_JSON_OUT},
    {"plan-out", required_argument, 0, OPT_PLAN_OUT},
    {"batch", required_argument, 0, OPT_BATCH},
    {"prompt", required_argument, 0, OPT_PROMPT},
    {"new-tokens", required_argument, 0, OPT_NEW_TOKENS},
    {"mla-cache", required_argument, 0, OPT_MLA_CACHE},
    {"help", no_argument, 0, OPT_HELP},
    {"version", no_argument, 0, OPT_VERSION},
    {0, 0, 0, 0},
};

/* The command's own flags, as given. */
typedef struct generate_flags {
    long batch, prompt, new_tokens;
    int mla_full_cache; /* --mla-cache full */
    const char *plan_out;
} generate_flags;

static int generate_flag(int c, const char *arg, void *own, zo_status *st)
{
    generate_flags *g = own;
    switch (c) {
    case OPT_BATCH: *st = zo_plan_flag_int(arg, "--batch", "training.micro_batch", &g->batch); return 1;
    case OPT_PROMPT: *st = zo_parse_int(arg, "--prompt", 1, 1L << 24, &g->prompt); return 1;
    case OPT_NEW_TOKENS: *st = zo_parse_int(arg, "--new-tokens", 1, 1L << 24, &g->new_tokens); return 1;
    case OPT_PLAN_OUT: g->plan_out = arg; return 1;
    case OPT_MLA_CACHE:
        if (strcmp(arg, "latent") && strcmp(arg, "full"))
            *st = zo_error(ZO_ERR_INVALID, "--mla-cache %s: expected latent or full", arg);
        g->mla_full_cache = !strcmp(arg, "full");
        return 1;
    default: return 0;
    }
}

/* The generation of the flags: the hardware's dtype default, then every flag. */
static zo_status configure(const cli_flags *f, const generate_flags *gf, const zo_model_config *m,
                           const plan_hw *hw, plan_gen *g)
{
    plan_gen_defaults(g);
    plan_train t;
    plan_train_defaults(&t, m);
    plan_train_fit_hw(&t, hw); /* V100: fp16 */
    g->dtype = f->seen[OPT_DTYPE] ? f->dtype : t.dtype;
    if (gf->batch) g->batch = (int)gf->batch;
    if (gf->prompt) g->prompt = (int)gf->prompt;
    if (gf->new_tokens) g->new_tokens = (int)gf->new_tokens;
    g->mla_full_cache = gf->mla_full_cache;
    g->params_on = f->params_on;
    if (f->seen[OPT_PREFETCH]) g->prefetch_depth = f->buf.prefetch_depth;
    if (f->seen[OPT_SUB_GROUP]) g->sub_group = f->buf.sub_group;
    if (f->seen[OPT_CUDA_CONTEXT]) g->cuda_context = f->buf.cuda_context;
    if (f->seen[OPT_CUBLAS_WS]) g->cublas_workspace = f->buf.cublas_workspace;
    if (f->seen[OPT_FRAG]) g->fragmentation = f->buf.fragmentation;
    zo_status st = apply_method_flags(&f->mf, &t);
    if (st != ZO_OK) return st;
    g->method = t.method;
    g->lora = t.lora;
    g->adapters_on = t.adapters_on;
    return ZO_OK;
}

/* ---- the report ------------------------------------------------------------------------ */

static void print_table(const zo_model_config *m, const plan_gen *g, const plan_gen_estimate *e)
{
    char b1[32], b2[32], tg[128];
    printf("\ngeneration: %s%s%s%s, %d sequence(s), a prompt of %d + %d new tokens = a context of %d, %s; "
           "weights%s on %s%s",
           m->name, m->mm_text ? " (" : "", m->mm_text ? ZO_MM_TEXT_NOTE : "", m->mm_text ? ")" : "", g->batch, g->prompt, g->new_tokens, e->context, zo_dtype_name(g->dtype),
           g->method != ZO_PLAN_FULL ? " (the base)" : "", zo_plan_tier_name(g->params_on),
           g->params_on != ZO_PLAN_GPU ? " (streamed" : "");
    if (g->params_on != ZO_PLAN_GPU) printf(", prefetch %d)", g->prefetch_depth);
    if (g->method != ZO_PLAN_FULL)
        printf("; %s r %d on %s, adapters on %s", zo_plan_method_name(g->method), g->lora.r,
               zo_lora_targets_str(g->lora.targets, tg, sizeof tg), zo_plan_tier_name(g->adapters_on));
    printf("\n\n  %-6s %-40s %14s\n", "tier", "what", "bytes");
    for (int t = 0; t < ZO_PLAN_TIERS; t++)
        for (int i = 0; i < e->n_items; i++)
            if (e->items[i].tier == (zo_plan_tier)t)
                printf("  %-6s %-40s %14s\n", zo_plan_tier_name((zo_plan_tier)t), e->items[i].name,
                       zo_format_bytes(e->items[i].bytes, b1, sizeof b1));
    printf("\n  total ");
    for (int t = 0; t < ZO_PLAN_TIERS; t++)
        printf(" %s %s of %s%s", zo_plan_tier_name((zo_plan_tier)t), zo_format_bytes(e->total[t], b1, sizeof b1),
               zo_format_bytes(e->capacity[t], b2, sizeof b2), t + 1 < ZO_PLAN_TIERS ? "," : "\n");
    if (m->mla.kv_rank && !g->mla_full_cache)
        printf("  latent cache: %s (%d layers x %d x %d positions x (%d + %d) [k_pe | c_kv]); a token reads %s of "
               "it on average\n", zo_format_bytes(e->kv_cache, b1, sizeof b1), m->n_layers, g->batch, e->context,
               m->mla.qk_rope, m->mla.kv_rank, zo_format_bytes(e->kv_read, b2, sizeof b2));
    else
        printf("  key/value cache: %s (2 x %d layers x %d x %d positions x %d kv heads x %d); a token reads %s of it "
               "on average\n", zo_format_bytes(e->kv_cache, b1, sizeof b1), m->n_layers, g->batch, e->context,
               m->n_kv_heads, m->head_dim, zo_format_bytes(e->kv_read, b2, sizeof b2));
    if (m->moe.experts)
        printf("  experts: %d a layer, %d a token: a token's forward of %d sequence(s) touches up to min(%d, %d x %d) "
               "= %d a layer, the prompts' %d (memplan's bound); %s\n", m->moe.experts, m->moe.top_k, g->batch,
               m->moe.experts, g->batch, m->moe.top_k, e->experts_token, e->experts_prompt,
               e->experts_apart ? "streamed apart from host: a forward copies the dense parts and those experts"
               : g->params_on == ZO_PLAN_GPU && g->adapters_on == ZO_PLAN_GPU ? "resident: a forward reads those experts"
                                                                                : "streamed in whole layers");
    printf("\nverdict: %s", e->fits ? "fits" : "does NOT fit:");
    for (int t = 0; t < ZO_PLAN_TIERS && !e->fits; t++)
        if (e->total[t] > e->capacity[t])
            printf(" %s needs %s of %s", zo_plan_tier_name((zo_plan_tier)t),
                   zo_format_bytes(e->total[t], b1, sizeof b1), zo_format_bytes(e->capacity[t], b2, sizeof b2));
    printf("\ntime per token: %.4g s, %.4g tokens/s (%d sequence(s)); bound by %s: the GPU's work %.4g s, "
           "%s of streamed weights %.4g s%s; the logits wait at each token's end adds %.3g s\n",
           e->s_per_token, e->tokens_per_s, g->batch, e->bound, e->compute_s,
           zo_format_bytes(e->stream_bytes, b1, sizeof b1), e->link_s,
           e->nvme_bytes ? " (read from NVMe, then over PCIe)" : e->stream_bytes ? " (over PCIe)" : "", e->stall_s);
    printf("time to first token: %.4g s (the prompts' forward, its first blocks loaded before it starts)\n",
           e->ttft_s);
    if (e->longrope_rows)
        printf("longrope: the context passes original_max_position_embeddings %d: once, a forward over every "
               "token so far (%d a sequence) with long_factor recomputes the cache, %.4g s\n",
               m->rope_original_max, e->longrope_rows, e->longrope_s);
}

static cJSON *report_json(const zo_model_config *m, const plan_hw *hw, const plan_hw_basis *basis,
                          const plan_gen *g, const plan_gen_estimate *e)
{
    cJSON *o = cJSON_CreateObject(), *x;
    cJSON_AddStringToObject(o, "model", m->name);
    cJSON_AddBoolToObject(o, "text_model_of_multimodal", m->mm_text); /* the plan schema's key */
    cJSON *hwo = cJSON_AddObjectToObject(o, "hardware");
    cJSON_AddStringToObject(hwo, "name", hw->name);
    cJSON_AddItemToObject(hwo, "basis", plan_hw_basis_json(hw, basis));
    x = cJSON_AddObjectToObject(o, "generation");
    cJSON_AddNumberToObject(x, "batch", g->batch);
    cJSON_AddNumberToObject(x, "prompt", g->prompt);
    cJSON_AddNumberToObject(x, "new_tokens", g->new_tokens);
    cJSON_AddNumberToObject(x, "context", e->context);
    cJSON_AddStringToObject(x, "dtype", zo_dtype_name(g->dtype));
    cJSON_AddStringToObject(x, "method", zo_plan_method_name(g->method));
    cJSON_AddStringToObject(x, "params_on", zo_plan_tier_name(g->params_on));
    cJSON_AddStringToObject(x, "adapters_on", zo_plan_tier_name(g->adapters_on));
    cJSON_AddNumberToObject(x, "prefetch_depth", g->prefetch_depth);
    cJSON *items = cJSON_AddArrayToObject(o, "items");
    for (int i = 0; i < e->n_items; i++) {
        cJSON *it = cJSON_CreateObject();
        cJSON_AddStringToObject(it, "name", e->items[i].name);
        cJSON_AddStringToObject(it, "tier", zo_plan_tier_name(e->items[i].tier));
        cJSON_AddStringToObject(it, "kind", plan_kind_name(e->items[i].kind));
        cJSON_AddNumberToObject(it, "bytes", (double)e->items[i].bytes);
        cJSON_AddItemToArray(items, it);
    }
    cJSON *tot = cJSON_AddObjectToObject(o, "total_bytes"), *cap = cJSON_AddObjectToObject(o, "capacity_bytes");
    for (int t = 0; t < ZO_PLAN_TIERS; t++) {
        cJSON_AddNumberToObject(tot, zo_plan_tier_name((zo_plan_tier)t), (double)e->total[t]);
        cJSON_AddNumberToObject(cap, zo_plan_tier_name((zo_plan_tier)t), (double)e->capacity[t]);
    }
    cJSON_AddBoolToObject(o, "fits", e->fits);
    cJSON_AddNumberToObject(o, "kv_cache_bytes", (double)e->kv_cache);
    if (m->mla.kv_rank) cJSON_AddStringToObject(o, "mla_cache", g->mla_full_cache ? "full" : "latent");
    cJSON_AddNumberToObject(o, "weight_bytes", (double)e->weight_bytes);
    cJSON_AddNumberToObject(o, "stream_bytes_per_token", (double)e->stream_bytes);
    if (m->moe.experts) {
        x = cJSON_AddObjectToObject(o, "experts");
        cJSON_AddNumberToObject(x, "per_layer", m->moe.experts);
        cJSON_AddNumberToObject(x, "top_k", m->moe.top_k);
        cJSON_AddNumberToObject(x, "touched_per_token", e->experts_token);
        cJSON_AddNumberToObject(x, "touched_prompt", e->experts_prompt);
        cJSON_AddBoolToObject(x, "streamed_apart", e->experts_apart);
    }
    x = cJSON_AddObjectToObject(o, "time");
    cJSON_AddNumberToObject(x, "s_per_token", e->s_per_token);
    cJSON_AddNumberToObject(x, "tokens_per_s", e->tokens_per_s);
    cJSON_AddNumberToObject(x, "pace_s", e->pace_s);
    cJSON_AddNumberToObject(x, "stall_s", e->stall_s);
    cJSON_AddNumberToObject(x, "compute_s", e->compute_s);
    cJSON_AddNumberToObject(x, "link_s", e->link_s);
    cJSON_AddStringToObject(x, "bound", e->bound);
    cJSON_AddNumberToObject(x, "time_to_first_token_s", e->ttft_s);
    if (e->longrope_rows) {
        cJSON_AddNumberToObject(x, "longrope_rows", e->longrope_rows);
        cJSON_AddNumberToObject(x, "longrope_recompute_s", e->longrope_s);
    }
    return o;
}

/* --plan-out: the schema's plan of the generation (training.seq the context,
 * micro_batch the batch), its prediction with prompt buffers of the whole
 * context, as `generate --plan` allocates them. */
static zo_status write_plan(const char *path, const zo_model_config *m, const plan_hw *hw, const plan_gen *g)
{
    plan_gen full = *g;
    plan_gen_estimate e;
    full.prompt_buffers = g->prompt + g->new_tokens;
    zo_status st = plan_gen_estimate_run(m, hw, &full, &e);
    if (st != ZO_OK) return st;
    zo_plan p;
    zo_plan_defaults(&p, m);
    p.has_hardware = 1;
    p.hardware = *hw;
    p.training.seq = g->prompt + g->new_tokens;
    p.training.micro_batch = g->batch;
    p.training.dtype = p.training.grad_dtype = g->dtype;
    p.training.method = g->method;
    p.training.has_lora = g->method != ZO_PLAN_FULL;
    p.training.lora = g->lora;
    p.placement.params = g->params_on;
    p.placement.adapters = g->method != ZO_PLAN_FULL ? g->adapters_on : ZO_PLAN_GPU;
    p.buffers.prefetch_depth = g->prefetch_depth;
    p.buffers.cuda_context = g->cuda_context;
    p.buffers.cublas_workspace = g->cublas_workspace;
    p.buffers.fragmentation = g->fragmentation;
    p.nvme.sub_group = g->sub_group;
    p.has_predicted = 1;
    for (int t = 0; t < ZO_PLAN_TIERS; t++) {
        p.predicted.peak_bytes[t] = e.total[t];
        p.predicted.capacity_bytes[t] = e.capacity[t];
        p.predicted.alloc_bytes[t] = e.total[t] - e.reserved[t];
    }
    p.predicted.has_alloc = 1;
    p.predicted.fits = e.fits;
    /* a token's time of the generation as asked (the whole context's buffers change no time) */
    plan_gen_estimate asked;
    if ((st = plan_gen_estimate_run(m, hw, g, &asked)) != ZO_OK) return st;
    p.predicted.step_s = asked.s_per_token;
    p.predicted.tokens_per_s = asked.tokens_per_s;
    cJSON *doc;
    if ((st = zo_plan_write_json(&p, path, &doc)) != ZO_OK) return st;
    st = zo_file_write_json(path, doc);
    cJSON_Delete(doc);
    return st;
}

int cmd_generate(int argc, char **argv)
{
    static const cli_command cmd = {"generate", usage_generate, generate_opts, 1, 1, generate_flag};
    cli_flags f;
    generate_flags gf = {0};
    int rc = cli_parse(&cmd, argc, argv, &f, &gf);
    if (rc != CLI_PARSED) return rc;
    zo_model_config m;
    plan_hw hw;
    plan_hw_basis basis;
    plan_gen g;
    plan_gen_estimate e;
    zo_status st;
    if ((st = build_model(f.model, f.params_n, &f.sf, 0, &m)) != ZO_OK || (st = build_hw(&f.hwf, &hw, &basis)) != ZO_OK ||
        (st = configure(&f, &gf, &m, &hw, &g)) != ZO_OK || (st = plan_gen_estimate_run(&m, &hw, &g, &e)) != ZO_OK)
        return fail();
    if (f.json || f.json_out) {
        if (emit_json(report_json(&m, &hw, &basis, &g, &e), f.json, f.json_out) != ZO_OK) return fail();
    }
    if (!f.json) {
        plan_report_basis(stdout, &hw, &basis);
        print_table(&m, &g, &e);
    }
    if (gf.plan_out) {
        if (write_plan(gf.plan_out, &m, &hw, &g) != ZO_OK) return fail();
        if (!f.json) printf("\nplan written to %s (generate --plan %s)\n", gf.plan_out, gf.plan_out);
    }
    return e.fits ? 0 : EXIT_NOFIT;
}
