/* Plan files (docs/plan-format.md) and hardware profiles: JSON built and
 * parsed in memory; the CLI reads and writes the files. */
#ifndef ZO_PLANNER_PLANFILE_H
#define ZO_PLANNER_PLANFILE_H

#include <cjson/cJSON.h>

#include "planner/cost.h"
#include "planner/memory.h"

#define PLAN_FILE_FORMAT "zoffload-plan"
#define PLAN_FILE_VERSION 1
#define PLAN_HW_FORMAT "zoffload-hw"
#define PLAN_NVME_DIR_PLACEHOLDER "${ZO_NVME_DIR}"

/* The plan the runtime executes (`train --plan FILE`): model shape,
 * hardware, training settings, placement, buffers and the predicted peak
 * bytes per tier and step time. NULL when out of memory. */
cJSON *plan_file_json(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                      const plan_estimate *e, const plan_time *pt);

/* Read a plan back (`memplan estimate --plan FILE`); messages name `path`
 * and the field. */
zo_status plan_file_parse(const char *text, const char *path, zo_model_config *m, plan_hw *hw,
                          plan_train *t);

/* A hardware description, every field (what `memplan calibrate` writes). */
cJSON *plan_hw_json(const plan_hw *hw);

/* Parse a hardware profile (the object plan_hw_json writes, alone or as the
 * "hardware" member of a plan). Fields absent keep the values in *hw, so a
 * profile may override a preset named by its "base" field. */
zo_status plan_hw_parse(const char *text, const char *path, plan_hw *hw);
zo_status plan_hw_from_json(const cJSON *o, const char *path, plan_hw *hw);

#endif
