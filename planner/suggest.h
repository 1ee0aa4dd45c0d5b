/* When a configuration does not fit: the first of a fixed ladder of offload
 * steps (ZeRO-Offload, then ZeRO-Infinity) that makes it fit. */
#ifndef ZO_PLANNER_SUGGEST_H
#define ZO_PLANNER_SUGGEST_H

#include "planner/memory.h"

/* On success *found is 1, *out the changed configuration, `flags` the
 * command-line flags that select it (e.g. "--grads cpu --optimizer cpu"). */
zo_status plan_suggest(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                       plan_train *out, char *flags, size_t flags_len, int *found);

#endif
