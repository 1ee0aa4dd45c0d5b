/* Encoded optimizer state (cpu_adam.h, "optimizer state encodings"): the
 * kinds and their layouts, the q8 tables, zero state, conversion to and from
 * fp32, and the step with the choice of kernel and the split over threads. */
#include <assert.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adam_kernels.h" /* the kernels, adam_check_update, adam_chunk */
#include "cpu_adam.h"

/* ---- the q8 tables ------------------------------------------------------------------- */

static adam_q8_tables q8_tables;
static pthread_once_t q8_once = PTHREAD_ONCE_INIT;

/* The bucket entry of key (adam_q8.h) for the positive values of a map. */
static uint32_t q8_bucket(const float thr[255], uint32_t key)
{
    int c = zo_dynamic_map_nearest(thr, zo_bits_f32(key << 16)); /* thresholds below the bucket */
    uint32_t e = 0xffffff00u | (uint32_t)c;
    if (c < 255 && zo_f32_bits(thr[c]) >> 16 == key) {
        e = (zo_f32_bits(thr[c]) & 0xffffu) << 16 | (uint32_t)c;
        /* at most one threshold in a bucket */
        assert(c == 254 || zo_f32_bits(thr[c + 1]) >> 16 != key);
    }
    return e;
}

static void q8_build(void)
{
    adam_q8_tables *t = &q8_tables;
    zo_dynamic_map(t->map_m, 1);
    zo_dynamic_map(t->map_v, 0);
    zo_dynamic_map_thresholds(t->thr_m, t->map_m);
    zo_dynamic_map_thresholds(t->thr_v, t->map_v);
    /* nothing to tell apart below the first bucket */
    assert(t->thr_m[ADAM_Q8_ZERO_M] > zo_bits_f32(ADAM_Q8_KEY_LO << 16));
    assert(t->thr_v[ADAM_Q8_ZERO_V] > zo_bits_f32(ADAM_Q8_KEY_LO << 16));
    for (uint32_t k = ADAM_Q8_KEY_LO; k <= ADAM_Q8_KEY_HI; k++) {
        t->lut_m[k - ADAM_Q8_KEY_LO] = q8_bucket(t->thr_m, k);
        t->lut_v[k - ADAM_Q8_KEY_LO] = q8_bucket(t->thr_v, k);
    }
    for (int c = 0; c < 256; c++)
        for (int k = 0; k < 4; k++) {
            t->plane_m[k][c] = (uint8_t)(zo_f32_bits(t->map_m[c]) >> (8 * k));
            t->plane_v[k][c] = (uint8_t)(zo_f32_bits(t->map_v[c]) >> (8 * k));
        }
}

const adam_q8_tables *adam_q8_tables_get(void)
{
    pthread_once(&q8_once, q8_build);
    return &q8_tables;
}

/* ---- kinds and layouts ----------------------------------------------------------------- */

zo_status adam_state_check(const char *who, adam_state_kind kind)
{
    switch (kind.type) {
    case ADAM_STATE_F32:
    case ADAM_STATE_BF16:
        if (kind.block != 0)
            return zo_error(ZO_ERR_INVALID, "%s: block %u given for %s state (only q8 has blocks)",
                            who, kind.block, adam_state_name(kind));
        return ZO_OK;
    case ADAM_STATE_Q8:
        if (kind.block < 64 || kind.block > ADAM_Q8_BLOCK_MAX || kind.block % 64)
            return zo_error(ZO_ERR_INVALID,
                            "%s: q8 block %u is not a multiple of 64 from 64 to %d", who,
                            kind.block, ADAM_Q8_BLOCK_MAX);
        return ZO_OK;
    default: return zo_error(ZO_ERR_INVALID, "%s: unknown state type %d", who, (int)kind.type);
    }
}

const char *adam_state_name(adam_state_kind kind)
{
    switch (kind.type) {
    case ADAM_STATE_F32: return "fp32";
    case ADAM_STATE_BF16: return "bf16";
    case ADAM_STATE_Q8: return "q8";
    default: return "?";
    }
}

zo_status adam_state_parse(const char *s, adam_state_kind *out)
{
    if (!s || !out) return zo_error(ZO_ERR_INVALID, "adam_state_parse: NULL argument");
    if (!strcmp(s, "fp32")) *out = adam_state_f32();
    else if (!strcmp(s, "bf16")) *out = adam_state_bf16();
    else if (!strcmp(s, "q8")) *out = adam_state_q8(ADAM_Q8_BLOCK);
    else if (!strncmp(s, "q8/", 3)) {
        char *end;
        unsigned long b = strtoul(s + 3, &end, 10);
        if (end == s + 3 || *end || b > ADAM_Q8_BLOCK_MAX)
            return zo_error(ZO_ERR_INVALID, "optimizer state '%s': the block after q8/ is not a "
                            "number up to %d", s, ADAM_Q8_BLOCK_MAX);
        *out = adam_state_q8((uint32_t)b);
        if (adam_state_check("adam_state_parse", *out) != ZO_OK)
            return zo_error(ZO_ERR_INVALID,
                            "optimizer state '%s': the q8 block is a multiple of 64 from 64 to %d",
                            s, ADAM_Q8_BLOCK_MAX);
    } else {
        return zo_error(ZO_ERR_INVALID,
                        "optimizer state '%s' is not fp32, bf16, q8 or q8/<block>", s);
    }
    return ZO_OK;
}

zo_status adam_state_layout_of(adam_state_kind kind, uint64_t n, adam_state_layout *out)
{
    zo_status st = adam_state_check("adam_state_layout_of", kind);
    if (st != ZO_OK) return st;
    if (n > UINT64_MAX / 16)
        return zo_error(ZO_ERR_INVALID, "adam_state_layout_of: n = %llu too large",
                        (unsigned long long)n);
    uint64_t es = kind.type == ADAM_STATE_F32 ? 4 : kind.type == ADAM_STATE_BF16 ? 2 : 1;
    out->n = n;
    out->n_blocks = kind.type == ADAM_STATE_Q8 ? (n + kind.block - 1) / kind.block : 0;
    zo_adam_state_offsets o = zo_adam_state_offsets_of(es, n, out->n_blocks);
    out->off_m = o.m;
    out->off_v = o.v;
    out->off_absmax_m = o.absmax_m;
    out->off_absmax_v = o.absmax_v;
    out->bytes = o.bytes;
    return ZO_OK;
}

uint64_t adam_state_bytes(adam_state_kind kind, uint64_t n)
{
    adam_state_layout l;
    if (adam_state_layout_of(kind, n, &l) != ZO_OK) {
        zo_clear_error();
        return 0;
    }
    return l.bytes;
}

double adam_state_bytes_per_param(adam_state_kind kind)
{
    if (adam_state_check("adam_state_bytes_per_param", kind) != ZO_OK) {
        zo_clear_error();
        return 0.0;
    }
    switch (kind.type) {
    case ADAM_STATE_F32: return 8.0;
    case ADAM_STATE_BF16: return 4.0;
    default: return 2.0 + 8.0 / kind.block;
    }
}

/* ---- the parts of a buffer ------------------------------------------------------------------ */

/* Pointers to the parts of a state buffer. */
typedef struct state_parts {
    adam_state_layout l;
    char *m, *v;       /* fp32, bf16 or u8 [n] */
    float *am, *av;    /* q8: [n_blocks] */
    size_t es;         /* bytes of an element of m and v */
    size_t grain;      /* the unit threads split on: 64 elements, or a q8 block */
} state_parts;

static zo_status state_parts_of(const char *who, adam_state_kind kind, const void *state,
                                uint64_t n, state_parts *s)
{
    zo_status st = adam_state_check(who, kind);
    if (st != ZO_OK) return st;
    if ((st = adam_state_layout_of(kind, n, &s->l)) != ZO_OK) return st;
    if (n && !state) return zo_error(ZO_ERR_INVALID, "%s: state is NULL", who);
    if ((uintptr_t)state % ADAM_STATE_ALIGN)
        return zo_error(ZO_ERR_INVALID, "%s: state %p is not aligned to %d bytes", who, state,
                        ADAM_STATE_ALIGN);
    char *base = (char *)(uintptr_t)state;
    s->m = base + s->l.off_m;
    s->v = base + s->l.off_v;
    s->am = (float *)(void *)(base + s->l.off_absmax_m);
    s->av = (float *)(void *)(base + s->l.off_absmax_v);
    s->es = kind.type == ADAM_STATE_F32 ? 4 : kind.type == ADAM_STATE_BF16 ? 2 : 1;
    s->grain = kind.type == ADAM_STATE_Q8 ? kind.block : 64;
    return ZO_OK;
}

/* Elements [*lo, *hi) of thread t of nt over [first, first + n) (first
 * a multiple of the q8 block), and (q8) its first block. */
static void state_split(const state_parts *s, size_t first, size_t n, int t, int nt, size_t *lo,
                        size_t *hi, size_t *b0)
{
    size_t units = (n + s->grain - 1) / s->grain, ulo, uhi;
    adam_chunk(units, 1, t, nt, &ulo, &uhi);
    *lo = first + (ulo * s->grain < n ? ulo * s->grain : n);
    *hi = first + (uhi * s->grain < n ? uhi * s->grain : n);
    *b0 = *lo / s->grain;
}

/* A range [first, first + n) of the state of s->l.n parameters: inside it,
 * and (q8) of whole blocks, the last one maybe short at the end. */
static zo_status state_range_check(const char *who, const state_parts *s, adam_state_kind kind,
                                   uint64_t first, uint64_t n)
{
    if (first > s->l.n || n > s->l.n - first)
        return zo_error(ZO_ERR_INVALID, "%s: elements %llu..%llu outside the state of %llu", who,
                        (unsigned long long)first, (unsigned long long)(first + n),
                        (unsigned long long)s->l.n);
    if (kind.type == ADAM_STATE_Q8 && (first % kind.block || ((first + n) % kind.block && first + n != s->l.n)))
        return zo_error(ZO_ERR_INVALID, "%s: elements %llu..%llu are not whole blocks of %u (of %llu)", who,
                        (unsigned long long)first, (unsigned long long)(first + n), kind.block,
                        (unsigned long long)s->l.n);
    return ZO_OK;
}

/* Zero the bytes between the parts, so a buffer's bytes depend only on the
 * state (checksums of checkpoints). */
static void state_zero_gaps(const state_parts *s)
{
    const adam_state_layout *l = &s->l;
    uint64_t end_m = l->off_m + s->es * l->n, end_v = l->off_v + s->es * l->n;
    memset(s->m + s->es * l->n, 0, l->off_v - end_m);
    memset(s->v + s->es * l->n, 0, l->off_absmax_m - end_v);
    memset((char *)s->am + 4 * l->n_blocks, 0,
           l->off_absmax_v - (l->off_absmax_m + 4 * l->n_blocks));
}

/* ---- zero state, conversions --------------------------------------------------------------- */

/* The checks of a conversion of [first, first + n) of the state of total. */
static zo_status state_conversion(const char *who, adam_state_kind kind, const void *state,
                                  uint64_t total, uint64_t first, uint64_t n, const float *m, const float *v,
                                  state_parts *s)
{
    zo_status st = state_parts_of(who, kind, state, total, s);
    if (st != ZO_OK || (st = state_range_check(who, s, kind, first, n)) != ZO_OK) return st;
    if (n && (!m || !v)) return zo_error(ZO_ERR_INVALID, "%s: m or v is NULL", who);
    return ZO_OK;
}

zo_status adam_state_init(adam_state_kind kind, void *state, uint64_t n, int nthreads)
{
    state_parts s;
    zo_status st = state_parts_of("adam_state_init", kind, state, n, &s);
    if (st != ZO_OK) return st;
    if (n == 0) return ZO_OK;
    int mcode = kind.type == ADAM_STATE_Q8 ? ADAM_Q8_ZERO_M : 0;
    int nt = adam_plan_threads(n, nthreads);
    /* the same split as the step: each thread first touches its own pages */
#pragma omp parallel num_threads(nt)
    {
        size_t lo, hi, b0;
        state_split(&s, 0, n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi, &b0);
        memset(s.m + lo * s.es, mcode, (hi - lo) * s.es);
        memset(s.v + lo * s.es, 0, (hi - lo) * s.es);
        if (kind.type == ADAM_STATE_Q8) {
            size_t nb = (hi - lo + s.grain - 1) / s.grain;
            memset(s.am + b0, 0, 4 * nb);
            memset(s.av + b0, 0, 4 * nb);
        }
    }
    state_zero_gaps(&s);
    return ZO_OK;
}

/* The conversion kernels of impl (resolved), as the step picks its kernel:
 * AVX-512's q8 coder needs VBMI too, without it AVX2's runs. */
typedef struct state_codec {
    adam_q8_decode_kernel *q8_dec;
    adam_q8_encode_kernel *q8_enc;
    adam_bf16_decode_kernel *bf16_dec;
    adam_bf16_encode_kernel *bf16_enc;
} state_codec;

static state_codec pick_codec(adam_impl impl)
{
    adam_cpu cpu = adam_cpu_detect();
    state_codec avx2 = {adam_q8_decode_avx2, adam_q8_encode_avx2, adam_bf16_decode_avx2,
                        adam_bf16_encode_avx2};
    state_codec c = {adam_q8_decode_scalar, adam_q8_encode_blocks_scalar,
                     adam_bf16_decode_scalar, adam_bf16_encode_scalar};
    switch (impl) {
    case ADAM_IMPL_AVX2: return avx2;
    case ADAM_IMPL_AVX512:
    case ADAM_IMPL_AVX512_NO_BF16:
        c = avx2;
        if (cpu.avx512_vbmi) c.q8_dec = adam_q8_decode_avx512, c.q8_enc = adam_q8_encode_avx512;
        c.bf16_dec = adam_bf16_decode_avx512;
        c.bf16_enc = impl == ADAM_IMPL_AVX512 && cpu.avx512_bf16 ? adam_bf16_encode_avx512_bf16
                                                                  : adam_bf16_encode_avx512;
        return c;
    default: return c;
    }
}

/* The conversions over [first, first + n) of the state of `total`; m and v
 * point at element first. */
static zo_status state_to_f32(const char *who, adam_impl impl, adam_state_kind kind, const void *state,
                              uint64_t total, uint64_t first, uint64_t n, float *m, float *v, int nthreads)
{
    state_parts s;
    zo_status st = state_conversion(who, kind, state, total, first, n, m, v, &s);
    if (st != ZO_OK) return st;
    if ((st = adam_resolve_impl(who, impl, &impl)) != ZO_OK || n == 0) return st;
    const adam_q8_tables *t = kind.type == ADAM_STATE_Q8 ? adam_q8_tables_get() : NULL;
    state_codec c = pick_codec(impl);
    int nt = adam_plan_threads(n, nthreads);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        size_t lo, hi, b;
        state_split(&s, first, n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi, &b);
        float *mo = m + (lo - first), *vo = v + (lo - first);
        if (hi > lo) {
            switch (kind.type) {
            case ADAM_STATE_F32:
                memcpy(mo, s.m + 4 * lo, 4 * (hi - lo));
                memcpy(vo, s.v + 4 * lo, 4 * (hi - lo));
                break;
            case ADAM_STATE_BF16:
                c.bf16_dec(hi - lo, (const uint16_t *)(void *)s.m + lo,
                           (const uint16_t *)(void *)s.v + lo, mo, vo);
                break;
            default:
                c.q8_dec(t, s.grain, hi - lo, (const uint8_t *)s.m + lo,
                         (const uint8_t *)s.v + lo, s.am + b, s.av + b, mo, vo);
                break;
            }
        }
    }
    return ZO_OK;
}

zo_status adam_state_to_f32_impl(adam_impl impl, adam_state_kind kind, const void *state,
                                 uint64_t n, float *m, float *v, int nthreads)
{
    return state_to_f32("adam_state_to_f32", impl, kind, state, n, 0, n, m, v, nthreads);
}

zo_status adam_state_to_f32(adam_state_kind kind, const void *state, uint64_t n, float *m,
                            float *v, int nthreads)
{
    return adam_state_to_f32_impl(ADAM_IMPL_AUTO, kind, state, n, m, v, nthreads);
}

zo_status adam_state_to_f32_range(adam_state_kind kind, const void *state, uint64_t total, uint64_t first,
                                  uint64_t n, float *m, float *v, int nthreads)
{
    return state_to_f32("adam_state_to_f32_range", ADAM_IMPL_AUTO, kind, state, total, first, n, m, v,
                        nthreads);
}

static zo_status state_from_f32(const char *who, adam_impl impl, adam_state_kind kind, void *state,
                                uint64_t total, uint64_t first, uint64_t n, const float *m, const float *v,
                                int nthreads)
{
    state_parts s;
    zo_status st = state_conversion(who, kind, state, total, first, n, m, v, &s);
    if (st != ZO_OK) return st;
    if ((st = adam_resolve_impl(who, impl, &impl)) != ZO_OK || n == 0) return st;
    int nt = adam_plan_threads(n, nthreads), negative = 0;
    /* refused before anything is written; a loop the compiler vectorizes
     * (an index search in it made it a scalar pass costing as much as the
     * vector coding), the index looked for only when there is one */
#pragma omp parallel num_threads(nt) if (nt > 1) reduction(| : negative)
    {
        size_t lo, hi;
        adam_chunk(n, ADAM_GRAIN, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        int any = 0;
        for (size_t i = lo; i < hi; i++) any |= v[i] < 0.0f;
        negative |= any;
    }
    if (negative) {
        uint64_t bad = 0;
        while (!(v[bad] < 0.0f)) bad++;
        return zo_error(ZO_ERR_INVALID, "%s: v[%llu] = %g is negative (a second moment is not)",
                        who, (unsigned long long)(first + bad), (double)v[bad]);
    }
    const adam_q8_tables *t = kind.type == ADAM_STATE_Q8 ? adam_q8_tables_get() : NULL;
    state_codec c = pick_codec(impl);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        size_t lo, hi, b;
        state_split(&s, first, n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi, &b);
        const float *mi = m + (lo - first), *vi = v + (lo - first);
        if (hi > lo) {
            switch (kind.type) {
            case ADAM_STATE_F32:
                memcpy(s.m + 4 * lo, mi, 4 * (hi - lo));
                memcpy(s.v + 4 * lo, vi, 4 * (hi - lo));
                break;
            case ADAM_STATE_BF16:
                c.bf16_enc(hi - lo, mi, vi, (uint16_t *)(void *)s.m + lo,
                           (uint16_t *)(void *)s.v + lo);
                break;
            default:
                c.q8_enc(t, s.grain, hi - lo, mi, vi, (uint8_t *)s.m + lo,
                         (uint8_t *)s.v + lo, s.am + b, s.av + b);
                break;
            }
        }
    }
    state_zero_gaps(&s);
    return ZO_OK;
}

zo_status adam_state_from_f32_impl(adam_impl impl, adam_state_kind kind, void *state, uint64_t n,
                                   const float *m, const float *v, int nthreads)
{
    return state_from_f32("adam_state_from_f32", impl, kind, state, n, 0, n, m, v, nthreads);
}

zo_status adam_state_from_f32(adam_state_kind kind, void *state, uint64_t n, const float *m,
                              const float *v, int nthreads)
{
    return adam_state_from_f32_impl(ADAM_IMPL_AUTO, kind, state, n, m, v, nthreads);
}

zo_status adam_state_from_f32_range(adam_state_kind kind, void *state, uint64_t total, uint64_t first,
                                    uint64_t n, const float *m, const float *v, int nthreads)
{
    return state_from_f32("adam_state_from_f32_range", ADAM_IMPL_AUTO, kind, state, total, first, n, m, v,
                          nthreads);
}

/* ---- the step ---------------------------------------------------------------------------- */

static adam_bf16s_kernel *pick_bf16s(adam_impl impl)
{
    switch (impl) {
    case ADAM_IMPL_AVX2: return adam_update_bf16s_avx2;
    case ADAM_IMPL_AVX512:
        return adam_avx512_has_bf16() ? adam_update_bf16s_avx512_bf16 : adam_update_bf16s_avx512;
    case ADAM_IMPL_AVX512_NO_BF16: return adam_update_bf16s_avx512;
    default: return adam_update_bf16s_scalar;
    }
}

/* The AVX-512 q8 kernel needs AVX512-VBMI too; without it (Skylake-X,
 * Cascade Lake) the AVX2 one runs. */
static adam_q8_kernel *pick_q8(adam_impl impl)
{
    adam_cpu cpu = adam_cpu_detect();
    switch (impl) {
    case ADAM_IMPL_AVX2: return adam_update_q8_avx2;
    case ADAM_IMPL_AVX512:
        if (!cpu.avx512_vbmi) return adam_update_q8_avx2;
        return cpu.avx512_bf16 ? adam_update_q8_avx512_bf16 : adam_update_q8_avx512;
    case ADAM_IMPL_AVX512_NO_BF16:
        return cpu.avx512_vbmi ? adam_update_q8_avx512 : adam_update_q8_avx2;
    default: return adam_update_q8_scalar;
    }
}

/* The step over [first, first + n) of the state of `total`; param, grad
 * and out16 point at element first. */
static zo_status state_update(const char *who, adam_impl impl, const adam_hparams *hp, adam_state_kind kind,
                              size_t total, size_t first, size_t n, float *param, const void *grad,
                              zo_dtype grad_dtype, void *state, void *out16, zo_dtype out_dtype, int nthreads)
{
    state_parts s;
    zo_status st = state_parts_of(who, kind, state, total, &s);
    if (st != ZO_OK || (st = state_range_check(who, &s, kind, first, n)) != ZO_OK) return st;
    if (kind.type == ADAM_STATE_F32)
        return adam_update_impl(impl, hp, n, param, grad, grad_dtype, (float *)(void *)s.m + first,
                                (float *)(void *)s.v + first, out16, out_dtype, nthreads);
    if ((st = adam_resolve_impl(who, impl, &impl)) != ZO_OK) return st;
    size_t gs = zo_dtype_size(grad_dtype), os = out16 ? zo_dtype_size(out_dtype) : 0;
    adam_array arr[4] = {
        {"param", param, 4 * n, 4},
        {"state", state, s.l.bytes, ADAM_STATE_ALIGN},
        {"grad", grad, gs * n, gs ? gs : 1},
        {"out16", out16, os * n, os ? os : 1},
    };
    if ((st = adam_check_update(who, hp, grad_dtype, out16 != NULL, out_dtype, arr, 4,
                                1u << 3)) != ZO_OK)
        return st;
    if (n == 0) return ZO_OK;

    adam_consts c = zo_adam_consts_make(hp);
    adam_bf16s_kernel *bf16s = kind.type == ADAM_STATE_BF16 ? pick_bf16s(impl) : NULL;
    adam_q8_kernel *q8 = kind.type == ADAM_STATE_Q8 ? pick_q8(impl) : NULL;
    const adam_q8_tables *t = q8 ? adam_q8_tables_get() : NULL;
    int nt = adam_plan_threads(n, nthreads);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        size_t lo, hi, b0;
        state_split(&s, first, n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi, &b0);
        float *p = param + (lo - first);
        const void *g = (const char *)grad + (lo - first) * gs;
        void *o = out16 ? (char *)out16 + (lo - first) * os : NULL;
        if (hi > lo && bf16s)
            bf16s(&c, hi - lo, p, g, grad_dtype, (uint16_t *)(void *)s.m + lo,
                  (uint16_t *)(void *)s.v + lo, o, out_dtype);
        else if (hi > lo)
            q8(&c, t, s.grain, hi - lo, p, g, grad_dtype, (uint8_t *)s.m + lo,
               (uint8_t *)s.v + lo, s.am + b0, s.av + b0, o, out_dtype);
    }
    return ZO_OK;
}

zo_status adam_state_update_impl(adam_impl impl, const adam_hparams *hp, adam_state_kind kind,
                                 size_t n, float *param, const void *grad, zo_dtype grad_dtype,
                                 void *state, void *out16, zo_dtype out_dtype, int nthreads)
{
    return state_update("adam_state_update", impl, hp, kind, n, 0, n, param, grad, grad_dtype, state, out16,
                        out_dtype, nthreads);
}

zo_status adam_state_update(const adam_hparams *hp, adam_state_kind kind, size_t n,
                            float *param, const void *grad, zo_dtype grad_dtype, void *state,
                            void *out16, zo_dtype out_dtype, int nthreads)
{
    return adam_state_update_impl(ADAM_IMPL_AUTO, hp, kind, n, param, grad, grad_dtype, state,
                                  out16, out_dtype, nthreads);
}

zo_status adam_state_update_range(const adam_hparams *hp, adam_state_kind kind, size_t total, size_t first,
                                  size_t n, float *param, const void *grad, zo_dtype grad_dtype, void *state,
                                  void *out16, zo_dtype out_dtype, int nthreads)
{
    return state_update("adam_state_update_range", ADAM_IMPL_AUTO, hp, kind, total, first, n, param, grad,
                        grad_dtype, state, out16, out_dtype, nthreads);
}
