#include "planfile.h"
#include "report.h" /* plan_json_add_placement */

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static void add_u64(cJSON *o, const char *k, uint64_t v) { cJSON_AddNumberToObject(o, k, (double)v); }

/* ---- hardware ----------------------------------------------------------------------- */

/* Every numeric field of plan_hw, by name, for writing and reading. */
typedef struct hw_field {
    const char *key;
    size_t off;
    char type; /* 'd' double, 'i' int, 'u' uint64 */
} hw_field;

#define F(k, t) {#k, offsetof(plan_hw, k), t}
static const hw_field hw_fields[] = {
    F(gpus, 'i'), F(gpus_per_node, 'i'), F(gpu_mem, 'u'), F(cpu_mem, 'u'), F(nvme, 'u'),
    F(nvme_read_bw, 'd'), F(nvme_write_bw, 'd'), F(pcie_bw, 'd'), F(nvlink_bw, 'd'),
    F(net_bw, 'd'), F(hbm_bw, 'd'), F(peak_flops_16, 'd'), F(peak_flops_32, 'd'),
    F(cpu_mem_bw, 'd'), F(cpu_cores, 'i'), F(gemm_eff_max, 'd'), F(gemm_flops_half, 'd'),
    F(hbm_eff, 'd'), F(coll_eff, 'd'), F(nvlink_lat, 'd'), F(net_lat, 'd'),
    F(cpu_adam_rate, 'd'), F(measured, 'i'),
};
#undef F

cJSON *plan_hw_json(const plan_hw *hw)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "format", PLAN_HW_FORMAT);
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddStringToObject(o, "name", hw->name);
    cJSON_AddStringToObject(o, "gpu", hw->gpu);
    for (size_t i = 0; i < sizeof hw_fields / sizeof hw_fields[0]; i++) {
        const char *p = (const char *)hw + hw_fields[i].off;
        double v = hw_fields[i].type == 'd'   ? *(const double *)p
                   : hw_fields[i].type == 'i' ? *(const int *)p
                                              : (double)*(const uint64_t *)p;
        cJSON_AddNumberToObject(o, hw_fields[i].key, v);
    }
    cJSON_AddStringToObject(o, "note", hw->note);
    return o;
}

static zo_status copy_str(const cJSON *o, const char *key, const char *path, char *dst, size_t len)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return ZO_OK;
    if (!cJSON_IsString(v))
        return zo_error(ZO_ERR_FORMAT, "%s: field \"%s\" must be a string", path, key);
    snprintf(dst, len, "%s", v->valuestring);
    return ZO_OK;
}

zo_status plan_hw_from_json(const cJSON *o, const char *path, plan_hw *hw)
{
    zo_status st;
    if (!cJSON_IsObject(o)) return zo_error(ZO_ERR_FORMAT, "%s: the hardware is not an object", path);
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(o, "base");
    if (base) {
        if (!cJSON_IsString(base))
            return zo_error(ZO_ERR_FORMAT, "%s: field \"base\" must be a preset name", path);
        if ((st = plan_hw_find(base->valuestring, hw)) != ZO_OK)
            return zo_error_wrap(st, "%s: field \"base\"", path);
    }
    if ((st = copy_str(o, "name", path, hw->name, sizeof hw->name)) ||
        (st = copy_str(o, "gpu", path, hw->gpu, sizeof hw->gpu)) ||
        (st = copy_str(o, "note", path, hw->note, sizeof hw->note)))
        return st;
    for (size_t i = 0; i < sizeof hw_fields / sizeof hw_fields[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, hw_fields[i].key);
        if (!v) continue;
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
            return zo_error(ZO_ERR_FORMAT, "%s: field \"%s\" must be a number >= 0", path,
                            hw_fields[i].key);
        char *p = (char *)hw + hw_fields[i].off;
        if (hw_fields[i].type == 'd') *(double *)p = v->valuedouble;
        else if (hw_fields[i].type == 'i') *(int *)p = (int)v->valuedouble;
        else *(uint64_t *)p = (uint64_t)v->valuedouble;
    }
    if (hw->gpus < 1 || hw->gpus_per_node < 1 || hw->gpu_mem == 0)
        return zo_error(ZO_ERR_FORMAT, "%s: \"gpus\", \"gpus_per_node\" and \"gpu_mem\" must be "
                                       "positive", path);
    return ZO_OK;
}

static zo_status parse_doc(const char *text, const char *path, cJSON **out)
{
    const char *end = NULL;
    *out = cJSON_ParseWithOpts(text, &end, 0);
    if (*out) return ZO_OK;
    int line = 1, col = 1;
    for (const char *p = text; end && p < end && *p; p++) {
        if (*p == '\n') line++, col = 1;
        else col++;
    }
    return zo_error(ZO_ERR_FORMAT, "%s:%d:%d: malformed JSON", path, line, col);
}

zo_status plan_hw_parse(const char *text, const char *path, plan_hw *hw)
{
    cJSON *doc;
    zo_status st = parse_doc(text, path, &doc);
    if (st) return st;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(doc, "format");
    const cJSON *o = doc;
    if (cJSON_IsString(fmt) && !strcmp(fmt->valuestring, PLAN_FILE_FORMAT))
        o = cJSON_GetObjectItemCaseSensitive(doc, "hardware");
    else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, PLAN_HW_FORMAT))
        st = zo_error(ZO_ERR_FORMAT, "%s: field \"format\" must be \"%s\"", path, PLAN_HW_FORMAT);
    if (!st) st = plan_hw_from_json(o, path, hw);
    cJSON_Delete(doc);
    return st;
}

/* ---- plans ---------------------------------------------------------------------------- */

cJSON *plan_file_json(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                      const plan_estimate *e, const plan_time *pt)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "format", PLAN_FILE_FORMAT);
    cJSON_AddNumberToObject(root, "version", PLAN_FILE_VERSION);

    cJSON_AddItemToObject(root, "model", plan_json_model(m));

    cJSON_AddItemToObject(root, "hardware", plan_hw_json(hw));

    cJSON *jt = cJSON_AddObjectToObject(root, "training");
    cJSON_AddNumberToObject(jt, "seq", t->seq);
    cJSON_AddNumberToObject(jt, "micro_batch", t->micro_batch);
    cJSON_AddNumberToObject(jt, "grad_accum", t->grad_accum);
    cJSON_AddNumberToObject(jt, "global_batch", (double)t->micro_batch * t->grad_accum * t->dp);
    cJSON_AddStringToObject(jt, "dtype", zo_dtype_name(t->dtype));
    cJSON_AddStringToObject(jt, "grad_dtype", zo_dtype_name(t->grad_dtype));
    cJSON_AddStringToObject(jt, "optimizer", t->optimizer == PLAN_OPT_ADAMW ? "adamw" : "sgd");
    cJSON_AddStringToObject(jt, "recompute", plan_recompute_name(t->recompute));
    cJSON_AddBoolToObject(jt, "flash_attn", t->flash_attn);
    cJSON_AddBoolToObject(jt, "dropout", t->dropout);

    cJSON *jp = cJSON_AddObjectToObject(root, "parallel");
    cJSON_AddNumberToObject(jp, "dp", t->dp);
    cJSON_AddNumberToObject(jp, "tp", t->tp);
    cJSON_AddNumberToObject(jp, "pp", t->pp);
    cJSON_AddNumberToObject(jp, "vpp", t->vpp);
    cJSON_AddBoolToObject(jp, "sp", t->sp);
    cJSON_AddNumberToObject(jp, "ep", t->ep);
    cJSON_AddNumberToObject(jp, "capacity_factor", t->capacity_factor);
    cJSON_AddNumberToObject(jp, "zero", t->zero);
    cJSON_AddStringToObject(jp, "schedule", t->vpp > 1 ? "interleaved-1f1b" : "1f1b");

    plan_json_add_placement(root, t);

    cJSON *jn = cJSON_AddObjectToObject(root, "nvme");
    cJSON_AddStringToObject(jn, "dir", PLAN_NVME_DIR_PLACEHOLDER);
    cJSON_AddBoolToObject(jn, "used", t->params_on == PLAN_NVME || t->opt_frac[PLAN_NVME] > 0);
    add_u64(jn, "sub_group", t->buf.sub_group);
    cJSON_AddNumberToObject(jn, "swap_buffers", t->buf.swap_buffers);

    cJSON *jb = cJSON_AddObjectToObject(root, "buffers");
    cJSON_AddNumberToObject(jb, "prefetch_depth", t->buf.prefetch_depth);
    add_u64(jb, "comm_bucket_elems", t->buf.comm_bucket);
    cJSON_AddNumberToObject(jb, "comm_buckets", t->buf.comm_buckets);
    add_u64(jb, "pinned_staging", t->buf.pinned_staging);
    add_u64(jb, "cuda_context", t->buf.cuda_context);
    add_u64(jb, "cublas_workspace", t->buf.cublas_workspace);
    cJSON_AddNumberToObject(jb, "fragmentation", t->buf.fragmentation);
    add_u64(jb, "largest_block_elems", e->largest_block);

    cJSON *jr = cJSON_AddObjectToObject(root, "predicted");
    cJSON *peak = cJSON_AddObjectToObject(jr, "peak_bytes");
    cJSON *cap = cJSON_AddObjectToObject(jr, "capacity_bytes");
    for (int i = 0; i < PLAN_TIERS; i++) {
        add_u64(peak, plan_tier_name((plan_tier)i), e->total[i]);
        add_u64(cap, plan_tier_name((plan_tier)i), e->capacity[i]);
    }
    cJSON *kinds = cJSON_AddObjectToObject(jr, "bytes");
    for (int i = 0; i < PLAN_TIERS; i++) {
        cJSON *k = cJSON_AddObjectToObject(kinds, plan_tier_name((plan_tier)i));
        for (int j = 0; j < PLAN_KINDS; j++)
            add_u64(k, plan_kind_name((plan_kind)j), e->bytes[i][j]);
    }
    cJSON_AddNumberToObject(jr, "pipeline_stage", e->stage);
    add_u64(jr, "rank_params", e->rank_params);
    cJSON_AddBoolToObject(jr, "fits", e->fits);
    if (pt) {
        cJSON_AddNumberToObject(jr, "step_s", pt->step);
        cJSON_AddNumberToObject(jr, "tokens_per_s", pt->tokens_per_s);
        cJSON_AddNumberToObject(jr, "mfu", pt->mfu);
        cJSON *parts = cJSON_AddObjectToObject(jr, "parts");
        for (int i = 0; i < PLAN_TIME_PARTS; i++)
            cJSON_AddNumberToObject(parts, plan_time_part_name(i), plan_time_part(pt, i));
    }
    return root;
}

/* ---- reading a plan back -------------------------------------------------------------- */

typedef struct reader {
    const char *path;
    zo_status st;
} reader;

static const cJSON *obj(reader *r, const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!r->st && !cJSON_IsObject(v))
        r->st = zo_error(ZO_ERR_FORMAT, "%s: missing object \"%s\"", r->path, key);
    return v;
}

static double num(reader *r, const cJSON *o, const char *sect, const char *key, double lo,
                  double hi)
{
    if (r->st) return 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) {
        r->st = zo_error(ZO_ERR_FORMAT, "%s: missing field \"%s.%s\"", r->path, sect, key);
        return 0;
    }
    double x = cJSON_IsBool(v) ? (cJSON_IsTrue(v) ? 1 : 0) : v->valuedouble;
    if ((!cJSON_IsNumber(v) && !cJSON_IsBool(v)) || !(x >= lo && x <= hi)) {
        r->st = zo_error(ZO_ERR_FORMAT, "%s: field \"%s.%s\" must be a number in [%g, %g]",
                         r->path, sect, key, lo, hi);
        return 0;
    }
    return x;
}

static const char *str(reader *r, const cJSON *o, const char *sect, const char *key)
{
    if (r->st) return "";
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v)) {
        r->st = zo_error(ZO_ERR_FORMAT, "%s: field \"%s.%s\" must be a string", r->path, sect, key);
        return "";
    }
    return v->valuestring;
}

static plan_tier tier(reader *r, const cJSON *o, const char *sect, const char *key)
{
    const char *s = str(r, o, sect, key);
    if (r->st) return PLAN_GPU;
    for (int i = 0; i < PLAN_TIERS; i++)
        if (!strcmp(s, plan_tier_name((plan_tier)i))) return (plan_tier)i;
    r->st = zo_error(ZO_ERR_FORMAT, "%s: field \"%s.%s\": '%s' is not gpu, cpu or nvme", r->path,
                     sect, key, s);
    return PLAN_GPU;
}

zo_status plan_file_parse(const char *text, const char *path, zo_model_config *m, plan_hw *hw,
                          plan_train *t)
{
    cJSON *doc;
    zo_status st = parse_doc(text, path, &doc);
    if (st) return st;
    reader r = {path, ZO_OK};
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(doc, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, PLAN_FILE_FORMAT)) {
        r.st = zo_error(ZO_ERR_FORMAT, "%s: field \"format\" must be \"%s\"", path, PLAN_FILE_FORMAT);
        goto out_free_doc;
    }
    if (num(&r, doc, "", "version", 1, PLAN_FILE_VERSION) != PLAN_FILE_VERSION) goto out_free_doc;

    const cJSON *jm = obj(&r, doc, "model");
    const cJSON *jh = obj(&r, doc, "hardware");
    const cJSON *jt = obj(&r, doc, "training");
    const cJSON *jp = obj(&r, doc, "parallel");
    const cJSON *jl = obj(&r, doc, "placement");
    const cJSON *jn = obj(&r, doc, "nvme");
    const cJSON *jb = obj(&r, doc, "buffers");
    if (r.st) goto out_free_doc;

    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", str(&r, jm, "model", "name"));
    if (cJSON_GetObjectItemCaseSensitive(jm, "params_only")) {
        m->params_override = (uint64_t)num(&r, jm, "model", "params_only", 1, 1e16);
        m->max_seq = (int)num(&r, jm, "model", "max_seq", 1, 1 << 24);
        snprintf(m->family, sizeof m->family, "custom");
    } else {
        const char *arch = str(&r, jm, "model", "arch");
        m->arch = !strcmp(arch, "llama") ? ZO_ARCH_LLAMA : ZO_ARCH_GPT;
        if (!r.st && strcmp(arch, "llama") && strcmp(arch, "gpt"))
            r.st = zo_error(ZO_ERR_FORMAT, "%s: field \"model.arch\": '%s' is not gpt or llama",
                            path, arch);
        const cJSON *fam = cJSON_GetObjectItemCaseSensitive(jm, "family");
        snprintf(m->family, sizeof m->family, "%s", cJSON_IsString(fam) ? fam->valuestring : "custom");
        m->n_layers = (int)num(&r, jm, "model", "layers", 1, 1 << 20);
        m->hidden = (int)num(&r, jm, "model", "hidden", 1, 1 << 24);
        m->n_heads = (int)num(&r, jm, "model", "heads", 1, 1 << 20);
        m->n_kv_heads = (int)num(&r, jm, "model", "kv_heads", 1, 1 << 20);
        m->head_dim = (int)num(&r, jm, "model", "head_dim", 1, 1 << 20);
        m->ffn = (int)num(&r, jm, "model", "ffn", 1, 1 << 26);
        m->vocab = (int)num(&r, jm, "model", "vocab", 1, 1 << 26);
        m->max_seq = (int)num(&r, jm, "model", "max_seq", 1, 1 << 24);
        m->tied_embeddings = (int)num(&r, jm, "model", "tied_embeddings", 0, 1);
        m->attn_bias = (int)num(&r, jm, "model", "attn_bias", 0, 1);
        m->out_bias = (int)num(&r, jm, "model", "out_bias", 0, 1);
        m->norm_bias = (int)num(&r, jm, "model", "norm_bias", 0, 1);
        m->norm_eps = (float)num(&r, jm, "model", "norm_eps", 0, 1);
        m->rope_theta = (float)num(&r, jm, "model", "rope_theta", 0, 1e12);
        const cJSON *features = cJSON_GetObjectItemCaseSensitive(jm, "features");
        if (features && !r.st) r.st = zo_model_config_features_parse(features, path, m);
    }
    if (r.st) goto out_free_doc;
    if ((r.st = zo_model_config_validate(m)) != ZO_OK) {
        r.st = zo_error_wrap(r.st, "%s: model", path);
        goto out_free_doc;
    }
    memset(hw, 0, sizeof *hw);
    if ((r.st = plan_hw_from_json(jh, path, hw)) != ZO_OK) goto out_free_doc;

    plan_train_defaults(t, m);
    t->seq = (int)num(&r, jt, "training", "seq", 1, 1 << 24);
    t->micro_batch = (int)num(&r, jt, "training", "micro_batch", 1, 1 << 20);
    t->grad_accum = (int)num(&r, jt, "training", "grad_accum", 1, 1 << 24);
    if (!r.st && (r.st = zo_dtype_parse(str(&r, jt, "training", "dtype"), &t->dtype)) != ZO_OK)
        r.st = zo_error_wrap(r.st, "%s: field \"training.dtype\"", path);
    if (!r.st && (r.st = zo_dtype_parse(str(&r, jt, "training", "grad_dtype"), &t->grad_dtype)) != ZO_OK)
        r.st = zo_error_wrap(r.st, "%s: field \"training.grad_dtype\"", path);
    const char *opt = str(&r, jt, "training", "optimizer");
    t->optimizer = !strcmp(opt, "sgd") ? PLAN_OPT_SGD : PLAN_OPT_ADAMW;
    const char *rc = str(&r, jt, "training", "recompute");
    t->recompute = !strcmp(rc, "full")        ? PLAN_RECOMPUTE_FULL
                   : !strcmp(rc, "selective") ? PLAN_RECOMPUTE_SELECTIVE
                                              : PLAN_RECOMPUTE_NONE;
    if (!r.st && strcmp(rc, "full") && strcmp(rc, "selective") && strcmp(rc, "none"))
        r.st = zo_error(ZO_ERR_FORMAT, "%s: field \"training.recompute\": '%s' is not none, "
                                       "selective or full", path, rc);
    t->flash_attn = (int)num(&r, jt, "training", "flash_attn", 0, 1);
    t->dropout = (int)num(&r, jt, "training", "dropout", 0, 1);
    t->dp = (int)num(&r, jp, "parallel", "dp", 1, 1 << 24);
    t->tp = (int)num(&r, jp, "parallel", "tp", 1, 1 << 16);
    t->pp = (int)num(&r, jp, "parallel", "pp", 1, 1 << 16);
    t->vpp = (int)num(&r, jp, "parallel", "vpp", 1, 1 << 16);
    t->sp = (int)num(&r, jp, "parallel", "sp", 0, 1);
    /* written since the model families: absent in older plan files */
    if (cJSON_GetObjectItemCaseSensitive(jp, "ep")) t->ep = (int)num(&r, jp, "parallel", "ep", 1, 1 << 16);
    if (cJSON_GetObjectItemCaseSensitive(jp, "capacity_factor"))
        t->capacity_factor = num(&r, jp, "parallel", "capacity_factor", 0, 64);
    t->zero = (int)num(&r, jp, "parallel", "zero", 0, 3);
    t->params_on = tier(&r, jl, "placement", "params");
    t->grads_on = tier(&r, jl, "placement", "grads");
    t->checkpoints_on = tier(&r, jl, "placement", "checkpoints");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(jl, "optimizer");
    if (!r.st && !cJSON_IsObject(jo))
        r.st = zo_error(ZO_ERR_FORMAT, "%s: missing object \"placement.optimizer\"", path);
    for (int i = 0; i < PLAN_TIERS && !r.st; i++)
        t->opt_frac[i] = num(&r, jo, "placement.optimizer", plan_tier_name((plan_tier)i), 0, 1);
    t->buf.sub_group = (uint64_t)num(&r, jn, "nvme", "sub_group", 1, 1e15);
    t->buf.swap_buffers = (int)num(&r, jn, "nvme", "swap_buffers", 1, 64);
    t->buf.prefetch_depth = (int)num(&r, jb, "buffers", "prefetch_depth", 1, 64);
    t->buf.comm_bucket = (uint64_t)num(&r, jb, "buffers", "comm_bucket_elems", 0, 1e15);
    t->buf.comm_buckets = (int)num(&r, jb, "buffers", "comm_buckets", 0, 64);
    t->buf.pinned_staging = (uint64_t)num(&r, jb, "buffers", "pinned_staging", 0, 1e18);
    t->buf.cuda_context = (uint64_t)num(&r, jb, "buffers", "cuda_context", 0, 1e18);
    t->buf.cublas_workspace = (uint64_t)num(&r, jb, "buffers", "cublas_workspace", 0, 1e18);
    t->buf.fragmentation = num(&r, jb, "buffers", "fragmentation", 0, 1);
    if (!r.st && (r.st = plan_train_validate(t, m, hw)) != ZO_OK)
        r.st = zo_error_wrap(r.st, "%s", path);
out_free_doc:
    cJSON_Delete(doc);
    return r.st;
}
