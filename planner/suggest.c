#include "suggest.h"

#include <stdio.h>
#include <string.h>

typedef struct rung {
    const char *flags;
    plan_tier params, grads, checkpoints;
    double opt[PLAN_TIERS];
    int full_recompute;
} rung;

/* Cheapest first: each rung moves more state off the GPU, or off the CPU. */
static const rung ladder[] = {
    {"--recompute full", PLAN_GPU, PLAN_GPU, PLAN_GPU, {1, 0, 0}, 1},
    {"--grads cpu --optimizer cpu", PLAN_GPU, PLAN_CPU, PLAN_GPU, {0, 1, 0}, 0},
    {"--recompute full --grads cpu --optimizer cpu", PLAN_GPU, PLAN_CPU, PLAN_GPU, {0, 1, 0}, 1},
    {"--recompute full --grads cpu --optimizer cpu --checkpoints cpu", PLAN_GPU, PLAN_CPU, PLAN_CPU,
     {0, 1, 0}, 1},
    {"--recompute full --params cpu --grads cpu --optimizer cpu --checkpoints cpu", PLAN_CPU,
     PLAN_CPU, PLAN_CPU, {0, 1, 0}, 1},
    {"--recompute full --params cpu --grads cpu --optimizer cpu=0.5,nvme=0.5 --checkpoints cpu",
     PLAN_CPU, PLAN_CPU, PLAN_CPU, {0, 0.5, 0.5}, 1},
    {"--recompute full --params cpu --grads cpu --optimizer nvme --checkpoints cpu", PLAN_CPU,
     PLAN_CPU, PLAN_CPU, {0, 0, 1}, 1},
    {"--recompute full --params nvme --grads cpu --optimizer nvme --checkpoints cpu", PLAN_NVME,
     PLAN_CPU, PLAN_CPU, {0, 0, 1}, 1},
};

zo_status plan_suggest(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                       plan_train *out, char *flags, size_t flags_len, int *found)
{
    *found = 0;
    for (size_t i = 0; i < sizeof ladder / sizeof ladder[0]; i++) {
        const rung *r = &ladder[i];
        plan_train c = *t;
        c.params_on = r->params;
        c.grads_on = r->grads;
        c.checkpoints_on = r->checkpoints;
        memcpy(c.opt_frac, r->opt, sizeof c.opt_frac);
        if (r->full_recompute) c.recompute = PLAN_RECOMPUTE_FULL;
        /* a rung must not undo what the user already offloaded */
        if (c.recompute < t->recompute) c.recompute = t->recompute;
        if (t->params_on > c.params_on) c.params_on = t->params_on;
        if (t->checkpoints_on > c.checkpoints_on) c.checkpoints_on = t->checkpoints_on;
        if (t->grads_on > c.grads_on) c.grads_on = t->grads_on;
        if (t->opt_frac[PLAN_NVME] > c.opt_frac[PLAN_NVME] || t->opt_frac[PLAN_GPU] < c.opt_frac[PLAN_GPU])
            memcpy(c.opt_frac, t->opt_frac, sizeof c.opt_frac);
        plan_estimate e;
        zo_status st = plan_estimate_run(m, hw, &c, &e);
        if (st) return st;
        if (e.fits) {
            *out = c;
            snprintf(flags, flags_len, "%s", r->flags);
            *found = 1;
            return ZO_OK;
        }
    }
    return ZO_OK;
}
