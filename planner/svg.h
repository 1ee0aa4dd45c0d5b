/* A picture of a plan as SVG: per tier (GPU, CPU, NVMe, per rank) a bar of
 * what lives there, stacked by kind, against the tier's capacity; below, the
 * predicted step time split into its parts. Built in memory, no I/O. */
#ifndef ZO_PLANNER_SVG_H
#define ZO_PLANNER_SVG_H

#include "planner/cost.h"
#include "planner/memory.h"

/* The SVG document (malloc'd, the caller frees it); NULL when out of memory.
 * `pt` may be NULL (no time bar). */
char *plan_svg(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
               const plan_estimate *e, const plan_time *pt);

#endif
