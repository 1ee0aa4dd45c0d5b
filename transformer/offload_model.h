/* The transformer on the offload runtime: the blocks of a tf_model as an
 * offload_model. The runtime owns the weights, gradients and the residual
 * stream between blocks; the model keeps its per-layer activations (or one
 * shared set with recompute). The model must be built with
 * tf_options.external_res = 1 (and .recompute = 1 when the runtime
 * recomputes, .recompute_layers its config.recompute_layers). Weight decay
 * applies to the 2-D tensors. */
#ifndef ZO_TRANSFORMER_OFFLOAD_MODEL_H
#define ZO_TRANSFORMER_OFFLOAD_MODEL_H

#include "offload/offload.h"          /* defines: offload_model */
#include "transformer/transformer.h"  /* defines: tf_model */

typedef struct tf_offload_model {
    tf_model *m;
    offload_model om;
    int *dep;                    /* [n_blocks]: the tied head reads the embedding */
    int *layer;                  /* [n_blocks]: block b is layer b - 1; the embedding and head none */
    offload_decay_range *decay;  /* the 2-D tensors */
    offload_expert_range *experts; /* a mixture of experts: each routed expert's weights or adapters */
    int n_experts;
    size_t *frozen_xlo, *frozen_xhi; /* [n_blocks] the routed experts' bytes of the frozen base (LoRA) */
} tf_offload_model;

zo_status tf_offload_model_init(tf_offload_model *a, tf_model *m);
void tf_offload_model_free(tf_offload_model *a);

#endif
