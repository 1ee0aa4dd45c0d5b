#include "tests/support/lora_init.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

void lora_init_weights(offload_t *rt, tf_model *m, uint8_t **base)
{
    const model_layout *l = &m->layout;
    uint64_t rng = tf_init_rng(1234), arng = tf_init_rng(99);
    for (int b = 0; b < l->n_blocks; b++) {
        float *w = calloc(l->block_numel[b] + 1, sizeof(float));
        base[b] = calloc(tf_frozen_bytes(m, b) + 1, 1);
        tf_init_block_weights(l, b, w, &rng);
        assert_int_equal(tf_frozen_pack(m, b, w, base[b]), ZO_OK);
        assert_int_equal(offload_set_frozen_block(rt, b, base[b]), ZO_OK);
        float *a = calloc(m->adapters.block_numel[b] + 1, sizeof(float));
        tf_init_lora_block(&m->adapters, b, a, &arng);
        assert_int_equal(offload_set_block(rt, b, a), ZO_OK);
        free(a);
        free(w);
    }
}

int lora_base_changed(offload_t *rt, tf_model *m, uint8_t **base)
{
    int changed = 0;
    for (int b = 0; b < m->layout.n_blocks; b++) {
        size_t fb = tf_frozen_bytes(m, b);
        uint8_t *got = malloc(fb + 1);
        assert_int_equal(offload_get_frozen_block(rt, b, got), ZO_OK);
        changed |= memcmp(got, base[b], fb) != 0;
        free(got);
        free(base[b]);
    }
    free(base);
    return changed;
}
