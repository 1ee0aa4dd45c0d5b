/* Private to cpu_adam: the tables of the 8-bit block-wise state and the
 * per-value rules every implementation shares (docs/cpu_adam.md, "q8").
 *
 * A block's values s (its m, or its v, after the fp32 update) are coded as
 *     absmax = the largest |s| of the block       (magnitudes compared as bit
 *                                                   patterns: a nan is largest)
 *     inv    = 1 / absmax                          (adam_q8_scale: 0 for a block
 *                                                   whose absmax is not a normal
 *                                                   number; see there)
 *     code   = the index of the map value nearest to s * inv
 *                                                  (adam_q8_code: the count of
 *                                                   thresholds below it, a nan
 *                                                   taken as 0)
 * and read back as map[code] * absmax. */
#ifndef ZO_CPU_ADAM_Q8_H
#define ZO_CPU_ADAM_Q8_H

#include <float.h>
#include <stdint.h>

#include "common/dtype.h" /* zo_f32_bits */
#include "common/nf4.h"   /* zo_dynamic_map_nearest */
#include "cpu_adam.h"     /* ADAM_Q8_ZERO_M_CODE */

#define ADAM_Q8_ZERO_M ADAM_Q8_ZERO_M_CODE /* the signed map's index of 0 (m) */
#define ADAM_Q8_ZERO_V 0   /* the unsigned map's index of 0 (v) */

/* The vector quantizers look |s * inv| up in a table of buckets keyed by the
 * top 16 bits of its fp32 pattern (the exponent and 7 mantissa bits), from
 * the key of 2^-23 (smaller values are clamped to it: no threshold lies below,
 * the smallest is 1.6e-7) to the key of 1 (|s| <= absmax keeps |s * inv| at
 * most 1 + 2^-23, in that bucket); no bucket holds two thresholds
 * (adam_q8_tables_get checks both). */
#define ADAM_Q8_KEY_LO 0x3400u /* bits of 2^-23, >> 16 */
#define ADAM_Q8_KEY_HI 0x3f80u /* bits of 1.0, >> 16 */
#define ADAM_Q8_LUT (ADAM_Q8_KEY_HI - ADAM_Q8_KEY_LO + 1)

/* A bucket's entry: (t << 16) | c, where c is the code of the bucket's first
 * value and t the low 16 bits of the threshold inside the bucket; a bucket
 * without one holds 0xffffff00 | c. For a magnitude a in the bucket,
 *     code = c + ((low16(a) << 16) > entry)                  (a > t: lower index on a tie)
 *     code = c + (((low16(a) << 16) | 0xff) > entry)         (a >= t)
 * compared as unsigned 32-bit numbers. The signed map's table holds the
 * codes of positive values; a negative value -a takes 254 - code(a) with the
 * second rule, saturated at 0 (the map's negative half mirrors its positive
 * half but for 1.0, and thr[253 - k] = -thr[k]). */
typedef struct adam_q8_tables {
    float map_m[256], map_v[256]; /* signed, unsigned dynamic map */
    float thr_m[255], thr_v[255]; /* their decision thresholds */
    uint32_t lut_m[ADAM_Q8_LUT], lut_v[ADAM_Q8_LUT];
    /* byte k of map_m[c] and map_v[c] (dequantization by byte lookups) */
    uint8_t plane_m[4][256], plane_v[4][256];
} adam_q8_tables;

/* Built once, on first use (thread-safe). */
const adam_q8_tables *adam_q8_tables_get(void);

/* The magnitude of x as a comparable integer: a nan is above inf. */
static inline uint32_t adam_q8_mag(float x) { return zo_f32_bits(x) & 0x7fffffffu; }

/* The absmax a block stores, from the largest adam_q8_mag of its values,
 * and the factor its values are scaled by before coding: 1/absmax for a
 * normal absmax (0 for inf); 0 with absmax kept for a nan, so the whole
 * block reads back as nan (map[code] * nan); 0 with absmax 0 for a block of
 * zeros or of subnormals only (which then reads back as 0). */
static inline float adam_q8_scale(uint32_t max_mag, float *inv)
{
    float a = zo_bits_f32(max_mag);
    if (a >= FLT_MIN) {
        *inv = 1.0f / a;
        return a;
    }
    *inv = 0.0f;
    return a == a ? 0.0f : a;
}

/* The code of the scaled value x: the index of the nearest map value. */
static inline uint8_t adam_q8_code(const float thr[255], float x)
{
    return (uint8_t)zo_dynamic_map_nearest(thr, x == x ? x : 0.0f);
}

#endif
