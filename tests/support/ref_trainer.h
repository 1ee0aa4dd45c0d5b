/* The reference trainer of the tests and benchmarks, independent of the
 * offload runtime: fp32 master weights and AdamW state on the host, the
 * model's parameters and gradients (in the model's dtype) on the device,
 * every block resident, its own AdamW (torch semantics). Not installed.
 *
 * One step: upload the batch, zero the gradients, forward and backward,
 * reduce the sum of squares and the inf/nan flag on the device, copy the
 * gradients to the host as fp32, clip, AdamW, write the new weights back
 * to the device in the model's dtype. With fp16, a dynamic loss scale skips
 * steps whose gradients overflow. */
#ifndef ZO_TESTS_SUPPORT_REF_TRAINER_H
#define ZO_TESTS_SUPPORT_REF_TRAINER_H

#include <stdint.h>

#include "transformer/transformer.h" /* defines: tf_model */

typedef struct tf_adamw {
    float lr, beta1, beta2, eps, weight_decay;
    float clip; /* max global gradient norm; 0 disables clipping */
} tf_adamw;

typedef struct tf_trainer {
    tf_model *m;
    tf_adamw opt;
    int n_blocks;
    float **master;      /* [n_blocks] host fp32 weights */
    float **grad;        /* [n_blocks] host fp32 gradients of the last step */
    float **adam_m, **adam_v;
    void **params;       /* [n_blocks] device, model dtype */
    void **grads;        /* [n_blocks] device, model dtype */
    void *staging;       /* pinned host, the largest block in the model dtype */
    double *d_sumsq;     /* device scalars: sum of squares, inf/nan flag */
    int32_t *d_flag;
    int64_t step;        /* optimizer steps taken */
    float loss_scale;    /* 1 unless fp16 */
    int good_steps;
    int64_t skipped;     /* fp16 steps skipped for overflow */
} tf_trainer;

typedef struct tf_step_info {
    float loss;
    float grad_norm;  /* before clipping */
    int skipped;      /* 1 when an overflow skipped the update */
} tf_step_info;

/* Allocate device parameters and gradients for every block (ZO_ERR_CAPACITY
 * when they and the activations exceed the device memory) and the host
 * state. The master weights are zero: fill them (tf_init_weights, or
 * model_load) and call tf_trainer_upload. */
zo_status tf_trainer_init(tf_trainer *tr, tf_model *m, const tf_adamw *opt);
void tf_trainer_free(tf_trainer *tr);

/* Copy the master weights to the device (converted to the model's dtype). */
zo_status tf_trainer_upload(tf_trainer *tr, gpu_stream_t s);

/* Forward and backward on one batch, gradients left in tr->grad (fp32,
 * unscaled); no update. info->loss is the mean loss. */
zo_status tf_trainer_grads(tf_trainer *tr, gpu_stream_t s, const int32_t *inputs,
                           const int32_t *targets, int b, int t, tf_step_info *info);

/* tf_trainer_grads, then clip and AdamW, then upload the new weights. */
zo_status tf_trainer_step(tf_trainer *tr, gpu_stream_t s, const int32_t *inputs,
                          const int32_t *targets, int b, int t, tf_step_info *info);

#endif
