/* Reports of an estimate: a readable table and JSON (docs/memplan-json.md). */
#ifndef ZO_PLANNER_REPORT_H
#define ZO_PLANNER_REPORT_H

#include <stddef.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "planner/cost.h"
#include "planner/memory.h"
#include "planner/suggest.h"

/* The JSON document of an estimate; the caller owns it (cJSON_Delete), NULL
 * when out of memory. `pt` (may be NULL) adds the "time" object; `sg` (may
 * be NULL) the alternatives that make a non-fitting configuration fit. */
cJSON *plan_report_json(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                        const plan_estimate *e, const plan_time *pt, const plan_suggestions *sg);

/* The "time" object alone (docs/memplan-json.md). */
cJSON *plan_report_time_json(const plan_time *pt);

/* The readable table: per tier, the largest consumers first, GiB and % of
 * capacity, and a verdict (with the alternatives in `sg` when it does not fit). */
void plan_report_table(FILE *out, const zo_model_config *m, const plan_hw *hw,
                       const plan_train *t, const plan_estimate *e, const plan_time *pt,
                       const plan_suggestions *sg);

/* The time section of the table: step time, its parts, tokens/s, MFU, HFU,
 * and the optimizer schedule. */
void plan_report_time_table(FILE *out, const plan_time *pt);

/* The line every report carries: the runtime the figures model and what
 * the other would change (docs/memplan.md, "What memplan models"): this
 * project's runtime, and the activations an eager PyTorch run of the same
 * setting adds (e->eager_extra); or, with --runtime eager, what the estimate
 * includes for it. */
void plan_report_runtime(FILE *out, const zo_model_config *m, const plan_estimate *e,
                         const plan_train *t);

/* The same for a report of many models (max-model): the runtime and the
 * fractions eager PyTorch adds. */
void plan_report_runtime_note(FILE *out, plan_runtime r);

/* The optimizer schedule's lines (nothing when the CPU updates nothing):
 * which, the optimizer's time, how much of it is hidden, the serial step. */
void plan_report_schedule(FILE *out, const plan_time *pt);

/* The model's shape as both the estimate's JSON and the plan file carry it
 * (docs/memplan-json.md, docs/plan-format.md), written by the plan schema's
 * writer; the caller owns it. */
cJSON *plan_json_model(const zo_model_config *m);

/* "placement": {"params", "grads", "optimizer": {tier: fraction}, "checkpoints", "adapters"}
 * in the estimate's JSON (the same keys as the plan file's). */
void plan_json_add_placement(cJSON *parent, const plan_train *t);

/* A number of a struct written as a JSON field (the report's objects are
 * tables of them): its key, its offset in the struct and its C type. */
typedef enum plan_json_type {
    PLAN_JSON_DOUBLE,
    PLAN_JSON_INT,
    PLAN_JSON_U64, /* written as a JSON number (a double) */
    PLAN_JSON_BOOL,
} plan_json_type;

typedef struct plan_json_field {
    const char *key;
    size_t off;
    plan_json_type type;
} plan_json_field;

#define PLAN_JSON_FIELD(key, s, member, type) {key, offsetof(s, member), PLAN_JSON_##type}

/* Each field of the table `f` (n of them) of the struct at `base` into `o`,
 * in order. */
void plan_json_add_fields(cJSON *o, const void *base, const plan_json_field *f, size_t n);
#define PLAN_JSON_ADD(o, base, table) \
    plan_json_add_fields(o, base, table, sizeof table / sizeof table[0])

/* "optimizer cpu=0.5,nvme=0.5" style description of a fraction split. */
void plan_format_fractions(const double frac[ZO_PLAN_TIERS], char *buf, size_t len);

#endif
