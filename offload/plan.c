/* Plans in (the JSON memplan writes) and measurements out. */
#include "offload/offload_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#define PLAN_MAX_BYTES (16u << 20)
#define NVME_DIR_PLACEHOLDER "${ZO_NVME_DIR}"

static const cJSON *get(const cJSON *o, const char *key)
{
    return o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

/* An integer field, when present; messages name the file and the field. */
static zo_status opt_int(const cJSON *o, const char *obj, const char *key, const char *path,
                         long lo, long hi, int *out)
{
    const cJSON *v = get(o, key);
    if (!v) return ZO_OK;
    /* the range first: converting a double outside long's range is undefined */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi) ||
        v->valuedouble != (double)(long)v->valuedouble)
        return zo_error(ZO_ERR_FORMAT, "%s: %s.%s must be an integer in [%ld, %ld]", path, obj, key, lo, hi);
    *out = (int)v->valuedouble;
    return ZO_OK;
}

static zo_status opt_u64(const cJSON *o, const char *obj, const char *key, const char *path,
                         uint64_t *out)
{
    const cJSON *v = get(o, key);
    if (!v) return ZO_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 18446744073709551616.0))
        return zo_error(ZO_ERR_FORMAT, "%s: %s.%s must be a non-negative number", path, obj, key);
    *out = (uint64_t)v->valuedouble;
    return ZO_OK;
}

static zo_status opt_tier(const cJSON *o, const char *obj, const char *key, const char *path,
                          offload_tier *out)
{
    const cJSON *v = get(o, key);
    if (!v) return ZO_OK;
    char what[128];
    snprintf(what, sizeof what, "%s: %s.%s", path, obj, key);
    if (!cJSON_IsString(v)) return zo_error(ZO_ERR_FORMAT, "%s must be a string", what);
    zo_status st = offload_tier_parse(v->valuestring, what, out);
    return st == ZO_OK ? ZO_OK : ZO_ERR_FORMAT;
}

static zo_status parse_plan(const cJSON *root, const char *path, offload_plan *p)
{
    zo_status st;
    offload_config *c = &p->cfg;
    if (!cJSON_IsObject(root)) return zo_error(ZO_ERR_FORMAT, "%s: a plan is a JSON object", path);
    const cJSON *fmt = get(root, "format");
    if (fmt && (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "zoffload-plan")))
        return zo_error(ZO_ERR_FORMAT, "%s: \"format\" is not \"zoffload-plan\"", path);

    const cJSON *model = get(root, "model");
    const cJSON *name = get(model, "name");
    if (cJSON_IsString(name)) snprintf(p->model_name, sizeof p->model_name, "%s", name->valuestring);

    const cJSON *hw = get(root, "hardware");
    if ((st = opt_u64(hw, "hardware", "gpu_mem", path, &p->gpu_mem)) != ZO_OK) return st;

    /* training: "training" (plan files) or "config" (memplan estimate --json) */
    const cJSON *tr = get(root, "training");
    const char *trn = "training";
    if (!tr) {
        tr = get(root, "config");
        trn = "config";
    }
    if ((st = opt_int(tr, trn, "seq", path, 1, 1 << 24, &p->seq)) != ZO_OK ||
        (st = opt_int(tr, trn, "micro_batch", path, 1, 1 << 20, &p->micro_batch)) != ZO_OK ||
        (st = opt_int(tr, trn, "grad_accum", path, 1, 1 << 20, &c->grad_accum)) != ZO_OK)
        return st;
    const cJSON *dt = get(tr, "dtype");
    if (dt) {
        zo_dtype d;
        if (!cJSON_IsString(dt) || zo_dtype_parse(dt->valuestring, &d) != ZO_OK)
            return zo_error(ZO_ERR_FORMAT, "%s: %s.dtype must be fp32, fp16 or bf16", path, trn);
        p->dtype = (int)d;
    }
    const cJSON *opt = get(tr, "optimizer");
    if (opt && (!cJSON_IsString(opt) || strcmp(opt->valuestring, "adamw")))
        return zo_error(ZO_ERR_FORMAT, "%s: %s.optimizer: the runtime runs adamw only", path, trn);
    const cJSON *rc = get(tr, "recompute");
    if (rc) {
        if (!cJSON_IsString(rc))
            return zo_error(ZO_ERR_FORMAT, "%s: %s.recompute must be a string", path, trn);
        if (!strcmp(rc->valuestring, "none")) c->recompute = 0;
        else if (!strcmp(rc->valuestring, "full")) c->recompute = 1;
        else if (!strcmp(rc->valuestring, "selective")) {
            /* selective recompute keeps all but the attention core, which is
             * worth recomputing only when it stores the s x s scores; this
             * attention is memory-efficient (it keeps one log-sum-exp per
             * row), so selective saves nothing over none */
            c->recompute = 0;
            p->selective_as_none = 1;
        } else
            return zo_error(ZO_ERR_FORMAT, "%s: %s.recompute \"%s\": the runtime does none, selective (as none) or full",
                            path, trn, rc->valuestring);
    }

    const cJSON *pl = get(root, "placement");
    if (!pl) pl = get(tr, "placement");
    if ((st = opt_tier(pl, "placement", "params", path, &c->params_on)) != ZO_OK ||
        (st = opt_tier(pl, "placement", "checkpoints", path, &c->checkpoints_on)) != ZO_OK)
        return st;
    /* a gradient is summed where its optimizer state lives: the field is
     * checked, not used */
    offload_tier grads_on = OFFLOAD_CPU;
    if ((st = opt_tier(pl, "placement", "grads", path, &grads_on)) != ZO_OK) return st;
    if (grads_on == OFFLOAD_NVME)
        return zo_error(ZO_ERR_FORMAT, "%s: placement.grads: gradients go to gpu or cpu", path);
    const cJSON *op = get(pl, "optimizer");
    if (op) {
        if (!cJSON_IsObject(op))
            return zo_error(ZO_ERR_FORMAT, "%s: placement.optimizer must be {\"gpu\": f, \"cpu\": f, \"nvme\": f}", path);
        for (int t = 0; t < OFFLOAD_TIERS; t++) {
            const cJSON *v = get(op, offload_tier_name((offload_tier)t));
            if (v && !cJSON_IsNumber(v))
                return zo_error(ZO_ERR_FORMAT, "%s: placement.optimizer.%s must be a number", path,
                                offload_tier_name((offload_tier)t));
            c->opt_frac[t] = v ? v->valuedouble : 0.0;
        }
        /* offload_init checks these too, but its message cannot name the plan */
        double sum = 0;
        for (int t = 0; t < OFFLOAD_TIERS; t++) {
            if (!(c->opt_frac[t] >= 0 && c->opt_frac[t] <= 1))
                return zo_error(ZO_ERR_FORMAT, "%s: placement.optimizer.%s = %g is outside [0, 1]", path,
                                offload_tier_name((offload_tier)t), c->opt_frac[t]);
            sum += c->opt_frac[t];
        }
        if (fabs(sum - 1.0) > 1e-6)
            return zo_error(ZO_ERR_FORMAT, "%s: placement.optimizer fractions sum to %g, not 1", path, sum);
    }

    const cJSON *nv = get(root, "nvme");
    const cJSON *dir = get(nv, "dir");
    if (cJSON_IsString(dir) && strcmp(dir->valuestring, NVME_DIR_PLACEHOLDER)) {
        static __thread char dirbuf[4096]; /* the plan's own directory outlives the JSON */
        snprintf(dirbuf, sizeof dirbuf, "%s", dir->valuestring);
        c->nvme_dir = dirbuf;
    }
    uint64_t sg = c->sub_group;
    if ((st = opt_u64(nv, "nvme", "sub_group", path, &sg)) != ZO_OK) return st;
    c->sub_group = (size_t)sg;
    if ((st = opt_int(nv, "nvme", "swap_buffers", path, 1, 1024, &c->swap_buffers)) != ZO_OK) return st;

    const cJSON *bf = get(root, "buffers");
    if (!bf) bf = get(tr, "buffers");
    if ((st = opt_int(bf, "buffers", "prefetch_depth", path, 0, OFFLOAD_MAX_PREFETCH,
                      &c->prefetch_depth)) != ZO_OK)
        return st;
    if (!get(nv, "sub_group")) {
        if ((st = opt_u64(bf, "buffers", "sub_group", path, &sg)) != ZO_OK) return st;
        c->sub_group = (size_t)sg;
    }
    if (!get(nv, "swap_buffers"))
        if ((st = opt_int(bf, "buffers", "swap_buffers", path, 1, 1024, &c->swap_buffers)) != ZO_OK) return st;

    /* the prediction: "predicted.peak_bytes" (plan files) or "per_rank.<tier>.total" */
    const cJSON *pr = get(root, "predicted");
    const cJSON *peak = get(pr, "peak_bytes");
    const cJSON *per = get(root, "per_rank");
    for (int t = 0; t < OFFLOAD_TIERS; t++) {
        const char *tn = offload_tier_name((offload_tier)t);
        const cJSON *v = peak ? get(peak, tn) : get(get(per, tn), "total");
        if (cJSON_IsNumber(v)) {
            p->predicted.peak[t] = (uint64_t)v->valuedouble;
            p->predicted.present = 1;
        }
    }
    const cJSON *ss = get(pr, "step_s");
    if (cJSON_IsNumber(ss)) p->predicted.step_s = ss->valuedouble;
    return ZO_OK;
}

void offload_plan_defaults(offload_plan *p)
{
    memset(p, 0, sizeof *p);
    offload_config_defaults(&p->cfg);
    p->dtype = -1;
}

zo_status offload_plan_load(const char *path, offload_plan *plan)
{
    FILE *f = fopen(path, "rb");
    if (!f) return zo_error(errno == ENOENT ? ZO_ERR_NOT_FOUND : ZO_ERR_IO, "%s: %s", path, strerror(errno));
    char *text = malloc(PLAN_MAX_BYTES + 1);
    if (!text) {
        fclose(f);
        return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
    }
    size_t len = fread(text, 1, PLAN_MAX_BYTES + 1, f);
    fclose(f);
    if (len > PLAN_MAX_BYTES) {
        free(text);
        return zo_error(ZO_ERR_FORMAT, "%s: larger than %u bytes", path, PLAN_MAX_BYTES);
    }
    text[len] = 0;
    cJSON *root = cJSON_ParseWithLength(text, len);
    zo_status st;
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        int line = 1;
        for (const char *q = text; at && q < at && *q; q++) line += *q == '\n';
        st = zo_error(ZO_ERR_FORMAT, "%s: malformed JSON near line %d", path, line);
    } else {
        st = parse_plan(root, path, plan);
        cJSON_Delete(root);
    }
    free(text);
    return st;
}

/* ---- measurements out -------------------------------------------------------------------- */

zo_status offload_write_stats_json(const offload_t *rt, const offload_prediction *pred,
                                   const char *path)
{
    offload_stats s;
    offload_get_stats(rt, &s);
    cJSON *o = cJSON_CreateObject();
    if (!o) return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
    cJSON *pk = cJSON_AddObjectToObject(o, "peak_bytes");
    cJSON *pd = pred && pred->present ? cJSON_AddObjectToObject(o, "predicted_bytes") : NULL;
    cJSON *rd = pd ? cJSON_AddObjectToObject(o, "measured_over_predicted") : NULL;
    for (int t = 0; t < OFFLOAD_TIERS; t++) {
        const char *tn = offload_tier_name((offload_tier)t);
        cJSON_AddNumberToObject(pk, tn, (double)s.peak[t]);
        if (pd) {
            cJSON_AddNumberToObject(pd, tn, (double)pred->peak[t]);
            if (pred->peak[t]) cJSON_AddNumberToObject(rd, tn, (double)s.peak[t] / (double)pred->peak[t]);
            else cJSON_AddNullToObject(rd, tn);
        }
    }
    cJSON_AddNumberToObject(o, "device_capacity", (double)s.device_capacity);
    cJSON *ts = cJSON_AddObjectToObject(o, "time_s");
    for (int p = 0; p < OFFLOAD_TIME_PARTS; p++)
        cJSON_AddNumberToObject(ts, offload_time_part_name((offload_time_part)p), s.time[p]);
    cJSON_AddNumberToObject(ts, "total", s.total_s);
    if (pred && pred->step_s > 0) cJSON_AddNumberToObject(o, "predicted_step_s", pred->step_s);
    cJSON_AddNumberToObject(o, "micro_batches", (double)s.micro_batches);
    cJSON_AddNumberToObject(o, "steps", (double)s.steps);
    cJSON_AddNumberToObject(o, "skipped", (double)s.skipped);
    cJSON *by = cJSON_AddObjectToObject(o, "bytes_moved");
    cJSON_AddNumberToObject(by, "h2d", (double)s.bytes_h2d);
    cJSON_AddNumberToObject(by, "d2h", (double)s.bytes_d2h);
    cJSON_AddNumberToObject(by, "disk_read", (double)s.bytes_disk_read);
    cJSON_AddNumberToObject(by, "disk_written", (double)s.bytes_disk_written);
    cJSON_AddNumberToObject(o, "device_slots", s.n_slots);
    cJSON_AddNumberToObject(o, "slot_bytes", (double)s.slot_bytes);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    zo_status st = ZO_OK;
    FILE *f = fopen(tmp, "w");
    if (!f) {
        st = zo_error(ZO_ERR_IO, "%s: %s", tmp, strerror(errno));
    } else {
        int bad = fputs(text, f) < 0 || fputc('\n', f) < 0 || fflush(f) || fsync(fileno(f));
        bad |= fclose(f) != 0;
        if (bad || rename(tmp, path)) {
            st = zo_error(ZO_ERR_IO, "%s: write: %s", path, strerror(errno));
            unlink(tmp);
        }
    }
    free(text);
    return st;
}
