#include "plan_vocab.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "units.h" /* defines: zo_parse_double */

const char *const zo_plan_tier_names[] = {"gpu", "cpu", "nvme", NULL};
const char *const zo_plan_host_tier_names[] = {"gpu", "cpu", NULL};
const char *const zo_plan_recompute_names[] = {"none", "selective", "full", "ops", NULL};
const char *const zo_plan_optimizer_names[] = {"adamw", "sgd", NULL};
const char *const zo_plan_method_names[] = {"full", "lora", "qlora", NULL};
const char *const zo_plan_schedule_names[] = {"serial", "overlap", "dpu", NULL};
const char *const zo_plan_opt_state_names[] = {"fp32", "bf16", "8bit", NULL};
const char *const zo_plan_master_names[] = {"fp32", "none", "stochastic", "kahan", NULL};

double zo_plan_state_bytes(zo_plan_opt_state s)
{
    switch (s) {
    case ZO_PLAN_STATE_BF16: return 4;
    case ZO_PLAN_STATE_8BIT: return 2 + 8.0 / ZO_PLAN_STATE_8BIT_BLOCK;
    default: return 8;
    }
}

/* names[i] for 0 <= i < n, else "?" */
static const char *name_of(const char *const *names, int n, int i)
{
    return i >= 0 && i < n ? names[i] : "?";
}

const char *zo_plan_tier_name(zo_plan_tier t)
{
    return name_of(zo_plan_tier_names, ZO_PLAN_TIERS, (int)t);
}

const char *zo_plan_recompute_name(zo_plan_recompute r)
{
    return name_of(zo_plan_recompute_names, ZO_PLAN_RECOMPUTES, (int)r);
}

const char *zo_plan_optimizer_name(zo_plan_optimizer o)
{
    return name_of(zo_plan_optimizer_names, ZO_PLAN_SGD + 1, (int)o);
}

const char *zo_plan_opt_state_name(zo_plan_opt_state s)
{
    return name_of(zo_plan_opt_state_names, ZO_PLAN_STATES, (int)s);
}

const char *zo_plan_master_name(zo_plan_master m)
{
    return name_of(zo_plan_master_names, ZO_PLAN_MASTERS, (int)m);
}

const char *zo_plan_method_name(zo_plan_method m)
{
    return name_of(zo_plan_method_names, ZO_PLAN_QLORA + 1, (int)m);
}

const char *zo_plan_schedule_name(zo_plan_schedule s)
{
    return name_of(zo_plan_schedule_names, ZO_PLAN_SCHEDULES, (int)s);
}

void zo_plan_names_list(const char *const *names, char *buf, size_t len)
{
    buf[0] = '\0';
    for (size_t i = 0; names[i]; i++) {
        size_t u = strlen(buf);
        snprintf(buf + u, len - u, "%s%s", i ? (names[i + 1] ? ", " : " or ") : "", names[i]);
    }
}

zo_status zo_plan_name_parse(const char *const *names, const char *s, const char *flag, int *out)
{
    for (int i = 0; names[i]; i++)
        if (!strcasecmp(s, names[i])) {
            *out = i;
            return ZO_OK;
        }
    char list[128];
    zo_plan_names_list(names, list, sizeof list);
    return zo_error(ZO_ERR_INVALID, "%s: '%s' is not %s", flag, s, list);
}

zo_status zo_plan_tier_parse(const char *s, const char *flag, int allow_nvme, zo_plan_tier *out)
{
    const char *const *names = allow_nvme ? zo_plan_tier_names : zo_plan_host_tier_names;
    for (int i = 0; names[i]; i++)
        if (!strcasecmp(s, names[i])) {
            *out = (zo_plan_tier)i;
            return ZO_OK;
        }
    return zo_error(ZO_ERR_INVALID, "%s: '%s' is not one of gpu, cpu%s", flag, s,
                    allow_nvme ? ", nvme" : "");
}

zo_status zo_plan_recompute_parse(const char *s, const char *flag, zo_plan_recompute *out)
{
    int i;
    zo_status st = zo_plan_name_parse(zo_plan_recompute_names, s, flag, &i);
    if (st == ZO_OK) *out = (zo_plan_recompute)i;
    return st;
}

zo_status zo_plan_optimizer_parse(const char *s, const char *flag, zo_plan_optimizer *out)
{
    int i;
    if (!strcasecmp(s, "adam")) s = zo_plan_optimizer_names[ZO_PLAN_ADAMW];
    zo_status st = zo_plan_name_parse(zo_plan_optimizer_names, s, flag, &i);
    if (st == ZO_OK) *out = (zo_plan_optimizer)i;
    return st;
}

zo_status zo_plan_optim_parse(const char *s, const char *flag, zo_plan_optimizer *out,
                              int *state_8bit)
{
    *state_8bit = 0;
    if (!strcasecmp(s, "adamw8bit") || !strcasecmp(s, "adamw-8bit") || !strcasecmp(s, "adam8bit")) {
        *out = ZO_PLAN_ADAMW;
        *state_8bit = 1;
        return ZO_OK;
    }
    int i;
    if (!strcasecmp(s, "adam")) s = zo_plan_optimizer_names[ZO_PLAN_ADAMW];
    zo_status st = zo_plan_name_parse(zo_plan_optimizer_names, s, flag, &i);
    if (st != ZO_OK)
        return zo_error(ZO_ERR_INVALID, "%s: '%s' is not adamw, adamw8bit or sgd", flag, s);
    *out = (zo_plan_optimizer)i;
    return ZO_OK;
}

zo_status zo_plan_opt_state_parse(const char *s, const char *flag, zo_plan_opt_state *out)
{
    int i;
    if (!strcasecmp(s, "fp32") || !strcasecmp(s, "f32") || !strcasecmp(s, "float32")) s = "fp32";
    if (!strcasecmp(s, "q8") || !strcasecmp(s, "int8") || !strcasecmp(s, "8-bit")) s = "8bit";
    zo_status st = zo_plan_name_parse(zo_plan_opt_state_names, s, flag, &i);
    if (st == ZO_OK) *out = (zo_plan_opt_state)i;
    return st;
}

zo_status zo_plan_master_parse(const char *s, const char *flag, zo_plan_master *out)
{
    int i;
    zo_status st = zo_plan_name_parse(zo_plan_master_names, s, flag, &i);
    if (st == ZO_OK) *out = (zo_plan_master)i;
    return st;
}

zo_status zo_plan_schedule_parse(const char *s, const char *flag, zo_plan_schedule *out)
{
    int i;
    zo_status st = zo_plan_name_parse(zo_plan_schedule_names, s, flag, &i);
    if (st == ZO_OK) *out = (zo_plan_schedule)i;
    return st;
}

/* ---- the optimizer's split over the tiers -------------------------------------- */

zo_status zo_plan_fractions_check(const double frac[ZO_PLAN_TIERS], int sum_one, const char *flag,
                                  const char *what)
{
    double sum = 0;
    for (int t = 0; t < ZO_PLAN_TIERS; t++) {
        if (!(frac[t] >= 0 && frac[t] <= 1))
            return zo_error(ZO_ERR_INVALID, "%s: fraction %s=%g is outside [0, 1]", flag,
                            zo_plan_tier_name((zo_plan_tier)t), frac[t]);
        sum += frac[t];
    }
    if (sum_one ? fabs(sum - 1.0) > ZO_PLAN_FRACTION_EPS : sum > 1 + ZO_PLAN_FRACTION_EPS)
        return zo_error(ZO_ERR_INVALID, "%s: %s sum to %g, %s", flag, what, sum,
                        sum_one ? "not 1" : "more than 1");
    return ZO_OK;
}

zo_status zo_plan_fractions_parse(const char *s, const char *flag, int sum_one,
                                  double frac[ZO_PLAN_TIERS])
{
    zo_plan_tier t = ZO_PLAN_GPU;
    zo_status st;
    if (!strchr(s, '=')) {
        if ((st = zo_plan_tier_parse(s, flag, 1, &t)) != ZO_OK) return st;
        memset(frac, 0, sizeof(double) * ZO_PLAN_TIERS);
        frac[t] = 1.0;
        return ZO_OK;
    }
    double f[ZO_PLAN_TIERS] = {0};
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *sv = NULL, *tok = strtok_r(buf, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
        char *eq = strchr(tok, '=');
        if (!eq) return zo_error(ZO_ERR_INVALID, "%s: '%s' is not TIER=FRACTION", flag, tok);
        *eq = '\0';
        if ((st = zo_plan_tier_parse(tok, flag, 1, &t)) != ZO_OK ||
            (st = zo_parse_double(eq + 1, flag, 0, 1, &f[t])) != ZO_OK)
            return st;
    }
    char what[192];
    snprintf(what, sizeof what, "fractions in '%s'", s);
    if ((st = zo_plan_fractions_check(f, sum_one, flag, what)) != ZO_OK) return st;
    memcpy(frac, f, sizeof f);
    return ZO_OK;
}
