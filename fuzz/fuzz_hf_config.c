/* Hugging Face config.json: zo_model_config_parse (which validates the
 * shape, its limits included), its parameter counts and (for small shapes)
 * its layout. */
#include <string.h>

#include "common/model_limits.h" /* defines: zo_model_config_check_limits */
#include "fuzz/fuzz.h"
#include "model/layout.h"        /* defines: model_layout_init */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    zo_model_config c;
    if (zo_model_config_parse(text, "fuzz/config.json", &c) == ZO_OK) {
        /* what the parser let through is within the limits */
        FUZZ_ASSERT(zo_model_config_check_limits(&c) == ZO_OK, "%s", zo_last_error());
        zo_param_counts pc;
        zo_model_param_counts(&c, &pc);
        FUZZ_ASSERT(pc.active <= pc.total, "active %llu of %llu", (unsigned long long)pc.active,
                    (unsigned long long)pc.total);
        /* the layout of a shape the limits let through (small ones: it
         * allocates a record per tensor) tiles the count exactly, but for
         * the parameters no block holds (DeepSeek-V3's router score
         * corrections) */
        if (c.n_layers <= 64) {
            model_layout l;
            if (model_layout_init(&l, &c) == ZO_OK) {
                FUZZ_ASSERT((uint64_t)l.total_numel + zo_model_router_bias_params(&c) == pc.total,
                            "layout %zu, count %llu", l.total_numel, (unsigned long long)pc.total);
                model_layout_free(&l);
            }
        }
    }
    free(text);
    return 0;
}
