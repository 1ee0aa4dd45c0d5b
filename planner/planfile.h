/* Plan files (docs/plan-format.md) and hardware profiles: the planner's side
 * of the plan schema (common/plan_schema.h), which writes, reads and checks
 * them; the CLI reads and writes the files. */
#ifndef ZO_PLANNER_PLANFILE_H
#define ZO_PLANNER_PLANFILE_H

#include <cjson/cJSON.h>

#include "common/capability.h"  /* defines: zo_run_shape, zo_capability_find */
#include "common/plan_schema.h" /* defines: zo_plan, zo_plan_read, zo_plan_write_json */
#include "planner/cost.h"
#include "planner/memory.h"

/* The run a configuration of model m is, as the runtime's capability table
 * sees it (common/capability.h; the same fields zo_run_shape_from_plan reads
 * from the plan file): what `memplan plan` asks of every candidate for a
 * plan file, and what estimate reports of its configuration. */
void plan_run_shape(const zo_model_config *m, const plan_train *t, zo_run_shape *out);

/* The plan for a configuration (docs/plan-format.md): the model, the
 * hardware (may be NULL), the training settings and, when `e` is given, the
 * prediction (with the step time when `pt` is). */
void plan_file_from(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                    const plan_estimate *e, const plan_time *pt, zo_plan *out);

/* The same as JSON, through the schema's one writer, which refuses a plan
 * outside the schema's limits; `what` names it in messages. The caller owns
 * *out. */
zo_status plan_file_json(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                         const plan_estimate *e, const plan_time *pt, const char *what,
                         cJSON **out);

/* A plan read by the schema's reader, as the planner's configuration
 * (`memplan estimate --plan FILE`): it needs the plan's hardware, and the
 * configuration is validated; messages name `path`. */
zo_status plan_file_to(const zo_plan *p, const char *path, zo_model_config *m, plan_hw *hw,
                       plan_train *t);

/* What the planner predicts for a plan (the runtime's tests compare it with
 * a measured run): its estimate (`e` may be NULL) and its step, under the
 * plan's optimizer schedule (`schedule` -1) or another (a zo_plan_schedule).
 * Pure: no I/O. The plan needs its "hardware" (plan_file_to). To predict the
 * CPU backend, give the plan the hardware of plan_hw_cpu_backend. */
zo_status plan_file_predict(const zo_plan *p, const char *path, int schedule, plan_estimate *e,
                            plan_time *out);

/* zo_plan_read and plan_file_to. */
zo_status plan_file_parse(const char *text, const char *path, zo_model_config *m, plan_hw *hw,
                          plan_train *t);

/* A hardware profile, every field (what `memplan calibrate` writes). */
cJSON *plan_hw_json(const plan_hw *hw);

/* Parse a hardware profile (the object plan_hw_json writes, alone or as the
 * "hardware" member of a plan). Fields absent keep the values in *hw, so a
 * profile may override a preset named by its "base" field. */
zo_status plan_hw_parse(const char *text, const char *path, plan_hw *hw);
zo_status plan_hw_from_json(const cJSON *o, const char *path, plan_hw *hw);

#endif
