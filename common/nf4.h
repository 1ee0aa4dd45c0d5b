/* NF4 with double quantization: the 4-bit format of QLoRA (Dettmers et al.,
 * "QLoRA: Efficient Finetuning of Quantized LLMs", 2023), as bitsandbytes
 * stores it (quant_type "nf4", compress_statistics).
 *
 * A tensor of n weights (row-major, our [out, in] layout) is cut into blocks
 * of ZO_NF4_BLOCK = 64 consecutive weights. Each block keeps its absmax
 * (the largest |w|) and every weight becomes the index of the nearest of the
 * 16 NF4 values (zo_nf4_code) to w / absmax: 4 bits. The absmax constants
 * are quantized in turn (double quantization): their mean is subtracted
 * (one fp32 offset for the tensor), the centred constants are cut into
 * blocks of ZO_NF4_BLOCK2 = 256, each block keeps its own absmax as an fp32
 * scale, and each constant becomes the 8-bit index of the nearest value of
 * bitsandbytes' signed dynamic map (zo_nf4_absmax_map) to c / scale.
 *
 * One tensor is one contiguous buffer, 4-byte aligned:
 *     offset   fp32                      mean of the block absmax constants
 *     scale2   fp32 [ceil(nb / 256)]     absmax of each block of 256 centred constants
 *     absq     u8   [nb = ceil(n / 64)]  each block's absmax, 8-bit dynamic code
 *     codes    u8   [ceil(n / 2)]        two weights per byte: weight 2i in the high
 *                                        nibble, 2i+1 in the low one (bitsandbytes'
 *                                        order); an odd n leaves the last low nibble 0
 * so an NF4 tensor takes exactly zo_nf4_bytes(n) = 4 + 4 ceil(nb/256) + nb +
 * ceil(n/2) bytes: 0.5 + 1/64 + 4/(64*256) bytes a weight plus 4 bytes (4.127
 * bits a weight, the paper's figure), not a flat 0.5.
 *
 * Dequantization (the reference here, gpu_nf4_dequantize on a device):
 *     absmax_b = map[absq[b]] * scale2[b / 256] + offset      (fp32, in that order)
 *     w_i      = code[codes(i)] * absmax_(i / 64)              (fp32, then rounded to
 *                                                             the output type)
 * Quantization picks the nearest value: an index is the count of decision
 * thresholds below the value, each threshold the midpoint of two neighbouring
 * values computed in double and rounded to fp32 (a value on a threshold takes
 * the lower index, as bitsandbytes' comparisons do). w / absmax and c / scale
 * are fp32 divisions; an all-zero block (or a scale of 0) quantizes to the
 * index of 0.0. The error this leaves is bounded per weight by half the gap
 * between the code values around w / absmax, times absmax, plus the error of
 * the double-quantized absmax (docs/transformer.md, "NF4"). */
#ifndef ZO_COMMON_NF4_H
#define ZO_COMMON_NF4_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"  /* defines: zo_dtype */
#include "status.h" /* defines: zo_status */

#define ZO_NF4_BLOCK 64   /* weights per absmax constant */
#define ZO_NF4_BLOCK2 256 /* absmax constants per fp32 scale */
#define ZO_NF4_ALIGN 4    /* the buffer's alignment (its fp32 fields) */

/* Where each part of an n-weight tensor lies: byte offsets into its buffer. */
typedef struct zo_nf4_layout {
    uint64_t n;          /* weights */
    uint64_t n_blocks;   /* absmax constants: ceil(n / 64) */
    uint64_t n_blocks2;  /* fp32 scales of the constants: ceil(n_blocks / 256) */
    uint64_t off_scale2; /* fp32 [n_blocks2]; the offset is the fp32 at byte 0 */
    uint64_t off_absq;   /* u8 [n_blocks] */
    uint64_t off_codes;  /* u8 [ceil(n / 2)] */
    uint64_t bytes;      /* the whole tensor: zo_nf4_bytes(n) */
} zo_nf4_layout;

void zo_nf4_layout_of(uint64_t n, zo_nf4_layout *out);
/* Bytes of an NF4 tensor of n weights, exactly (the planner sizes with it). */
uint64_t zo_nf4_bytes(uint64_t n);

/* The 16 NF4 values, ascending, from -1 to 1 (the paper's table). */
extern const float zo_nf4_code[16];
/* The 256 values of the signed dynamic map the absmax constants are coded
 * in, ascending: zo_dynamic_map(map, 1). */
void zo_nf4_absmax_map(float map[256]);

/* bitsandbytes' dynamic quantization map (create_dynamic_map; Dettmers,
 * "8-Bit Approximations for Parallelism in Deep Learning", 2016, used by
 * "8-bit Optimizers via Block-wise Quantization", 2022), 256 values
 * ascending. Each value is a power of ten (the exponent) times a linear
 * fraction: for i = 0..6, 10^(i-6) times each of the k midpoints of
 * linspace(0.1, 1, k + 1), then 0 and 1.
 *   signed:   k = 2^i, each value and its negative: 127 negative values (the
 *             most negative is -0.99296875; -1 is not in the map), 0 at
 *             index 127, 128 positive ones up to 1 at index 255;
 *   unsigned: k = 2^(i+1): 0 at index 0, 254 values from 1.625e-7 up, 1 at 255.
 * Each value is computed in double and rounded once to fp32. */
void zo_dynamic_map(float map[256], int is_signed);

/* The decision thresholds of an ascending 256-value map: thr[k] is the
 * midpoint of map[k] and map[k + 1], computed in double, rounded to fp32. */
void zo_dynamic_map_thresholds(float thr[255], const float map[256]);

/* The index of the map value nearest to x: the count of thresholds below x,
 * by binary search (8 comparisons). A value on a threshold takes the lower
 * index, as bitsandbytes' comparisons do; nan gives 0. */
static inline int zo_dynamic_map_nearest(const float thr[255], float x)
{
    int p = 0;
    for (int step = 128; step >= 1; step >>= 1)
        if (x > thr[p + step - 1]) p += step;
    return p;
}

/* Quantize src [n] (fp32) into dst (zo_nf4_bytes(n) bytes, 4-byte aligned):
 * OpenMP over blocks with `n_threads` threads (0: the OpenMP default); the
 * result does not depend on the thread count. ZO_ERR_INVALID for a NULL or
 * misaligned buffer or a weight that is not finite (named by index). */
zo_status zo_nf4_quantize(void *dst, const float *src, uint64_t n, int n_threads);

/* Dequantize an NF4 tensor of n weights into dst [n] of type dt (the host
 * reference of gpu_nf4_dequantize). */
void zo_nf4_dequantize(void *dst, zo_dtype dt, const void *src, uint64_t n, int n_threads);

/* The absmax of block b as dequantization uses it (after the double
 * quantization), and the 4-bit code of weight i: for checks and tests. */
float zo_nf4_block_absmax(const void *src, uint64_t n, uint64_t b);
int zo_nf4_code_of(const void *src, uint64_t n, uint64_t i);

#endif
