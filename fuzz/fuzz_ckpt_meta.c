/* A checkpoint's state.json and manifest.json (offload/ckpt_meta.h), and the
 * checkpoint names a folder may hold (its first line as a name). */
#include <string.h>

#include "fuzz/fuzz.h"
#include "offload/ckpt_meta.h" /* defines: ckpt_state_parse, ckpt_manifest_parse */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ckpt_state s;
    if (ckpt_state_parse((const char *)data, size, "fuzz/state.json", &s) == ZO_OK) {
        FUZZ_ASSERT(s.loss_scale > 0 && s.blocks >= 1 && s.step >= 0, "state out of range");
        for (size_t i = 0; i < s.n_expert_steps; i++)
            FUZZ_ASSERT(s.expert_steps[i] >= 0 && s.expert_steps[i] <= s.step, "expert %zu's steps", i);
        ckpt_state_free(&s);
    }
    ckpt_manifest m;
    if (ckpt_manifest_parse((const char *)data, size, "fuzz/manifest.json", &m) == ZO_OK) {
        for (int i = 0; i < m.n_files; i++)
            FUZZ_ASSERT(!strchr(m.files[i].name, '/') && ckpt_manifest_find(&m, m.files[i].name),
                        "file %d: %s", i, m.files[i].name);
        ckpt_manifest_free(&m);
    }
    char name[80];
    size_t n = size < sizeof name - 1 ? size : sizeof name - 1;
    memcpy(name, data, n);
    name[n] = 0;
    name[strcspn(name, "\n")] = 0;
    int64_t step;
    int k;
    if (ckpt_name_parse(name, &step, &k)) {
        char back[80];
        if (k) snprintf(back, sizeof back, "step-%08lld.%d", (long long)step, k);
        else snprintf(back, sizeof back, "step-%08lld", (long long)step);
        FUZZ_ASSERT(!strcmp(back, name), "\"%s\" parses as step %lld k %d, written \"%s\"", name,
                    (long long)step, k, back);
    }
    return 0;
}
