/* safetensors: model_st_open on the input as a file (a memfd), then every
 * loadable tensor read into fp32, and transposed when it is 2-D, every
 * FP8 tensor with a "_scale_inv" dequantized into bf16, and every
 * "<name>_blocks" with a "<name>_scales" dequantized as MXFP4 into bf16
 * (whole, a run from its middle, and transposed). */
#include <stdio.h>
#include <string.h>

#include "fuzz/fuzz.h"
#include "model/safetensors.h" /* defines: model_st_open, model_st_read, model_st_read_fp8, model_st_read_mxfp4 */

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
        /* FP8 weights with their "<name>_scale_inv", at the default block and at 1 x 1 */
        for (int i = 0; i < f.n_tensors; i++) {
            const model_st_tensor *t = &f.tensors[i];
            char sname[256];
            snprintf(sname, sizeof sname, "%.200s_scale_inv", t->name);
            const model_st_tensor *s = model_st_find(&f, sname);
            if (strncmp(t->dtype_name, "F8_", 3) || !s || t->numel > (1u << 20)) continue;
            uint16_t *buf = malloc((t->numel ? t->numel : 1) * sizeof *buf);
            if (!buf) continue;
            static const int blocks[2][2] = {{MODEL_FP8_BLOCK, MODEL_FP8_BLOCK}, {1, 1}};
            for (int b = 0; b < 2; b++)
                if (s->numel <= (1u << 20)) model_st_read_fp8(&f, t, &f, s, blocks[b], buf, ZO_DTYPE_BF16, b);
            free(buf);
        }
        /* MXFP4 weights: "<name>_blocks" with "<name>_scales" */
        for (int i = 0; i < f.n_tensors; i++) {
            const model_st_tensor *t = &f.tensors[i];
            size_t n = strlen(t->name);
            char sname[256];
            if (n < 7 || strcmp(t->name + n - 7, "_blocks") || t->numel > (1u << 19)) continue;
            snprintf(sname, sizeof sname, "%.*s_scales", (int)(n - 7 > 200 ? 200 : n - 7), t->name);
            const model_st_tensor *s = model_st_find(&f, sname);
            if (!s) continue;
            uint64_t x = t->numel * 2;
            uint16_t *buf = malloc((x ? x : 1) * sizeof *buf);
            if (!buf) continue;
            model_st_read_mxfp4(&f, t, &f, s, 0, x, buf, ZO_DTYPE_BF16, 0);
            model_st_read_mxfp4(&f, t, &f, s, x / 3, x / 2, buf, ZO_DTYPE_BF16, 0);
            model_st_read_mxfp4(&f, t, &f, s, x / 5, x / 2, buf, ZO_DTYPE_BF16, 1);
            free(buf);
        }
        model_st_close(&f);
    }
    close(fd);
    return 0;
}
