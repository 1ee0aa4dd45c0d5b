/* Dtype conversion of row blocks for loading and saving checkpoints. */
#include "model_io.h"

#include <string.h>

/* One element of type t at byte pointer p (possibly unaligned), as fp32. */
static inline float load_any(const uint8_t *p, zo_dtype t)
{
    if (t == ZO_DTYPE_F32) {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return t == ZO_DTYPE_F16 ? zo_f16_to_f32(h) : zo_bf16_to_f32(h);
}

zo_status model_io_convert_rows(void *dst, zo_dtype dt, const uint8_t *src, zo_dtype sdt,
                                uint64_t rows, uint64_t cols, uint64_t ld, int transpose)
{
    size_t ssz = zo_dtype_size(sdt), dsz = zo_dtype_size(dt);
    uint64_t n = rows * cols;
    if (!transpose) {
        if (sdt == dt) {
            memcpy(dst, src, (size_t)(n * ssz));
        } else if (((uintptr_t)src % ssz) == 0) {
            zo_convert(dst, dt, src, sdt, (size_t)n);
        } else {
            for (uint64_t i = 0; i < n; i++) zo_store_f32(dst, dt, (size_t)i, load_any(src + i * ssz, sdt));
        }
        return ZO_OK;
    }
    /* src [rows, cols] -> dst [cols, ld], in 32 x 32 tiles so both sides
     * stay in cache; each dst row segment is written in order */
    uint8_t *d = dst;
    for (uint64_t r0 = 0; r0 < rows; r0 += 32) {
        uint64_t r1 = r0 + 32 < rows ? r0 + 32 : rows;
        for (uint64_t c0 = 0; c0 < cols; c0 += 32) {
            uint64_t c1 = c0 + 32 < cols ? c0 + 32 : cols;
            for (uint64_t c = c0; c < c1; c++) {
                const uint8_t *s = src + c * ssz;
                uint8_t *drow = d + c * ld * dsz;
                if (sdt == dt && dsz == 4) {
                    for (uint64_t r = r0; r < r1; r++) {
                        uint32_t v;
                        memcpy(&v, s + r * cols * 4, 4);
                        memcpy(drow + r * 4, &v, 4);
                    }
                } else if (sdt == dt) {
                    for (uint64_t r = r0; r < r1; r++) {
                        uint16_t v;
                        memcpy(&v, s + r * cols * 2, 2);
                        memcpy(drow + r * 2, &v, 2);
                    }
                } else {
                    for (uint64_t r = r0; r < r1; r++)
                        zo_store_f32(dst, dt, (size_t)(c * ld + r), load_any(s + r * cols * ssz, sdt));
                }
            }
        }
    }
    return ZO_OK;
}
