/* safetensors: model_st_open on the input as a file (a memfd), then every
 * loadable tensor read into fp32, and transposed when it is 2-D. */
#include <string.h>

#include "fuzz/fuzz.h"
#include "model/safetensors.h" /* defines: model_st_open, model_st_read */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_input_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    model_st_file f;
    if (model_st_open(&f, path) == ZO_OK) {
        for (int i = 0; i < f.n_tensors; i++) {
            const model_st_tensor *t = &f.tensors[i];
            FUZZ_ASSERT(model_st_find(&f, t->name) == t, "tensor %s not found by name", t->name);
            if (t->dtype < 0 || t->numel > (1u << 20)) continue;
            float *buf = malloc((t->numel ? t->numel : 1) * sizeof(float));
            if (!buf) continue;
            model_st_read(&f, t, buf, ZO_DTYPE_F32, 0);
            if (t->ndim == 2) model_st_read(&f, t, buf, ZO_DTYPE_F32, 1);
            free(buf);
        }
        model_st_close(&f);
    }
    close(fd);
    return 0;
}
