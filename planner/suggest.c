#include "suggest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/report.h" /* plan_format_fractions */

static const char *kind_names[PLAN_ALT_KINDS] = {"offload", "lora", "qlora", "adamw8bit"};

const char *plan_alt_kind_name(plan_alt_kind k) { return k < PLAN_ALT_KINDS ? kind_names[k] : "?"; }

/* ---- flags ----------------------------------------------------------------------- */

static void append(char *buf, size_t len, const char *fmt, const char *flag, const char *v)
{
    size_t u = strlen(buf);
    if (u + 1 >= len) return;
    snprintf(buf + u, len - u, fmt, u ? " " : "", flag, v);
}

static void append_int(char *buf, size_t len, const char *flag, long v)
{
    char s[24];
    snprintf(s, sizeof s, "%ld", v);
    append(buf, len, "%s%s %s", flag, s);
}

void plan_train_flags(const plan_train *from, const plan_train *to, char *buf, size_t len)
{
    buf[0] = '\0';
    if (to->dp != from->dp) append_int(buf, len, "--dp", to->dp);
    if (to->tp != from->tp) append_int(buf, len, "--tp", to->tp);
    if (to->pp != from->pp) append_int(buf, len, "--pp", to->pp);
    if (to->sp && !from->sp) append(buf, len, "%s%s%s", "--sp", "");
    if (to->vpp != from->vpp) append_int(buf, len, "--vpp", to->vpp);
    if (to->zero != from->zero) append_int(buf, len, "--zero", to->zero);
    if (to->micro_batch != from->micro_batch) append_int(buf, len, "--micro-batch", to->micro_batch);
    if (to->grad_accum != from->grad_accum) append_int(buf, len, "--grad-accum", to->grad_accum);
    if (to->recompute != from->recompute)
        append(buf, len, "%s%s %s", "--recompute", zo_plan_recompute_name(to->recompute));
    if (to->recompute_layers != from->recompute_layers)
        append_int(buf, len, "--recompute-layers", to->recompute_layers);
    if (to->params_on != from->params_on)
        append(buf, len, "%s%s %s", "--params", zo_plan_tier_name(to->params_on));
    if (to->grads_on != from->grads_on)
        append(buf, len, "%s%s %s", "--grads", zo_plan_tier_name(to->grads_on));
    if (memcmp(to->opt_frac, from->opt_frac, sizeof to->opt_frac)) {
        char fr[64];
        plan_format_fractions(to->opt_frac, fr, sizeof fr);
        append(buf, len, "%s%s %s", "--optimizer", fr);
    }
    if (to->checkpoints_on != from->checkpoints_on)
        append(buf, len, "%s%s %s", "--checkpoints", zo_plan_tier_name(to->checkpoints_on));
    if (to->buf.prefetch_depth != from->buf.prefetch_depth)
        append_int(buf, len, "--prefetch", to->buf.prefetch_depth);
    if (to->method != ZO_PLAN_FULL) {
        /* the adapters, against what --lora alone gives (or `from`'s) */
        int was = from->method != ZO_PLAN_FULL;
        unsigned targets = was ? from->lora.targets : PLAN_LORA_DEFAULT_TARGETS;
        float alpha = was ? from->lora.alpha : PLAN_LORA_DEFAULT_ALPHA;
        char v[64];
        if (!was || to->lora.r != from->lora.r) append_int(buf, len, "--lora", to->lora.r);
        if (to->lora.targets != targets)
            append(buf, len, "%s%s %s", "--lora-targets",
                   zo_lora_targets_str(to->lora.targets, v, sizeof v));
        if (to->lora.alpha != alpha) {
            snprintf(v, sizeof v, "%g", (double)to->lora.alpha);
            append(buf, len, "%s%s %s", "--lora-alpha", v);
        }
        if (to->method == ZO_PLAN_QLORA && from->method != ZO_PLAN_QLORA)
            append(buf, len, "%s%s%s", "--qlora", "");
        if (to->adapters_on != from->adapters_on)
            append(buf, len, "%s%s %s", "--adapters-on", zo_plan_tier_name(to->adapters_on));
    }
    if (to->opt_state != from->opt_state) {
        if (to->opt_state == ZO_PLAN_STATE_8BIT) append(buf, len, "%s%s %s", "--optim", "adamw8bit");
        else append(buf, len, "%s%s %s", "--optim-dtype", zo_plan_opt_state_name(to->opt_state));
    }
    if (to->master != from->master) append(buf, len, "%s%s %s", "--master", zo_plan_master_name(to->master));
    if (to->loss_chunk != from->loss_chunk) append_int(buf, len, "--loss-chunk", to->loss_chunk);
    if (to->schedule != from->schedule)
        append(buf, len, "%s%s %s", "--schedule", zo_plan_schedule_name(to->schedule));
    if (to->dpu_warmup != from->dpu_warmup) append_int(buf, len, "--dpu-warmup", to->dpu_warmup);
    if (to->opt_threads != from->opt_threads) append_int(buf, len, "--opt-threads", to->opt_threads);
    if (to->clip_stale && !from->clip_stale) append(buf, len, "%s%s%s", "--clip-stale", "");
}

/* ---- generators ------------------------------------------------------------------- */

/* A generator proposes its i-th alternative to `t` in *c (and says what it
 * is): 1 proposed, 0 nothing at this index, -1 no more. A new kind of
 * alternative (LoRA, QLoRA) is one more generator in `generators`. */
typedef int (*alt_gen)(const zo_model_config *m, const plan_hw *hw, const plan_train *t, int i,
                       plan_train *c, char *what, size_t len);

/* Where state goes, cheapest first (the `none` optimizer split is searched). */
typedef struct placement {
    const char *what;
    zo_plan_tier params, grads;
    double opt[ZO_PLAN_TIERS]; /* nvme < 0: the least NVMe share in tenths that fits */
} placement;

static const placement placements[] = {
    {NULL, ZO_PLAN_GPU, ZO_PLAN_GPU, {-1, -1, -1}}, /* as given */
    {"ZeRO-Offload: gradients and optimizer on the CPU", ZO_PLAN_GPU, ZO_PLAN_CPU, {0, 1, 0}},
    {"ZeRO-Offload, optimizer split between CPU and NVMe", ZO_PLAN_GPU, ZO_PLAN_CPU, {0, -1, -1}},
    {"ZeRO-Offload, optimizer on NVMe", ZO_PLAN_GPU, ZO_PLAN_CPU, {0, 0, 1}},
    {"ZeRO-Infinity: weights streamed from the CPU", ZO_PLAN_CPU, ZO_PLAN_CPU, {0, 1, 0}},
    {"weights streamed from the CPU, optimizer split between CPU and NVMe", ZO_PLAN_CPU, ZO_PLAN_CPU,
     {0, -1, -1}},
    {"weights streamed from the CPU, optimizer on NVMe", ZO_PLAN_CPU, ZO_PLAN_CPU, {0, 0, 1}},
    {"ZeRO-Infinity: weights and optimizer on NVMe", ZO_PLAN_NVME, ZO_PLAN_CPU, {0, 0, 1}},
};
#define N_PLACEMENTS (int)(sizeof placements / sizeof placements[0])

/* Recompute and checkpoints: as given, full recompute, and full recompute
 * with the checkpoints in CPU memory (the runtime needs full recompute). */
#define N_ACTIVATION 3
static const char *activation_what[N_ACTIVATION] = {NULL, "full recompute",
                                                    "full recompute, checkpoints in CPU memory"};

static int fits(const zo_model_config *m, const plan_hw *hw, const plan_train *c, zo_status *st)
{
    plan_estimate e;
    *st = plan_estimate_run(m, hw, c, &e);
    return *st == ZO_OK && e.fits;
}

static int gen_offload(const zo_model_config *m, const plan_hw *hw, const plan_train *t, int i,
                       plan_train *c, char *what, size_t len)
{
    if (i >= N_PLACEMENTS * N_ACTIVATION) return -1;
    const placement *p = &placements[i % N_PLACEMENTS];
    int act = i / N_PLACEMENTS;
    *c = *t;
    if (act >= 1) {
        c->recompute = ZO_PLAN_RECOMPUTE_FULL; /* of every layer */
        c->recompute_layers = 0;
    }
    if (act == 2) c->checkpoints_on = ZO_PLAN_CPU;
    if (p->what) {
        c->params_on = p->params;
        c->grads_on = p->grads;
        memcpy(c->opt_frac, p->opt, sizeof c->opt_frac);
    }
    /* never undo what the user already offloaded */
    if (t->params_on > c->params_on) c->params_on = t->params_on;
    if (t->grads_on > c->grads_on) c->grads_on = t->grads_on;
    if (t->checkpoints_on > c->checkpoints_on) c->checkpoints_on = t->checkpoints_on;
    if (plan_recompute_rank(c) < plan_recompute_rank(t)) {
        c->recompute = t->recompute;
        c->recompute_layers = t->recompute_layers;
    }
    if (p->what && p->opt[ZO_PLAN_NVME] < 0) {
        /* the least NVMe share that fits; none when all of it fits in CPU memory */
        zo_status st;
        c->opt_frac[ZO_PLAN_GPU] = 0;
        c->opt_frac[ZO_PLAN_CPU] = 1;
        c->opt_frac[ZO_PLAN_NVME] = 0;
        if (fits(m, hw, c, &st)) return 0;
        int k = 1;
        for (; k < 10; k++) {
            c->opt_frac[ZO_PLAN_CPU] = (10 - k) / 10.0;
            c->opt_frac[ZO_PLAN_NVME] = k / 10.0;
            if (fits(m, hw, c, &st)) break;
        }
        if (k == 10) return 0;
    }
    if (t->opt_frac[ZO_PLAN_NVME] > c->opt_frac[ZO_PLAN_NVME] || t->opt_frac[ZO_PLAN_GPU] < c->opt_frac[ZO_PLAN_GPU])
        memcpy(c->opt_frac, t->opt_frac, sizeof c->opt_frac);
    what[0] = '\0';
    const char *parts[2] = {activation_what[act], p->what};
    for (int k = 0; k < 2; k++) {
        if (!parts[k]) continue;
        size_t u = strlen(what);
        snprintf(what + u, len - u, "%s%s", u ? "; " : "", parts[k]);
    }
    return 1;
}

/* LoRA and QLoRA in place of what is trained: the user's adapters if
 * given, else rank 16 on every linear layer (QLoRA's finding: adapters on
 * all of them match full fine-tuning); each on a ladder from the
 * configuration as given to the most offloaded: full recompute, the
 * adapters' optimizer state on the CPU (what a paged optimizer does), the
 * frozen base streamed from the CPU, then from NVMe. */
#define PEFT_SUGGEST_R 16
typedef struct peft_rung {
    const char *what;
    int recompute;          /* full recompute */
    zo_plan_tier params;    /* the frozen base */
    int opt_cpu;            /* the adapters' optimizer state (and gradients) on the CPU */
} peft_rung;

static const peft_rung peft_ladder[] = {
    {NULL, 0, ZO_PLAN_GPU, 0},
    {"full recompute", 1, ZO_PLAN_GPU, 0},
    {"full recompute, the adapters' optimizer on the CPU", 1, ZO_PLAN_GPU, 1},
    {"full recompute, the base streamed from the CPU", 1, ZO_PLAN_CPU, 0},
    {"full recompute, the base streamed from the CPU, the adapters' optimizer on the CPU", 1,
     ZO_PLAN_CPU, 1},
    {"full recompute, the base streamed from NVMe, the adapters' optimizer on the CPU", 1,
     ZO_PLAN_NVME, 1},
};
#define N_PEFT_LADDER (int)(sizeof peft_ladder / sizeof peft_ladder[0])

static int gen_peft(const zo_model_config *m, const plan_train *t, zo_plan_method method, int i,
                    plan_train *c, char *what, size_t len)
{
    if (i >= N_PEFT_LADDER) return -1;
    /* QLoRA for full fine-tuning or LoRA; LoRA for full fine-tuning. Every
     * model memplan knows the layers of takes adapters (latent attention's
     * five projections, a dense-first mixture of experts, a shared expert's
     * gate or a router's score correction: frozen, never targets); a model
     * known only by its size (--params N) has no layers to adapt, which
     * plan_peft_validate refuses */
    if (t->method >= method || m->params_override) return -1;
    *c = *t;
    c->method = method;
    if (t->method == ZO_PLAN_FULL)
        c->lora = (zo_lora_config){PEFT_SUGGEST_R, PLAN_LORA_DEFAULT_ALPHA, ZO_LORA_ALL_LINEAR};
    const peft_rung *l = &peft_ladder[i];
    /* (recompute by op stays by op until a rung recomputes whole layers) */
    if (l->recompute) {
        c->recompute = ZO_PLAN_RECOMPUTE_FULL;
        c->recompute_layers = 0;
    }
    if (l->params > c->params_on) c->params_on = l->params;
    if (l->opt_cpu && c->opt_frac[ZO_PLAN_GPU] > 0) {
        c->opt_frac[ZO_PLAN_GPU] = c->opt_frac[ZO_PLAN_NVME] = 0;
        c->opt_frac[ZO_PLAN_CPU] = 1;
        c->grads_on = ZO_PLAN_CPU;
    }
    char tg[64];
    snprintf(what, len, "%s r %d on %s, the base frozen in %s%s%s",
             method == ZO_PLAN_QLORA ? "QLoRA" : "LoRA", c->lora.r,
             zo_lora_targets_str(c->lora.targets, tg, sizeof tg),
             method == ZO_PLAN_QLORA ? "NF4" : zo_dtype_name(c->dtype), l->what ? "; " : "",
             l->what ? l->what : "");
    return 1;
}

static int gen_lora(const zo_model_config *m, const plan_hw *hw, const plan_train *t, int i,
                    plan_train *c, char *what, size_t len)
{
    (void)hw;
    return gen_peft(m, t, ZO_PLAN_LORA, i, c, what, len);
}

static int gen_qlora(const zo_model_config *m, const plan_hw *hw, const plan_train *t, int i,
                     plan_train *c, char *what, size_t len)
{
    (void)hw;
    return gen_peft(m, t, ZO_PLAN_QLORA, i, c, what, len);
}

/* Full fine-tuning with AdamW's m and v in 8 bits (Dettmers et al. 2022: it
 * matches 32-bit Adam; the fp32 master kept), on the offload ladder: half
 * the bytes of the state to hold and to move. */
static int gen_adamw8bit(const zo_model_config *m, const plan_hw *hw, const plan_train *t, int i,
                         plan_train *c, char *what, size_t len)
{
    if (t->method != ZO_PLAN_FULL || t->optimizer != ZO_PLAN_ADAMW || t->opt_state == ZO_PLAN_STATE_8BIT)
        return -1;
    plan_train u = *t;
    u.opt_state = ZO_PLAN_STATE_8BIT;
    char w[160];
    int r = gen_offload(m, hw, &u, i, c, w, sizeof w);
    if (r == 1) snprintf(what, len, "8-bit AdamW m and v (Dettmers et al. 2022)%s%s", w[0] ? "; " : "", w);
    return r;
}

/* A kind with `first_only` keeps the first of its alternatives that fits:
 * its ladder goes from the least change to the most, and the first rung
 * that fits is the one to take. */
static const struct {
    plan_alt_kind kind;
    alt_gen gen;
    int first_only;
} generators[] = {
    {PLAN_ALT_OFFLOAD, gen_offload, 0},
    {PLAN_ALT_LORA, gen_lora, 1},
    {PLAN_ALT_QLORA, gen_qlora, 1},
    {PLAN_ALT_ADAMW8BIT, gen_adamw8bit, 1},
};

/* ---- the ranked list --------------------------------------------------------------- */

static int same_config(const plan_train *a, const plan_train *b)
{
    return a->method == b->method && a->lora.r == b->lora.r && a->lora.targets == b->lora.targets &&
           a->adapters_on == b->adapters_on &&
           a->recompute == b->recompute && a->params_on == b->params_on &&
           a->grads_on == b->grads_on && a->checkpoints_on == b->checkpoints_on &&
           !memcmp(a->opt_frac, b->opt_frac, sizeof a->opt_frac) && a->zero == b->zero &&
           a->micro_batch == b->micro_batch && a->grad_accum == b->grad_accum &&
           a->dp == b->dp && a->tp == b->tp && a->pp == b->pp && a->opt_state == b->opt_state &&
           a->master == b->master;
}

/* Each of `flags`' settings ("--params cpu", "--qlora") found among
 * `in`'s: 1 when `flags` asks for nothing `in` does not. */
static int flags_within(const char *flags, const char *in)
{
    for (const char *p = strstr(flags, "--"); p; p = strstr(p + 2, "--")) {
        const char *next = strstr(p + 2, " --");
        size_t n = next ? (size_t)(next - p) : strlen(p);
        int found = 0;
        for (const char *q = strstr(in, "--"); q && !found; q = strstr(q + 2, "--")) {
            const char *qn = strstr(q + 2, " --");
            size_t k = qn ? (size_t)(qn - q) : strlen(q);
            found = k == n && !strncmp(p, q, n);
        }
        if (!found) return 0;
    }
    return 1;
}

/* Row b adds to row a's flags a setting that changes nothing: a trains the
 * same way (full, LoRA or QLoRA), fits with fewer settings and is as fast (--checkpoints cpu beside a full recompute
 * whose checkpoints fit on the GPU, ...). */
static int adds_nothing(const plan_alternative *a, const plan_alternative *b)
{
    return a->t.method == b->t.method && strcmp(a->flags, b->flags) && flags_within(a->flags, b->flags) &&
           a->time.step <= b->time.step * (1 + 1e-9);
}

static int by_step(const void *x, const void *y)
{
    const plan_alternative *a = x, *b = y;
    return a->time.step < b->time.step ? -1 : a->time.step > b->time.step ? 1 : 0;
}

zo_status plan_suggest(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                       plan_suggestions *out)
{
    out->n = out->tried = 0;
    plan_train seen[PLAN_SUGGEST_MAX * 2];
    int n_seen = 0;
    for (size_t g = 0; g < sizeof generators / sizeof generators[0]; g++) {
        for (int i = 0;; i++) {
            plan_train c;
            char what[160];
            int r = generators[g].gen(m, hw, t, i, &c, what, sizeof what);
            if (r < 0) break;
            if (r == 0 || same_config(&c, t)) continue;
            int dup = 0;
            for (int k = 0; k < n_seen && !dup; k++) dup = same_config(&c, &seen[k]);
            if (dup || n_seen == (int)(sizeof seen / sizeof seen[0])) continue;
            seen[n_seen++] = c;
            out->tried++;
            plan_estimate e;
            zo_status st = plan_estimate_run(m, hw, &c, &e);
            if (st) return st;
            if (!e.fits || out->n == PLAN_SUGGEST_MAX) continue;
            plan_alternative *a = &out->alt[out->n];
            if ((st = plan_time_run(m, hw, &c, &e, &a->time)) != ZO_OK) return st;
            a->kind = generators[g].kind;
            a->t = c;
            memcpy(a->total, e.total, sizeof a->total);
            snprintf(a->what, sizeof a->what, "%s", what);
            plan_train_flags(t, &c, a->flags, sizeof a->flags);
            out->n++;
            if (generators[g].first_only) break;
        }
    }
    /* insertion order is the ladder's: a stable sort keeps it among equal times */
    for (int i = 1; i < out->n; i++)
        for (int j = i; j > 0 && by_step(&out->alt[j - 1], &out->alt[j]) > 0; j--) {
            plan_alternative tmp = out->alt[j];
            out->alt[j] = out->alt[j - 1];
            out->alt[j - 1] = tmp;
        }
    /* rows that only add a setting that changes nothing are left out */
    int kept = 0;
    for (int j = 0; j < out->n; j++) {
        int redundant = 0;
        for (int i = 0; i < out->n && !redundant; i++) redundant = i != j && adds_nothing(&out->alt[i], &out->alt[j]);
        if (!redundant) out->alt[kept++] = out->alt[j];
    }
    out->n = kept;
    return ZO_OK;
}
