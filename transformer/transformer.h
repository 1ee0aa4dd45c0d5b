/* The transformer: GPT-2 (LayerNorm, GELU tanh, learned positions, tied
 * head) and LLaMA (RMSNorm, SwiGLU, RoPE, GQA, untied head; Mistral and Qwen2
 * shapes too) written against the device interface.
 *
 * The model is the block sequence of model/layout.h: block 0 the embedding,
 * blocks 1..L the layers, block L+1 the head (final norm, output projection,
 * loss). Every block has one flat parameter buffer and one gradient buffer of
 * the same layout, both on the device; tf_block_forward / tf_block_backward
 * run one block given its buffers, so a runtime can move blocks
 * independently. The model object owns only the activations (saved for
 * backward, all layers) and the gradient scratch, sized for a micro-batch of
 * at most B sequences of T tokens.
 *
 * Types: parameters, parameter gradients and saved activations are stored as
 * `dtype`; per-row statistics (norms, attention log-sum-exp, losses) and the
 * activation gradients flowing backward are fp32. Arithmetic is fp32.
 *
 * Everything is enqueued on the stream passed in; nothing waits unless the
 * function says so. */
#ifndef ZO_TRANSFORMER_TRANSFORMER_H
#define ZO_TRANSFORMER_TRANSFORMER_H

#include <stdint.h>

#include "common/model_config.h" /* defines: zo_model_config */
#include "gpu/device.h"          /* defines: gpu_device_t, gpu_stream_t */
#include "model/layout.h"        /* defines: model_layout, model_role */

/* Activations one layer saves for its backward ([N = B*T] rows). */
typedef struct tf_layer_acts {
    void *ln1;        /* [N, h]  normed input of attention */
    float *mean1, *rstd1; /* [N] */
    void *qkv;        /* [N, (hq + 2 hkv) d], after RoPE */
    void *att;        /* [N, hq d] attention output */
    float *lse;       /* [B, hq, T] */
    void *x_mid;      /* [N, h]  residual after attention */
    void *ln2;        /* [N, h] */
    float *mean2, *rstd2; /* [N] */
    void *fc;         /* [N, ffn] GPT: pre-GELU; LLaMA: gate */
    void *up;         /* [N, ffn] LLaMA: up (NULL for GPT) */
    void *act;        /* [N, ffn] GELU(fc) or silu(gate) * up */
} tf_layer_acts;

/* How the model holds its activations (all zero: the defaults). */
typedef struct tf_options {
    /* One set of layer activations shared by every layer: a layer's backward
     * must be preceded by tf_block_recompute of that layer (activation
     * checkpointing: only the residual stream between layers is kept). */
    int recompute;
    /* The residual stream buffers res[0..L] are not allocated: the caller
     * points res[l] at buffers of [N, h] in `dtype` before each block call
     * (block b reads res[b-1] and writes res[b]), so a runtime can keep them
     * where it likes (device slots, copies in host memory). */
    int external_res;
} tf_options;

typedef struct tf_model {
    zo_model_config cfg;
    tf_options opts;
    model_layout layout;
    gpu_device_t dev;
    zo_dtype dtype;
    int B, T;            /* largest micro-batch the buffers hold */
    int b, t;            /* the current batch (tf_set_batch) */
    int n_targets;       /* targets != -1 in the current batch */
    int32_t *tokens;     /* [B*T] device */
    int32_t *targets;    /* [B*T] device */
    void **res;          /* [L+1] residual stream [N, h]: res[0] embedding output, res[l+1] layer l output */
    tf_layer_acts *acts; /* [L] */
    void *lnf;           /* [N, h] */
    float *meanf, *rstdf;
    void *logits;        /* [N, vocab] fp32; after the head's backward it holds dlogits */
    float *losses;       /* [N] fp32 */
    void *tmp;           /* [N, h] dtype scratch (projections before the residual add) */
    float *dres;         /* [N, h] gradient of the residual stream */
    float *dh;           /* [N, h] gradient of a norm output */
    float *dqkv;         /* [N, (hq + 2 hkv) d] */
    float *datt;         /* [N, hq d] */
    float *dff, *dff2;   /* [N, ffn] */
    size_t act_bytes;    /* device bytes of all of the above */
} tf_model;

/* Build the layout and allocate activations for micro-batches up to B x T
 * on `dev` (ZO_ERR_CAPACITY when they do not fit). T <= cfg->max_seq for
 * GPT (learned positions). */
zo_status tf_init(tf_model *m, const zo_model_config *cfg, gpu_device_t dev, zo_dtype dtype,
                  int B, int T);
/* tf_init with options (opts NULL: the defaults). */
zo_status tf_init_opts(tf_model *m, const zo_model_config *cfg, gpu_device_t dev, zo_dtype dtype,
                       int B, int T, const tf_options *opts);
void tf_free(tf_model *m);

/* Bytes of block `block`'s parameter (= gradient) buffer. */
size_t tf_block_bytes(const tf_model *m, int block);

/* Tensor `role` of a block buffer as a device tensor (data NULL when the
 * block has no such role). */
gpu_tensor tf_view(const tf_model *m, const void *block_buf, int block, model_role role);

/* Upload a batch: inputs and targets are host arrays of b*t ids (a target
 * of -1 is ignored by the loss); they must stay valid until the stream has
 * run the copies. b <= B, t <= T. */
zo_status tf_set_batch(tf_model *m, gpu_stream_t s, const int32_t *inputs, const int32_t *targets,
                       int b, int t);

/* Buffers a block needs. `params`/`grads`: the block's own buffers. The
 * head of a tied model also reads the embedding block's parameters and adds
 * the output projection's gradient to the embedding block's gradients
 * (`embed_params`, `embed_grads`; ignored otherwise). */
typedef struct tf_block_bufs {
    const void *params;
    void *grads;
    const void *embed_params;
    void *embed_grads;
} tf_block_bufs;

/* Forward of one block on the current batch. The head's forward computes the
 * logits and the per-token losses. */
zo_status tf_block_forward(tf_model *m, int block, const tf_block_bufs *bufs, gpu_stream_t s);
/* Backward of one block, after the forward of every block and the backward
 * of the blocks after it. Gradients are ADDED to bufs->grads (zero them once
 * per step, then micro-batches accumulate). `loss_scale` multiplies the
 * gradient of the mean loss (1 without loss scaling); only the head uses it. */
zo_status tf_block_backward(tf_model *m, int block, const tf_block_bufs *bufs, float loss_scale,
                            gpu_stream_t s);

/* Recompute the activations a block's backward reads from its input
 * (res[block-1] for a layer), without writing its output. A no-op for the
 * embedding and the head. */
zo_status tf_block_recompute(tf_model *m, int block, const tf_block_bufs *bufs, gpu_stream_t s);

/* The whole model over per-block buffer arrays (params[i], grads[i] for
 * block i). */
zo_status tf_forward(tf_model *m, void *const *params, gpu_stream_t s);
zo_status tf_backward(tf_model *m, void *const *params, void *const *grads, float loss_scale,
                      gpu_stream_t s);

/* Synchronize the stream and return the mean loss over the counted targets. */
zo_status tf_loss(tf_model *m, gpu_stream_t s, float *loss);

/* GPT-2-style random initialization of fp32 host block buffers from a seed:
 * weights ~ N(0, 0.02), output projections of residual branches scaled by
 * 1/sqrt(2 L), biases 0, norm weights 1. */
void tf_init_weights(const model_layout *l, float *const *host_blocks, uint64_t seed);
/* The same weights one block at a time: *rng starts as tf_init_rng(seed) and
 * the blocks are taken in order, 0 to n_blocks - 1. */
uint64_t tf_init_rng(uint64_t seed);
void tf_init_block_weights(const model_layout *l, int block, float *dst, uint64_t *rng);

#endif
