/* AVX2 + F16C (+ FMA, only in the sum of squares) kernels, 8 lanes. Built for that ISA whatever the compiler's
 * default; called only when cpuid says the CPU has it. The head (to align the
 * fp32 arrays on 32 bytes) and the tail run the scalar sequence, which gives
 * the same bits. */
#pragma GCC target("avx2,f16c,fma")

#include <immintrin.h>
#include <stdint.h>

#include "adam_kernels.h" /* adam_consts, adam_update_scalar_range */
#include "common/bf16_avx2.h" /* defines: zo_avx2_bf16_to_f32, zo_avx2_f32_to_bf16 */

#define ADAM_INLINE static inline __attribute__((always_inline))

typedef struct avx2_k {
    __m256 gm, b1, omb1, b2, omb2, eps, l2, lr_wd, step, ibc2;
} avx2_k;

/* 8 gradients from element i of g, as fp32. */
ADAM_INLINE __m256 avx2_load_grad(const void *g, size_t i, const zo_dtype gd)
{
    if (gd == ZO_DTYPE_F32) return _mm256_loadu_ps((const float *)g + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
    if (gd == ZO_DTYPE_F16) return _mm256_cvtph_ps(h); /* exact */
    return zo_avx2_bf16_to_f32(h); /* bf16 */
}

/* 8 fp32 -> 8 bf16, round to nearest even as zo_f32_to_bf16 (nan: sign
 * kept, made quiet). */
ADAM_INLINE __m128i avx2_to_bf16(__m256 x) { return zo_avx2_f32_to_bf16(x); }

/* The update of 8 lanes: adam_step_elem's operations in its order. */
ADAM_INLINE void avx2_adam(const avx2_k *K, __m256 *pp, __m256 *mm, __m256 *vv, __m256 gg, const int l2)
{
    ADAM_VECTOR_STEP(_mm256, K, *pp, *mm, *vv, gg, l2);
}

/* Store 8 lanes of the 16-bit copy at element i of out (nt: non-temporal,
 * 16-byte aligned). */
ADAM_INLINE void avx2_store16(void *restrict out, size_t i, __m256 pp, const int od, const int nt)
{
    __m128i h = od == OUT_F16 ? _mm256_cvtps_ph(pp, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                              : avx2_to_bf16(pp);
    if (nt) _mm_stream_si128((__m128i *)((uint16_t *)out + i), h);
    else _mm_storeu_si128((__m128i *)((uint16_t *)out + i), h);
}

/* How m and v are stored: fp32 (adam_update) or bf16 (ADAM_STATE_BF16). */
enum { ST_F32 = 0, ST_BF16 };

/* Elements [i, i + 8): the sequence of adam_step_elem, lane by lane, with m
 * and v stored as sm. nt: write the 16-bit copy with a non-temporal store. */
ADAM_INLINE void avx2_span(const avx2_k *K, size_t i, float *restrict p, const void *restrict g,
                           const zo_dtype gd, void *restrict m, void *restrict v, const int sm,
                           void *restrict out, const int od, const int l2, const int nt)
{
    __m256 pp = _mm256_loadu_ps(p + i);
    __m256 mm = sm == ST_F32 ? _mm256_loadu_ps((float *)m + i) : avx2_load_grad(m, i, ZO_DTYPE_BF16);
    __m256 vv = sm == ST_F32 ? _mm256_loadu_ps((float *)v + i) : avx2_load_grad(v, i, ZO_DTYPE_BF16);
    avx2_adam(K, &pp, &mm, &vv, avx2_load_grad(g, i, gd), l2);
    _mm256_storeu_ps(p + i, pp);
    if (sm == ST_F32) {
        _mm256_storeu_ps((float *)m + i, mm);
        _mm256_storeu_ps((float *)v + i, vv);
    } else {
        _mm_storeu_si128((__m128i *)((uint16_t *)m + i), avx2_to_bf16(mm));
        _mm_storeu_si128((__m128i *)((uint16_t *)v + i), avx2_to_bf16(vv));
    }
    if (od != OUT_NONE) avx2_store16(out, i, pp, od, nt);
}

/* Elements [i0, n) with the scalar sequence (head and tail). */
ADAM_INLINE void avx2_scalar_range(const adam_consts *c, size_t i0, size_t n, float *restrict p,
                                   const void *restrict g, zo_dtype gd, void *restrict m,
                                   void *restrict v, const int sm, void *restrict out, zo_dtype od)
{
    if (sm == ST_F32) adam_update_scalar_range(c, i0, n, p, g, gd, m, v, out, od);
    else adam_update_bf16s_range(c, i0, n, p, g, gd, m, v, out, od);
}

ADAM_INLINE void avx2_update_t(const adam_consts *c, size_t n, float *restrict p,
                               const void *restrict g, const zo_dtype gd, void *restrict m,
                               void *restrict v, const int sm, void *restrict out, const int od,
                               const int l2)
{
    avx2_k K = ADAM_BROADCAST(_mm256_set1_ps, c);
    zo_dtype odt = od == OUT_BF16 ? ZO_DTYPE_BF16 : ZO_DTYPE_F16;
    void *o = od == OUT_NONE ? NULL : out;
    size_t head = ((32 - ((uintptr_t)p & 31)) & 31) / 4;
    if (head > n) head = n;
    avx2_scalar_range(c, 0, head, p, g, gd, m, v, sm, o, odt);
    size_t i = head;
    /* stream the copy past the cache when its vectors are aligned (see
     * adam_avx512_body.h) */
    if (od != OUT_NONE && ((uintptr_t)((uint16_t *)out + head) & 15) == 0) {
        for (; i + 8 <= n; i += 8) avx2_span(&K, i, p, g, gd, m, v, sm, out, od, l2, 1);
        _mm_sfence();
    } else {
        for (; i + 8 <= n; i += 8) avx2_span(&K, i, p, g, gd, m, v, sm, out, od, l2, 0);
    }
    avx2_scalar_range(c, i, n, p, g, gd, m, v, sm, o, odt);
}

void adam_update_avx2(const adam_consts *c, size_t n, float *restrict p, const void *restrict g,
                      zo_dtype gd, float *restrict m, float *restrict v, void *restrict out,
                      zo_dtype od)
{
#define CALL(GD, OD, L2) avx2_update_t(c, n, p, g, GD, m, v, ST_F32, out, OD, L2)
    ADAM_DISPATCH(gd, out, od, c->use_l2, CALL)
#undef CALL
}

void adam_update_bf16s_avx2(const adam_consts *c, size_t n, float *restrict p,
                            const void *restrict g, zo_dtype gd, uint16_t *restrict m,
                            uint16_t *restrict v, void *restrict out, zo_dtype od)
{
#define CALL(GD, OD, L2) avx2_update_t(c, n, p, g, GD, m, v, ST_BF16, out, OD, L2)
    ADAM_DISPATCH(gd, out, od, c->use_l2, CALL)
#undef CALL
}

/* ---- the 8-bit block-wise step (ADAM_STATE_Q8) -------------------------------------------
 * Two passes per block as in adam_avx512_q8.h, with gathers for both the
 * dequantization (map[code]) and the bucket table; the elements past the
 * last multiple of 8 of a block run the scalar sequence (the same bits). */

/* The codes of 8 scaled values, as adam_avx512_q8.h's q8_code16 (the
 * unsigned comparison by flipping the sign bits), mirrored for negative
 * values of the signed map; in the low byte of each lane. */
ADAM_INLINE __m256i avx2_q8_code8(const uint32_t *lut, __m256 s, __m256 inv, const int is_signed)
{
    __m256 x = _mm256_mul_ps(s, inv);
    __m256i neg = _mm256_setzero_si256();
    if (is_signed) {
        neg = _mm256_srai_epi32(_mm256_castps_si256(x), 31);
        x = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
    }
    __m256 a = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(0x1p-23f)), _mm256_set1_ps(1.0f));
    __m256i u = _mm256_castps_si256(a);
    __m256i key = _mm256_sub_epi32(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(ADAM_Q8_KEY_LO));
    __m256i e = _mm256_i32gather_epi32((const int *)lut, key, 4);
    __m256i low = _mm256_slli_epi32(u, 16);
    if (is_signed) low = _mm256_or_si256(low, _mm256_and_si256(neg, _mm256_set1_epi32(0xff)));
    const __m256i flip = _mm256_set1_epi32((int)0x80000000u);
    __m256i up = _mm256_cmpgt_epi32(_mm256_xor_si256(low, flip), _mm256_xor_si256(e, flip));
    __m256i code = _mm256_and_si256(_mm256_sub_epi32(e, up), _mm256_set1_epi32(0xff));
    if (is_signed) {
        __m256i mirror = _mm256_max_epi32(_mm256_sub_epi32(_mm256_set1_epi32(254), code),
                                          _mm256_setzero_si256());
        code = _mm256_blendv_epi8(code, mirror, neg);
    }
    return code;
}

/* Store the low bytes of 8 lanes at q. */
ADAM_INLINE void avx2_q8_store8(uint8_t *q, __m256i code)
{
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1);
    __m256i b = _mm256_shuffle_epi8(code, pick);
    __m128i x = _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    _mm_storel_epi64((__m128i *)q, x);
}

/* The largest of 8 unsigned lanes. */
ADAM_INLINE uint32_t avx2_max_lane(__m256i x)
{
    uint32_t lanes[8], mx = 0;
    _mm256_storeu_si256((__m256i *)lanes, x);
    for (int j = 0; j < 8; j++)
        if (lanes[j] > mx) mx = lanes[j];
    return mx;
}

/* The second half of a block (the step's and adam_state_from_f32's): its
 * absmax values from the largest magnitudes, then the codes of its n
 * moments, 8 lanes at a time and the rest one by one. */
ADAM_INLINE void avx2_q8_code_block(const adam_q8_tables *t, size_t n, const float *sm, const float *sv,
                                    uint32_t mx_m, uint32_t mx_v, uint8_t *qm, uint8_t *qv, float *am, float *av)
{
    float inv_m, inv_v;
    *am = adam_q8_scale(mx_m, &inv_m);
    *av = adam_q8_scale(mx_v, &inv_v);
    const __m256 im = _mm256_set1_ps(inv_m), iv = _mm256_set1_ps(inv_v);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        avx2_q8_store8(qm + i, avx2_q8_code8(t->lut_m, _mm256_loadu_ps(sm + i), im, 1));
        avx2_q8_store8(qv + i, avx2_q8_code8(t->lut_v, _mm256_loadu_ps(sv + i), iv, 0));
    }
    for (; i < n; i++) {
        qm[i] = adam_q8_code(t->thr_m, sm[i] * inv_m);
        qv[i] = adam_q8_code(t->thr_v, sv[i] * inv_v);
    }
}

/* One block of n <= ADAM_Q8_BLOCK_MAX elements. */
ADAM_INLINE void avx2_q8_block(const adam_consts *c, const avx2_k *K, const adam_q8_tables *t,
                               size_t n, float *restrict p, const void *restrict g,
                               const zo_dtype gd, uint8_t *restrict qm, uint8_t *restrict qv,
                               float *restrict am, float *restrict av, void *restrict out,
                               const int od, const int l2, float *restrict sm,
                               float *restrict sv)
{
    const __m256 am0 = _mm256_set1_ps(*am), av0 = _mm256_set1_ps(*av);
    const __m256i mag = _mm256_set1_epi32(0x7fffffff);
    __m256i max_m = _mm256_setzero_si256(), max_v = max_m;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i cm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qm + i)));
        __m256i cv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qv + i)));
        __m256 mm = _mm256_mul_ps(_mm256_i32gather_ps(t->map_m, cm, 4), am0);
        __m256 vv = _mm256_mul_ps(_mm256_i32gather_ps(t->map_v, cv, 4), av0);
        __m256 pp = _mm256_loadu_ps(p + i);
        avx2_adam(K, &pp, &mm, &vv, avx2_load_grad(g, i, gd), l2);
        _mm256_storeu_ps(p + i, pp);
        if (od != OUT_NONE) avx2_store16(out, i, pp, od, 0);
        _mm256_store_ps(sm + i, mm);
        _mm256_store_ps(sv + i, vv);
        max_m = _mm256_max_epu32(max_m, _mm256_and_si256(_mm256_castps_si256(mm), mag));
        max_v = _mm256_max_epu32(max_v, _mm256_and_si256(_mm256_castps_si256(vv), mag));
    }
    uint32_t mx_m = avx2_max_lane(max_m), mx_v = avx2_max_lane(max_v);
    zo_dtype odt = od == OUT_BF16 ? ZO_DTYPE_BF16 : ZO_DTYPE_F16;
    for (size_t k = i; k < n; k++) {
        sm[k] = t->map_m[qm[k]] * *am;
        sv[k] = t->map_v[qv[k]] * *av;
        p[k] = adam_step_elem(c, p[k], zo_load_f32(g, gd, k), &sm[k], &sv[k]);
        if (od != OUT_NONE) zo_store_f32(out, odt, k, p[k]);
        if (adam_q8_mag(sm[k]) > mx_m) mx_m = adam_q8_mag(sm[k]);
        if (adam_q8_mag(sv[k]) > mx_v) mx_v = adam_q8_mag(sv[k]);
    }
    avx2_q8_code_block(t, n, sm, sv, mx_m, mx_v, qm, qv, am, av);
}

ADAM_INLINE void avx2_q8_update_t(const adam_consts *c, const adam_q8_tables *t, size_t block,
                                  size_t n, float *restrict p, const void *restrict g,
                                  const zo_dtype gd, uint8_t *restrict qm, uint8_t *restrict qv,
                                  float *restrict am, float *restrict av, void *restrict out,
                                  const int od, const int l2)
{
    float sm[ADAM_Q8_BLOCK_MAX] __attribute__((aligned(32)));
    float sv[ADAM_Q8_BLOCK_MAX] __attribute__((aligned(32)));
    avx2_k K = ADAM_BROADCAST(_mm256_set1_ps, c);
    size_t gs = zo_dtype_size(gd), os = od == OUT_NONE ? 0 : 2;
    for (size_t i = 0, b = 0; i < n; i += block, b++) {
        size_t len = n - i < block ? n - i : block;
        avx2_q8_block(c, &K, t, len, p + i, (const char *)g + i * gs, gd, qm + i, qv + i, am + b,
                      av + b, od == OUT_NONE ? NULL : (char *)out + i * os, od, l2, sm, sv);
    }
}

void adam_update_q8_avx2(const adam_consts *c, const adam_q8_tables *t, size_t block, size_t n,
                         float *restrict p, const void *restrict g, zo_dtype gd,
                         uint8_t *restrict qm, uint8_t *restrict qv, float *restrict am,
                         float *restrict av, void *restrict out, zo_dtype od)
{
#define CALL(GD, OD, L2) avx2_q8_update_t(c, t, block, n, p, g, GD, qm, qv, am, av, out, OD, L2)
    ADAM_DISPATCH(gd, out, od, c->use_l2, CALL)
#undef CALL
}

/* ---- adam_state_to_f32 and adam_state_from_f32 (bf16 and q8 state) ----------------------
 * 8 lanes at a time with the step's conversions and coder; the elements past
 * the last multiple of 8 (of a block) take the scalar sequence. */

void adam_bf16_decode_avx2(size_t n, const uint16_t *restrict qm, const uint16_t *restrict qv,
                           float *restrict m, float *restrict v)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(m + i, avx2_load_grad(qm, i, ZO_DTYPE_BF16));
        _mm256_storeu_ps(v + i, avx2_load_grad(qv, i, ZO_DTYPE_BF16));
    }
    for (; i < n; i++) {
        m[i] = zo_bf16_to_f32(qm[i]);
        v[i] = zo_bf16_to_f32(qv[i]);
    }
}

void adam_bf16_encode_avx2(size_t n, const float *restrict m, const float *restrict v,
                           uint16_t *restrict qm, uint16_t *restrict qv)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128((__m128i *)(qm + i), avx2_to_bf16(_mm256_loadu_ps(m + i)));
        _mm_storeu_si128((__m128i *)(qv + i), avx2_to_bf16(_mm256_loadu_ps(v + i)));
    }
    for (; i < n; i++) {
        qm[i] = zo_f32_to_bf16(m[i]);
        qv[i] = zo_f32_to_bf16(v[i]);
    }
}

void adam_q8_decode_avx2(const adam_q8_tables *t, size_t block, size_t n,
                         const uint8_t *restrict qm, const uint8_t *restrict qv,
                         const float *restrict am, const float *restrict av, float *restrict m,
                         float *restrict v)
{
    for (size_t i0 = 0, b = 0; i0 < n; i0 += block, b++) {
        size_t len = n - i0 < block ? n - i0 : block, i = i0;
        const __m256 a = _mm256_set1_ps(am[b]), c = _mm256_set1_ps(av[b]);
        for (; i + 8 <= i0 + len; i += 8) {
            __m256i cm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qm + i)));
            __m256i cv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qv + i)));
            _mm256_storeu_ps(m + i, _mm256_mul_ps(_mm256_i32gather_ps(t->map_m, cm, 4), a));
            _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_i32gather_ps(t->map_v, cv, 4), c));
        }
        for (; i < i0 + len; i++) {
            m[i] = t->map_m[qm[i]] * am[b];
            v[i] = t->map_v[qv[i]] * av[b];
        }
    }
}

void adam_q8_encode_avx2(const adam_q8_tables *t, size_t block, size_t n,
                         const float *restrict m, const float *restrict v, uint8_t *restrict qm,
                         uint8_t *restrict qv, float *restrict am, float *restrict av)
{
    const __m256i mag = _mm256_set1_epi32(0x7fffffff);
    for (size_t i0 = 0, b = 0; i0 < n; i0 += block, b++) {
        size_t len = n - i0 < block ? n - i0 : block, i = 0;
        const float *bm = m + i0, *bv = v + i0;
        uint8_t *cm = qm + i0, *cv = qv + i0;
        /* the largest magnitudes (v's too: a v of -0 is allowed here) */
        __m256i max_m = _mm256_setzero_si256(), max_v = max_m;
        for (; i + 8 <= len; i += 8) {
            max_m = _mm256_max_epu32(max_m, _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(bm + i)), mag));
            max_v = _mm256_max_epu32(max_v, _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(bv + i)), mag));
        }
        uint32_t mx_m = avx2_max_lane(max_m), mx_v = avx2_max_lane(max_v);
        for (size_t k = i; k < len; k++) {
            if (adam_q8_mag(bm[k]) > mx_m) mx_m = adam_q8_mag(bm[k]);
            if (adam_q8_mag(bv[k]) > mx_v) mx_v = adam_q8_mag(bv[k]);
        }
        avx2_q8_code_block(t, len, bm, bv, mx_m, mx_v, cm, cv, am + b, av + b);
    }
}

/* Squares of 8 fp32 lanes widened to double, added into two accumulators
 * (exact squares: 48 significant bits of double's 53; the FMA rounds only
 * the addition). */
ADAM_INLINE void avx2_sq_acc(__m256 x, __m256d *a, __m256d *b)
{
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    *a = _mm256_fmadd_pd(lo, lo, *a);
    *b = _mm256_fmadd_pd(hi, hi, *b);
}

/* As avx512_sumsq_t: in double, element i into lane i % 32 of eight
 * accumulators of 4 doubles, added by a fixed tree; the tail element by
 * element after them; in pieces, the accumulators carried in acc. */
ADAM_INLINE double avx2_sumsq_t(adam_sumsq_acc *acc, const void *g, const zo_dtype gd, size_t n, int last)
{
    __m256d a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_loadu_pd(acc->lane + 4 * k);
    size_t i = 0;
    const size_t gs = gd == ZO_DTYPE_F32 ? 4 : 2; /* bytes an element; 32 elements: gs / 2 lines */
    for (; i + 32 <= n; i += 32) {
        const char *ahead = (const char *)g + i * gs + ADAM_SUMSQ_PREFETCH;
        for (size_t l = 0; l < gs; l += 2) _mm_prefetch(ahead + 32 * l, _MM_HINT_T0);
        avx2_sq_acc(avx2_load_grad(g, i, gd), &a[0], &a[1]);
        avx2_sq_acc(avx2_load_grad(g, i + 8, gd), &a[2], &a[3]);
        avx2_sq_acc(avx2_load_grad(g, i + 16, gd), &a[4], &a[5]);
        avx2_sq_acc(avx2_load_grad(g, i + 24, gd), &a[6], &a[7]);
    }
    if (!last) { /* (n a multiple of 64: no tail) */
        for (int k = 0; k < 8; k++) _mm256_storeu_pd(acc->lane + 4 * k, a[k]);
        return 0.0;
    }
    __m256d s = _mm256_add_pd(_mm256_add_pd(_mm256_add_pd(a[0], a[1]), _mm256_add_pd(a[2], a[3])),
                              _mm256_add_pd(_mm256_add_pd(a[4], a[5]), _mm256_add_pd(a[6], a[7])));
    double lanes[4];
    _mm256_storeu_pd(lanes, s);
    double t = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i++) {
        double x = zo_load_f32(g, gd, i);
        t += x * x;
    }
    return t;
}

double adam_sumsq_part_avx2(adam_sumsq_acc *acc, const void *g, zo_dtype gd, size_t n, int last)
{
    switch (gd) {
    case ZO_DTYPE_F16: return avx2_sumsq_t(acc, g, ZO_DTYPE_F16, n, last);
    case ZO_DTYPE_BF16: return avx2_sumsq_t(acc, g, ZO_DTYPE_BF16, n, last);
    default: return avx2_sumsq_t(acc, g, ZO_DTYPE_F32, n, last);
    }
}

double adam_sumsq_avx2(const void *g, zo_dtype gd, size_t n)
{
    adam_sumsq_acc acc = {{0}};
    return adam_sumsq_part_avx2(&acc, g, gd, n, 1);
}
