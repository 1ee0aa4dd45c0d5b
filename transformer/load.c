/* Weights into a model block by block, from a checkpoint or a seed
 * (tf_load_blocks, transformer.h). */
#include <stdlib.h>

#include "model/safetensors.h"       /* defines: model_ckpt_open, model_load_streamed */
#include "transformer/transformer.h" /* defines: tf_init_block_weights, model_block_sink */

zo_status tf_load_blocks(const model_layout *l, const char *path, uint64_t seed, model_block_sink sink, void *ctx)
{
    size_t largest = 1;
    for (int b = 0; b < l->n_blocks; b++)
        if (l->block_numel[b] > largest) largest = l->block_numel[b];
    float *buf = malloc(largest * sizeof(float));
    if (!buf) return zo_error(ZO_ERR_NOMEM, "out of host memory for a block of %zu weights", largest);
    zo_status st = ZO_OK;
    if (path) {
        model_ckpt c;
        if ((st = model_ckpt_open(&c, path)) == ZO_OK) {
            st = model_load_streamed(&c, l, buf, ZO_DTYPE_F32, MODEL_LOAD_STRICT, NULL, sink, ctx);
            model_ckpt_close(&c);
        }
    } else {
        uint64_t rng = tf_init_rng(seed);
        for (int b = 0; b < l->n_blocks && st == ZO_OK; b++) {
            tf_init_block_weights(l, b, buf, &rng);
            st = sink(ctx, b, buf);
        }
    }
    free(buf);
    return st;
}
