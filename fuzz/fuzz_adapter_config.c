/* PEFT adapter_config.json (model/lora.h): model_lora_parse_config for a
 * LLaMA and a GPT-2 model. What is accepted is a LoRA choice valid for the
 * model, and the config model_lora_save writes for it reads back the same. */
#include <math.h>
#include <string.h>

#include "common/model_config.h" /* defines: zo_model_preset_find */
#include "fuzz/fuzz.h"
#include "model/lora.h" /* defines: model_lora_parse_config, model_lora_config_text */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static zo_model_config models[2];
    static int ready;
    if (!ready) {
        if (zo_model_preset_find("llama-2-7b", &models[0]) != ZO_OK || zo_model_preset_find("gpt2", &models[1]) != ZO_OK)
            abort();
        ready = 1;
    }
    for (int m = 0; m < 2; m++) {
        zo_lora_config lc, back;
        char base[256];
        if (model_lora_parse_config((const char *)data, size, "fuzz/adapter_config.json", &models[m], &lc, base,
                                    sizeof base) != ZO_OK)
            continue;
        FUZZ_ASSERT(zo_lora_check(&models[m], &lc) == ZO_OK, "accepted, then refused: %s", zo_last_error());
        FUZZ_ASSERT(lc.r >= 1 && isfinite(lc.alpha) && lc.alpha > 0, "r %d alpha %g", lc.r, (double)lc.alpha);
        char *text = model_lora_config_text(&models[m], &lc, base);
        if (!text) continue;
        zo_status st = model_lora_parse_config(text, strlen(text), "fuzz/written.json", &models[m], &back, NULL, 0);
        FUZZ_ASSERT(st == ZO_OK, "the config written for it is refused: %s", zo_last_error());
        /* the same layers adapted ("all-linear" is written as the list of them) */
        unsigned was = zo_lora_targets_effective(&models[m], lc.targets),
                 now = zo_lora_targets_effective(&models[m], back.targets);
        FUZZ_ASSERT(back.r == lc.r && now == was && back.alpha == lc.alpha,
                    "read back as r %d alpha %g layers %#x, was r %d alpha %g layers %#x", back.r,
                    (double)back.alpha, now, lc.r, (double)lc.alpha, was);
        free(text);
    }
    return 0;
}
