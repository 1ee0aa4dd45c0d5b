/* The 8-bit block-wise step (ADAM_STATE_Q8) with AVX-512 F/BW/VL/DQ and
 * VBMI, written once and compiled twice: adam_q8_avx512.c and
 * adam_q8_avx512_bf16.c include adam_avx512_body.h (the update of 16 lanes,
 * the conversions) and then this file, with ADAM_AVX512_Q8 naming the kernel.
 *
 * A block takes two passes (adam_q8.h has the rules, adam_scalar.c the
 * reference these lanes reproduce bit for bit):
 *   1. per 64 elements: the codes of m and v become fp32 by byte lookups
 *      (q8_dequant64), times the block's absmax; the update of adam_update
 *      writes p and the 16-bit copy; the new m and v go to a block-sized
 *      scratch (L1) and their largest magnitudes are kept;
 *   2. the absmax of the block gives 1/absmax; each value times it is coded
 *      through the bucket table (q8_code16: one gather, one comparison).
 * The step is bound by its instructions, not by memory: a zmm square root
 * and division per 16 lanes (adam_update's) occupy the vector ports so that
 * only about 8 other vector instructions and 2 gathers per 16 lanes run
 * beside them free, and the coding takes more. Gathers for the
 * dequantization too, or pass 2 of a block interleaved with pass 1 of the
 * next, measured no faster (docs/performance.md, "q8 state").
 * With ADAM_AVX512_Q8_CODEC defined (adam_q8_avx512.c), the same lookups and
 * coder also make adam_state_to_f32's and adam_state_from_f32's kernels. */
#include <immintrin.h>
#include <stdint.h>

/* Codes permuted so that the byte lookups of q8_dequant64 come out in
 * element order: position 16L + 4k + t holds element 16k + 4L + t (a 4 x 4
 * transpose of 4-byte groups, its own inverse). */
static const uint8_t q8_transpose[64] = {
    0,  1,  2,  3,  16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51,
    4,  5,  6,  7,  20, 21, 22, 23, 36, 37, 38, 39, 52, 53, 54, 55,
    8,  9,  10, 11, 24, 25, 26, 27, 40, 41, 42, 43, 56, 57, 58, 59,
    12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47, 60, 61, 62, 63,
};

/* Byte 4q of dword vectors a (q = 0..15) and b (q = 16..31) into bytes
 * 0..31 (q8_pack_lo) or 32..63 (q8_pack_hi) of the result. */
static const uint8_t q8_pack_lo[64] = {
    0,  4,  8,  12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52,  56,  60,
    64, 68, 72, 76, 80, 84, 88, 92, 96, 100, 104, 108, 112, 116, 120, 124,
};
static const uint8_t q8_pack_hi[64] = {
    [32] = 0,  4,  8,  12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52,  56,  60,
    64,        68, 72, 76, 80, 84, 88, 92, 96, 100, 104, 108, 112, 116, 120, 124,
};

/* 64 codes -> the 64 map values, in four vectors of 16 elements: byte k of
 * each value is looked up in plane k (two 128-byte lookups and a blend on
 * the code's top bit), and the four bytes are interleaved back into fp32. */
ADAM_INLINE void q8_dequant64(const uint8_t plane[4][256], __m512i codes, __m512 out[4])
{
    __m512i c = _mm512_permutexvar_epi8(_mm512_loadu_si512(q8_transpose), codes);
    __mmask64 upper = _mm512_movepi8_mask(c);
    __m512i b[4];
    for (int k = 0; k < 4; k++) {
        __m512i lo = _mm512_permutex2var_epi8(_mm512_loadu_si512(plane[k]), c,
                                              _mm512_loadu_si512(plane[k] + 64));
        __m512i hi = _mm512_permutex2var_epi8(_mm512_loadu_si512(plane[k] + 128), c,
                                              _mm512_loadu_si512(plane[k] + 192));
        b[k] = _mm512_mask_blend_epi8(upper, lo, hi);
    }
    __m512i w01l = _mm512_unpacklo_epi8(b[0], b[1]), w01h = _mm512_unpackhi_epi8(b[0], b[1]);
    __m512i w23l = _mm512_unpacklo_epi8(b[2], b[3]), w23h = _mm512_unpackhi_epi8(b[2], b[3]);
    out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01l, w23l));
    out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01l, w23l));
    out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01h, w23h));
    out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01h, w23h));
}

/* The codes of 16 scaled values x = s * inv, in the low byte of each lane
 * (adam_q8.h: the bucket of |x| clamped to [2^-23, 1], a nan as 2^-23, and
 * one comparison with the bucket's threshold). Signed: the code of |x| with
 * ties upward where x < 0 (*neg), which the caller mirrors (254 - code). */
ADAM_INLINE __m512i q8_code16(const uint32_t *lut, __m512 s, __m512 inv, const int is_signed,
                              __mmask16 *neg)
{
    __m512 x = _mm512_mul_ps(s, inv);
    if (is_signed) {
        *neg = _mm512_movepi32_mask(_mm512_castps_si512(x));
        x = _mm512_abs_ps(x);
    }
    /* max returns its second operand for a nan; v's negative values (none
     * arise) would clamp to 2^-23 and take code 0, as the search gives. No
     * clamp from above: |s| <= absmax makes x at most 1 + 2^-23, in the
     * top bucket (inv is 0 for an infinite or nan absmax). */
    __m512 a = _mm512_max_ps(x, _mm512_set1_ps(0x1p-23f));
    __m512i u = _mm512_castps_si512(a);
    /* the table's entry for key k lies at lut + (k - ADAM_Q8_KEY_LO) */
    const void *base = (const void *)((uintptr_t)lut - 4u * ADAM_Q8_KEY_LO);
    __m512i e = _mm512_i32gather_epi32(_mm512_srli_epi32(u, 16), base, 4);
    __m512i low = _mm512_slli_epi32(u, 16);
    if (is_signed) low = _mm512_mask_or_epi32(low, *neg, low, _mm512_set1_epi32(0xff));
    __mmask16 up = _mm512_cmpgt_epu32_mask(low, e);
    return _mm512_mask_sub_epi32(e, up, e, _mm512_set1_epi32(-1));
}

/* The low bytes of four vectors of 16 codes, in element order. */
ADAM_INLINE __m512i q8_pack64(const __m512i e[4])
{
    __m512i lo = _mm512_permutex2var_epi8(e[0], _mm512_loadu_si512(q8_pack_lo), e[1]);
    __m512i hi = _mm512_permutex2var_epi8(e[2], _mm512_loadu_si512(q8_pack_hi), e[3]);
    return _mm512_mask_blend_epi8(0xffffffff00000000ull, lo, hi);
}

/* Lanes of span j of a 64-element group with r elements left from it. */
ADAM_INLINE __mmask16 q8_span_mask(size_t r, int j)
{
    size_t e = 16 * (size_t)j;
    return r >= e + 16 ? (__mmask16)0xffff : r > e ? (__mmask16)((1u << (r - e)) - 1) : 0;
}

/* Pass 1 on elements [i, i + 64) of a block (tail: only the first r exist). */
ADAM_INLINE void q8_update64(const avx512_k *K, const adam_q8_tables *t, size_t i, size_t r,
                             const int tail, float *restrict p, const void *restrict g,
                             const zo_dtype gd, const uint8_t *restrict qm,
                             const uint8_t *restrict qv, __m512 am, __m512 av,
                             void *restrict out, const int od, const int l2, const int nt,
                             float *restrict sm, float *restrict sv, __m512i *max_m,
                             __m512i *max_v)
{
    __mmask64 k64 = tail ? (__mmask64)(((uint64_t)1 << r) - 1) : ~(__mmask64)0;
    __m512 dm[4], dv[4];
    q8_dequant64(t->plane_m, tail ? _mm512_maskz_loadu_epi8(k64, qm + i) : _mm512_loadu_si512(qm + i), dm);
    q8_dequant64(t->plane_v, tail ? _mm512_maskz_loadu_epi8(k64, qv + i) : _mm512_loadu_si512(qv + i), dv);
    const __m512i mag = _mm512_set1_epi32(0x7fffffff);
    for (int j = 0; j < 4; j++) {
        size_t e = i + 16 * (size_t)j;
        __mmask16 k = tail ? q8_span_mask(r, j) : 0xffff;
        __m512 mm = _mm512_mul_ps(dm[j], am), vv = _mm512_mul_ps(dv[j], av);
        __m512 pp = tail ? _mm512_maskz_loadu_ps(k, p + e) : _mm512_loadu_ps(p + e);
        avx512_adam(K, &pp, &mm, &vv, avx512_load_grad(g, e, gd, k, tail), l2);
        if (tail) _mm512_mask_storeu_ps(p + e, k, pp);
        else _mm512_storeu_ps(p + e, pp);
        if (od != OUT_NONE) avx512_store16(out, e, pp, od, k, tail, nt);
        _mm512_store_ps(sm + e, mm);
        _mm512_store_ps(sv + e, vv);
        *max_m = _mm512_mask_max_epu32(*max_m, k, *max_m,
                                       _mm512_and_si512(_mm512_castps_si512(mm), mag));
        /* v >= +0 or nan: its bits are its magnitude */
        *max_v = _mm512_mask_max_epu32(*max_v, k, *max_v, _mm512_castps_si512(vv));
    }
}

/* Pass 2 on elements [i, i + 64): code the values of sm and sv (the step's
 * scratch, or adam_state_from_f32's arrays at any 4-byte alignment; tail:
 * only the first r are read and coded). */
ADAM_INLINE void q8_code64(const adam_q8_tables *t, size_t i, size_t r, const int tail,
                           const float *restrict sm, const float *restrict sv, __m512 inv_m,
                           __m512 inv_v, uint8_t *restrict qm, uint8_t *restrict qv)
{
    __m512i em[4], ev[4];
    __mmask16 neg[4];
    for (int j = 0; j < 4; j++) {
        const float *a = sm + i + 16 * j, *b = sv + i + 16 * j;
        __mmask16 k = tail ? q8_span_mask(r, j) : 0xffff;
        __m512 xm = tail ? _mm512_maskz_loadu_ps(k, a) : _mm512_loadu_ps(a);
        __m512 xv = tail ? _mm512_maskz_loadu_ps(k, b) : _mm512_loadu_ps(b);
        em[j] = q8_code16(t->lut_m, xm, inv_m, 1, &neg[j]);
        ev[j] = q8_code16(t->lut_v, xv, inv_v, 0, NULL);
    }
    __mmask64 negative = _mm512_kunpackd(_mm512_kunpackw(neg[3], neg[2]),
                                         _mm512_kunpackw(neg[1], neg[0]));
    __m512i cm = q8_pack64(em);
    cm = _mm512_mask_subs_epu8(cm, negative, _mm512_set1_epi8((char)254), cm);
    __m512i cv = q8_pack64(ev);
    if (tail) {
        __mmask64 k64 = (__mmask64)(((uint64_t)1 << r) - 1);
        _mm512_mask_storeu_epi8(qm + i, k64, cm);
        _mm512_mask_storeu_epi8(qv + i, k64, cv);
    } else {
        _mm512_storeu_si512(qm + i, cm);
        _mm512_storeu_si512(qv + i, cv);
    }
}

/* One block of n <= ADAM_Q8_BLOCK_MAX elements. */
ADAM_INLINE void q8_block(const avx512_k *K, const adam_q8_tables *t, size_t n,
                          float *restrict p, const void *restrict g, const zo_dtype gd,
                          uint8_t *restrict qm, uint8_t *restrict qv, float *restrict am,
                          float *restrict av, void *restrict out, const int od, const int l2,
                          const int nt, float *restrict sm, float *restrict sv)
{
    __m512 am0 = _mm512_set1_ps(*am), av0 = _mm512_set1_ps(*av);
    __m512i max_m = _mm512_setzero_si512(), max_v = max_m;
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        q8_update64(K, t, i, 64, 0, p, g, gd, qm, qv, am0, av0, out, od, l2, nt, sm, sv, &max_m,
                    &max_v);
    if (i < n)
        q8_update64(K, t, i, n - i, 1, p, g, gd, qm, qv, am0, av0, out, od, l2, nt, sm, sv,
                    &max_m, &max_v);
    float inv_m, inv_v;
    *am = adam_q8_scale(_mm512_reduce_max_epu32(max_m), &inv_m);
    *av = adam_q8_scale(_mm512_reduce_max_epu32(max_v), &inv_v);
    __m512 im = _mm512_set1_ps(inv_m), iv = _mm512_set1_ps(inv_v);
    for (i = 0; i + 64 <= n; i += 64) q8_code64(t, i, 64, 0, sm, sv, im, iv, qm, qv);
    if (i < n) q8_code64(t, i, n - i, 1, sm, sv, im, iv, qm, qv);
}

ADAM_INLINE void q8_update_t(const adam_consts *c, const adam_q8_tables *t, size_t block,
                             size_t n, float *restrict p, const void *restrict g,
                             const zo_dtype gd, uint8_t *restrict qm, uint8_t *restrict qv,
                             float *restrict am, float *restrict av, void *restrict out,
                             const int od, const int l2)
{
    /* the new moments of one block, between the passes */
    float sm[ADAM_Q8_BLOCK_MAX] __attribute__((aligned(64)));
    float sv[ADAM_Q8_BLOCK_MAX] __attribute__((aligned(64)));
    avx512_k K = ADAM_BROADCAST(_mm512_set1_ps, c);
    size_t gs = zo_dtype_size(gd), os = od == OUT_NONE ? 0 : 2;
    /* stream the copy past the cache when its vectors are 32-byte aligned
     * (blocks are multiples of 64 elements, so all of them are then) */
    int nt = od != OUT_NONE && ((uintptr_t)out & 31) == 0;
    for (size_t i = 0, b = 0; i < n; i += block, b++) {
        size_t len = n - i < block ? n - i : block;
        q8_block(&K, t, len, p + i, (const char *)g + i * gs, gd, qm + i, qv + i, am + b, av + b,
                 od == OUT_NONE ? NULL : (char *)out + i * os, od, l2, nt, sm, sv);
    }
    if (nt) _mm_sfence();
}

void ADAM_AVX512_Q8(const adam_consts *c, const adam_q8_tables *t, size_t block, size_t n,
                    float *restrict p, const void *restrict g, zo_dtype gd, uint8_t *restrict qm,
                    uint8_t *restrict qv, float *restrict am, float *restrict av,
                    void *restrict out, zo_dtype od)
{
#define CALL(GD, OD, L2) q8_update_t(c, t, block, n, p, g, GD, qm, qv, am, av, out, OD, L2)
    ADAM_DISPATCH(gd, out, od, c->use_l2, CALL)
#undef CALL
}

#ifdef ADAM_AVX512_Q8_CODEC
/* ---- adam_state_to_f32 and adam_state_from_f32 on q8 state --------------------------------
 * The step's two halves on their own: the byte lookups of pass 1 (decode),
 * and the absmax and pass 2 (encode), bit for bit adam_q8_encode_scalar. */

/* Elements [i, i + 64) of a block (tail: the first r): map[code] * absmax. */
ADAM_INLINE void q8_decode64(const adam_q8_tables *t, size_t i, size_t r, const int tail,
                             const uint8_t *restrict qm, const uint8_t *restrict qv, __m512 am,
                             __m512 av, float *restrict m, float *restrict v)
{
    __mmask64 k64 = tail ? (__mmask64)(((uint64_t)1 << r) - 1) : ~(__mmask64)0;
    __m512 dm[4], dv[4];
    q8_dequant64(t->plane_m, tail ? _mm512_maskz_loadu_epi8(k64, qm + i) : _mm512_loadu_si512(qm + i), dm);
    q8_dequant64(t->plane_v, tail ? _mm512_maskz_loadu_epi8(k64, qv + i) : _mm512_loadu_si512(qv + i), dv);
    for (int j = 0; j < 4; j++) {
        float *a = m + i + 16 * j, *b = v + i + 16 * j;
        __m512 xm = _mm512_mul_ps(dm[j], am), xv = _mm512_mul_ps(dv[j], av);
        if (tail) {
            __mmask16 k = q8_span_mask(r, j);
            _mm512_mask_storeu_ps(a, k, xm);
            _mm512_mask_storeu_ps(b, k, xv);
        } else {
            _mm512_storeu_ps(a, xm);
            _mm512_storeu_ps(b, xv);
        }
    }
}

void ADAM_AVX512_Q8_DECODE(const adam_q8_tables *t, size_t block, size_t n,
                           const uint8_t *restrict qm, const uint8_t *restrict qv,
                           const float *restrict am, const float *restrict av, float *restrict m,
                           float *restrict v)
{
    for (size_t i0 = 0, b = 0; i0 < n; i0 += block, b++) {
        size_t len = n - i0 < block ? n - i0 : block, i = 0;
        __m512 a = _mm512_set1_ps(am[b]), c = _mm512_set1_ps(av[b]);
        for (; i + 64 <= len; i += 64) q8_decode64(t, i0 + i, 64, 0, qm, qv, a, c, m, v);
        if (i < len) q8_decode64(t, i0 + i, len - i, 1, qm, qv, a, c, m, v);
    }
}

/* The largest magnitudes (adam_q8_mag: a nan above inf) of 16 lanes of x
 * (tail: those in k) into *max. Unlike the step's v, a v given here may be
 * -0 (from_f32 refuses only v < 0), so v's sign bit is cleared too. */
ADAM_INLINE void q8_max16(const float *x, __mmask16 k, const int tail, __m512i *max)
{
    __m512 a = tail ? _mm512_maskz_loadu_ps(k, x) : _mm512_loadu_ps(x);
    *max = _mm512_max_epu32(*max, _mm512_and_si512(_mm512_castps_si512(a),
                                                   _mm512_set1_epi32(0x7fffffff)));
}

void ADAM_AVX512_Q8_ENCODE(const adam_q8_tables *t, size_t block, size_t n,
                           const float *restrict m, const float *restrict v,
                           uint8_t *restrict qm, uint8_t *restrict qv, float *restrict am,
                           float *restrict av)
{
    for (size_t i0 = 0, b = 0; i0 < n; i0 += block, b++) {
        size_t len = n - i0 < block ? n - i0 : block, i = 0;
        const float *bm = m + i0, *bv = v + i0;
        /* two accumulators a moment: the max's latency, not its throughput */
        __m512i mm[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        __m512i mv[2] = {mm[0], mm[0]};
        for (; i + 32 <= len; i += 32)
            for (int j = 0; j < 2; j++) {
                q8_max16(bm + i + 16 * j, 0xffff, 0, &mm[j]);
                q8_max16(bv + i + 16 * j, 0xffff, 0, &mv[j]);
            }
        for (; i < len; i += 16) {
            __mmask16 k = len - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (len - i)) - 1);
            q8_max16(bm + i, k, 1, &mm[0]);
            q8_max16(bv + i, k, 1, &mv[0]);
        }
        float inv_m, inv_v;
        am[b] = adam_q8_scale(_mm512_reduce_max_epu32(_mm512_max_epu32(mm[0], mm[1])), &inv_m);
        av[b] = adam_q8_scale(_mm512_reduce_max_epu32(_mm512_max_epu32(mv[0], mv[1])), &inv_v);
        __m512 im = _mm512_set1_ps(inv_m), iv = _mm512_set1_ps(inv_v);
        for (i = 0; i + 64 <= len; i += 64) q8_code64(t, i, 64, 0, bm, bv, im, iv, qm + i0, qv + i0);
        if (i < len) q8_code64(t, i, len - i, 1, bm, bv, im, iv, qm + i0, qv + i0);
    }
}
#endif
