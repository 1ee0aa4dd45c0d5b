/* What a model's shape and constants must satisfy beyond being positive
 * (zo_model_config_validate): no count the project forms from them can
 * overflow, and the constants make sense. Called by
 * zo_model_config_validate, and so by every parser of a shape (presets,
 * config.json, plans, memplan's flags) and the layout, so that nonsense is
 * bad input (memplan exit 2), never a wrapped product that "does not fit". */
#ifndef ZO_COMMON_MODEL_LIMITS_H
#define ZO_COMMON_MODEL_LIMITS_H

#include "common/model_config.h" /* defines: zo_model_config */
#include "common/status.h"       /* defines: zo_status */

/* Layers: a block each in the runtime (an int), and a bound far above any
 * model that exists (a few hundred). */
#define ZO_MODEL_MAX_LAYERS 65536
/* Parameters, and the elements of any one tensor: at most 2^53, the
 * integers a double (and so JSON, and the planner's arithmetic) holds
 * exactly; bytes of the optimizer's state (16 a parameter) stay below 2^64. */
#define ZO_MODEL_MAX_PARAMS 9007199254740992.0

/* ZO_ERR_INVALID naming the model and the field when: a norm epsilon
 * (layer_norm_epsilon, rms_norm_eps) is negative or not finite; rope_theta
 * is negative or not finite; the
 * layers are more than ZO_MODEL_MAX_LAYERS; or an upper bound of the
 * parameter count or of one tensor's elements passes ZO_MODEL_MAX_PARAMS
 * (computed in double, so the check itself cannot overflow; MoE experts,
 * shared experts and routers, and latent attention's projections counted).
 * A config with only a parameter total (params_override) has just that
 * total checked. zo_model_config_validate calls it. */
zo_status zo_model_config_check_limits(const zo_model_config *c);

#endif
