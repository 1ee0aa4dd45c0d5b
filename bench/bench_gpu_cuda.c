/* bench_gpu_cuda: the CUDA backend on the shapes of a 13B (LLaMA-2 13B)
 * layer.
 *
 * - GEMM: gpu_gemm (cuBLASLt's first heuristic, asked once per problem;
 *   descriptors built per call) against cuBLAS's own best: the fastest of cuBLASLt's top heuristic
 *   algorithms for the same problem, timed here with prebuilt descriptors.
 *   Forward (x W^T), input gradient (dy W) and weight gradient (dy^T x) of
 *   every Linear of the layer, bf16 in, fp32 accumulation. Ours and each
 *   cuBLASLt algorithm alternate, round after round (ROUNDS), the best time
 *   of each counting: both see the same clocks and the same neighbours.
 * - copies: host->device and device->host GB/s, pinned and pageable.
 * - attention forward and backward time, bf16, causal: the flash kernel
 *   (CUDA cores, fp32) and the GEMM path (tensor cores, batched cuBLASLt
 *   GEMMs), the fused tensor-core kernels and the mma.sync kernels, each
 *   forced through ZO_ATTENTION and alternating round after round as the
 *   GEMMs do, and each one's speedup over the flash kernel; started with
 *   ZO_ATTENTION=tune, the backend's tuned choice too (row causal_tune).
 *   On the 13B layer's heads at t 2048 and 4096, and on other models'
 *   attention (attn_shapes): GPT-2's heads of 64, a sliding window
 *   (Mistral-7B's heads), a soft cap (Gemma-2-27B's) and Gemma-2-9B's
 *   heads of 256 (window and cap).
 * - the MoE router, forward (weights, order, load-balancing statistics)
 *   and backward, at 4096 tokens of Mixtral's, Qwen3-MoE's, DeepSeek-V3's
 *   (groups, sigmoid scores, a bias) and Qwen3-Next's gates, each against
 *   a device copy of its logits' bytes in the same rounds.
 * Every input is random (uniform in [-1, 1], a fixed seed), as training's
 * are: constant data toggles few bits in the multipliers and on the buses,
 * draws less power and lets the GPU hold clocks that real data would not,
 * so it flatters both sides of every ratio and every absolute figure.
 * The last line is the geometric mean over the GEMMs of gpu_gemm's TFLOP/s
 * over the best cuBLASLt algorithm's (1.0 = as fast as cuBLAS can be).
 * Exits 77 with a message where no CUDA device is present. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>         /* defines: cublasLtMatmul, heuristics */
#include <cuda_runtime_api.h> /* defines: cudaStreamCreate, cudaGetDeviceProperties */

#include "bench/bench.h"          /* defines: bench_header, bench_time_best, bench_row */
#include "common/attn_path.h"     /* defines: zo_attn_tc_covers */
#include "common/dtype.h"         /* defines: zo_f32_to_bf16 */
#include "gpu/device.h"           /* defines: gpu_device_open, gpu_gemm, gpu_attention_forward, ... */

#define MAX_ALGOS 8
#define LT_WS (32u << 20) /* cuBLASLt workspace, as the backend's per stream */
#define ROUNDS 3          /* ours and cuBLASLt's algorithms alternate this many times */
#define STAGE (64u << 20) /* pinned staging for the random fills */

/* started with ZO_ATTENTION=tune: the attention rows add the tuned choice's */
static int attn_tune;

static gpu_device_t dev;
static gpu_stream_t S;

static int fail(const char *what)
{
    fprintf(stderr, "bench_gpu_cuda: %s: %s\n", what, zo_last_error());
    return 1;
}

/* ---- random data -------------------------------------------------------------------- */

/* xorshift64*: the next 64 random bits of *s (never seeded with 0) */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* n bf16 values uniform in [-1, 1] into device memory dst, through pinned
 * staging (stage, STAGE bytes). */
static zo_status fill_random_bf16(void *dst, size_t n, void *stage, uint64_t seed)
{
    uint64_t s = seed | 1;
    uint16_t *h = stage;
    const size_t per = STAGE / sizeof *h;
    for (size_t done = 0; done < n; done += per) {
        size_t k = n - done < per ? n - done : per;
        for (size_t i = 0; i < k; i++) /* the top 24 bits: exact in fp32, then rounded once */
            h[i] = zo_f32_to_bf16((float)(rng_next(&s) >> 40) * 0x1p-23f - 1.0f);
        zo_status st = gpu_memcpy_async(S, (uint16_t *)dst + done, h, k * sizeof *h,
                                        GPU_COPY_HOST_TO_DEVICE);
        if (st == ZO_OK) st = gpu_stream_synchronize(S); /* the staging is reused */
        if (st != ZO_OK) return st;
    }
    return ZO_OK;
}

/* bytes of random bits into host memory p */
static void fill_random_bytes(void *p, size_t bytes, uint64_t seed)
{
    uint64_t s = seed | 1, v;
    unsigned char *c = p;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        v = rng_next(&s);
        memcpy(c + i, &v, 8);
    }
    for (v = rng_next(&s); i < bytes; i++, v >>= 8) c[i] = (unsigned char)v;
}

/* ---- GEMM ------------------------------------------------------------------------ */

typedef struct gemm_run {
    gpu_gemm_desc d;
} gemm_run;

static void run_gpu_gemm(void *arg)
{
    gemm_run *r = arg;
    (void)gpu_gemm(S, &r->d);
    (void)gpu_stream_synchronize(S);
}

/* cuBLASLt with prebuilt descriptors and one chosen algorithm. */
typedef struct lt_run {
    cublasLtHandle_t lt;
    cudaStream_t st;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    const void *a, *b;
    void *c;
    float alpha, beta;
    void *ws;
    size_t ws_bytes;
} lt_run;

static void run_lt(void *arg)
{
    lt_run *r = arg;
    (void)cublasLtMatmul(r->lt, r->desc, &r->alpha, r->a, r->la, r->b, r->lb, &r->beta, r->c,
                         r->lc, r->c, r->lc, &r->algo, r->ws, r->ws_bytes, r->st);
    (void)cudaStreamSynchronize(r->st);
}

/* cuBLASLt's top algorithms for the row-major problem d (same column-major
 * mapping as gpu/cuda/gemm.cu), ready to time one by one with prebuilt
 * descriptors (lt_close undoes it). */
typedef struct lt_set {
    lt_run r;
    cublasLtMatmulHeuristicResult_t h[MAX_ALGOS];
    int found;
} lt_set;

static void lt_open(lt_set *L, const gpu_gemm_desc *d, void *ws, size_t ws_bytes)
{
    lt_run r = {0};
    cublasLtCreate(&r.lt);
    cudaStreamCreate(&r.st);
    cublasOperation_t ob = d->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t oa = d->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescCreate(&r.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ob, sizeof ob);
    cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSB, &oa, sizeof oa);
    cublasLtMatrixLayoutCreate(&r.la, CUDA_R_16BF, d->trans_b ? d->k : d->n,
                               d->trans_b ? d->n : d->k, d->ldb);
    cublasLtMatrixLayoutCreate(&r.lb, CUDA_R_16BF, d->trans_a ? d->m : d->k,
                               d->trans_a ? d->k : d->m, d->lda);
    cublasLtMatrixLayoutCreate(&r.lc, d->c.dtype == ZO_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF, d->n,
                               d->m, d->ldc);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t wsb = ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                         sizeof wsb);
    L->found = 0;
    cublasLtMatmulAlgoGetHeuristic(r.lt, r.desc, r.la, r.lb, r.lc, r.lc, pref, MAX_ALGOS, L->h,
                                   &L->found);
    cublasLtMatmulPreferenceDestroy(pref);
    r.a = d->b.data;
    r.b = d->a.data;
    r.c = d->c.data;
    r.alpha = d->alpha;
    r.beta = d->beta;
    r.ws = ws;
    r.ws_bytes = ws_bytes;
    L->r = r;
}

/* Seconds per call of algorithm i, the best of this round's calls. */
static double lt_time(lt_set *L, int i, int warmup, double min_seconds)
{
    L->r.algo = L->h[i].algo;
    return bench_time_best(run_lt, &L->r, warmup, 3, min_seconds);
}

static void lt_close(lt_set *L)
{
    lt_run r = L->r;
    cublasLtMatrixLayoutDestroy(r.lc);
    cublasLtMatrixLayoutDestroy(r.lb);
    cublasLtMatrixLayoutDestroy(r.la);
    cublasLtMatmulDescDestroy(r.desc);
    cudaStreamDestroy(r.st);
    cublasLtDestroy(r.lt);
}

typedef struct shape {
    const char *name;
    int m, n, k; /* forward: y[m,n] = x[m,k] W[n,k]^T */
} shape;

/* LLaMA-2 13B's layer, at 4096 tokens */
enum { TOKENS = 4096, HIDDEN = 5120, INTER = 13824, HEADS = 40, HEAD_DIM = 128 };

static const shape shapes[] = {
    {"qkv", TOKENS, 3 * HIDDEN, HIDDEN},
    {"attn_out", TOKENS, HIDDEN, HIDDEN},
    {"gate_up", TOKENS, 2 * INTER, HIDDEN},
    {"down", TOKENS, HIDDEN, INTER},
};

/* The GEMM of the Linear sh in a pass: forward (0), input gradient (1) or weight
 * gradient (2). X stands for the activation operand (x or dy), W for the
 * weight or the second activation; both random. */
static gpu_gemm_desc gemm_pass(const shape *sh, int pass, void *X, void *W, void *Y)
{
    gpu_gemm_desc d;
    if (pass == 0) /* y[T,N] = x[T,K] W[N,K]^T */
        d = (gpu_gemm_desc){.trans_b = 1, .m = sh->m, .n = sh->n, .k = sh->k, .lda = sh->k, .ldb = sh->k,
                            .ldc = sh->n, .c = gpu_t(Y, ZO_DTYPE_BF16)};
    else if (pass == 1) /* dx[T,K] = dy[T,N] W[N,K] */
        d = (gpu_gemm_desc){.m = sh->m, .n = sh->k, .k = sh->n, .lda = sh->n, .ldb = sh->k, .ldc = sh->k,
                            .c = gpu_t(Y, ZO_DTYPE_BF16)};
    else /* dW[N,K] += dy[T,N]^T x[T,K] into an fp32 gradient */
        d = (gpu_gemm_desc){.trans_a = 1, .m = sh->n, .n = sh->k, .k = sh->m, .lda = sh->n, .ldb = sh->k,
                            .ldc = sh->k, .beta = 1.0f, .c = gpu_t(Y, ZO_DTYPE_F32)};
    d.alpha = 1.0f;
    d.a = gpu_t(X, ZO_DTYPE_BF16);
    d.b = gpu_t(W, ZO_DTYPE_BF16);
    return d;
}

/* d by gpu_gemm and by each of cuBLASLt's top algorithms (*algos of them),
 * round after round: ours' best seconds (*t_ours) and the best algorithm's
 * (*t_best; ours where none is listed); 0, or 1 when gpu_gemm fails. */
static int time_gemm(const gpu_gemm_desc *d, void *ws, double *t_ours, double *t_best, int *algos)
{
    gemm_run r = {*d};
    if (gpu_gemm(S, &r.d) != ZO_OK || gpu_stream_synchronize(S) != ZO_OK) return fail("gpu_gemm");
    lt_set L;
    lt_open(&L, &r.d, ws, LT_WS);
    /* ours, then each algorithm, round after round; each its best */
    *t_ours = *t_best = 0.0;
    for (int round = 0; round < ROUNDS; round++) {
        int warm = round == 0 ? 2 : 1;
        double t = bench_time_best(run_gpu_gemm, &r, warm, 3, 0.1);
        if (*t_ours == 0.0 || t < *t_ours) *t_ours = t;
        for (int i = 0; i < L.found; i++) {
            t = lt_time(&L, i, warm, 0.07);
            if (*t_best == 0.0 || t < *t_best) *t_best = t;
        }
    }
    *algos = L.found;
    lt_close(&L);
    if (*t_best <= 0.0) *t_best = *t_ours; /* no algorithm listed: ours stands */
    return 0;
}

/* The GEMM rows: forward, dgrad and wgrad of each Linear, random operands
 * filled through stage; *geomean: ours over the best algorithm, the
 * geometric mean of the rows' ratios. 0, or 1 on a failure. */
static int bench_gemms(void *stage, double *geomean)
{
    size_t max_x = (size_t)TOKENS * (2 * INTER > 3 * HIDDEN ? 2 * INTER : 3 * HIDDEN);
    size_t max_w = (size_t)2 * INTER * HIDDEN, max_y = max_w * 4 > max_x * 2 ? max_w * 4 : max_x * 2;
    void *X, *W, *Y, *ws;
    if (gpu_mem_alloc(dev, max_x * 2, &X) != ZO_OK || gpu_mem_alloc(dev, max_w * 2, &W) != ZO_OK ||
        gpu_mem_alloc(dev, max_y, &Y) != ZO_OK || gpu_mem_alloc(dev, LT_WS, &ws) != ZO_OK)
        return fail("gpu_mem_alloc");
    if (fill_random_bf16(X, max_x, stage, 1) != ZO_OK || fill_random_bf16(W, max_w, stage, 2) != ZO_OK)
        return fail("random inputs");
    gpu_memset_async(S, Y, 0, max_y);
    bench_row("%-9s %-6s %6s %6s %6s %10s %10s %10s %6s", "gemm", "pass", "m", "n", "k",
              "ours_TF/s", "best_TF/s", "ratio", "algos");
    static const char *passes[3] = {"fwd", "dgrad", "wgrad"};
    double log_ratio = 0.0;
    int n_ratio = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int pass = 0; pass < 3; pass++) {
            gpu_gemm_desc d = gemm_pass(&shapes[si], pass, X, W, Y);
            double flops = 2.0 * d.m * d.n * d.k, t_ours, t_best;
            int algos;
            if (time_gemm(&d, ws, &t_ours, &t_best, &algos) != 0) return 1;
            double ratio = t_best / t_ours;
            log_ratio += log(ratio);
            n_ratio++;
            bench_row("%-9s %-6s %6d %6d %6d %10.1f %10.1f %10.3f %6d", shapes[si].name, passes[pass], d.m, d.n,
                      d.k, flops / t_ours * 1e-12, flops / t_best * 1e-12, ratio, algos);
        }
    gpu_mem_free(dev, X);
    gpu_mem_free(dev, W);
    gpu_mem_free(dev, Y);
    gpu_mem_free(dev, ws);
    *geomean = exp(log_ratio / n_ratio);
    return 0;
}

/* ---- copies ----------------------------------------------------------------------- */

typedef struct copy_run {
    void *dst;
    const void *src;
    size_t bytes;
    gpu_copy_kind kind;
} copy_run;

static void run_copy(void *arg)
{
    copy_run *r = arg;
    (void)gpu_memcpy_async(S, r->dst, r->src, r->bytes, r->kind);
    (void)gpu_stream_synchronize(S);
}

/* ---- attention ---------------------------------------------------------------------- */

typedef struct attn_run {
    gpu_attn_desc a;
    gpu_tensor qkv, out, dout, dqkv;
    float *lse;
    int backward;
} attn_run;

static void run_attn(void *arg)
{
    attn_run *r = arg;
    if (r->backward)
        (void)gpu_attention_backward(S, &r->a, r->dqkv, r->dout, r->qkv, r->out, r->lse);
    else
        (void)gpu_attention_forward(S, &r->a, r->out, r->lse, r->qkv);
    (void)gpu_stream_synchronize(S);
}

/* The copy rows: 256 MiB each way, pinned and pageable, random bytes; 0, or
 * 1 on a failure. */
static int bench_copies(void)
{
    const size_t cb = (size_t)256 << 20;
    void *dbuf, *pinned, *pageable = malloc(cb);
    if (!pageable) return fail("malloc");
    if (gpu_mem_alloc(dev, cb, &dbuf) != ZO_OK || gpu_host_alloc(dev, cb, &pinned) != ZO_OK)
        return fail("copy buffers");
    fill_random_bytes(pageable, cb, 3);
    fill_random_bytes(pinned, cb, 4);
    bench_row("%-9s %-9s %10s", "copy", "host", "GB/s");
    for (int pin = 1; pin >= 0; pin--)
        for (int dir = 0; dir < 2; dir++) {
            void *host = pin ? pinned : pageable;
            copy_run r = {dir ? host : dbuf, dir ? dbuf : host, cb,
                          dir ? GPU_COPY_DEVICE_TO_HOST : GPU_COPY_HOST_TO_DEVICE};
            double t = bench_time_best(run_copy, &r, 1, 5, 0.5);
            bench_row("%-9s %-9s %10.2f", dir ? "d2h" : "h2d", pin ? "pinned" : "pageable",
                      (double)cb / t * 1e-9);
        }
    gpu_mem_free(dev, dbuf);
    gpu_host_free(dev, pinned);
    free(pageable);
    return 0;
}

/* An attention shape the rows time: b sequences of t, hq query heads of
 * d over hkv kv heads, a sliding window of `window` keys (0: none), scores
 * soft-capped at `softcap` (0: none); every path times it (the flash
 * kernel and the GEMM path take any, the tensor-core and mma.sync kernels
 * these windows and caps; head size 256 the mma.sync kernels but not the
 * tensor-core ones, whose row it leaves out). */
typedef struct attn_shape {
    int b, t, hq, hkv, d, window;
    float softcap;
} attn_shape;

static const attn_shape attn_shapes[] = {
    {TOKENS / 2048, 2048, HEADS, HEADS, HEAD_DIM, 0, 0.0f}, /* the 13B layer */
    {TOKENS / 4096, 4096, HEADS, HEADS, HEAD_DIM, 0, 0.0f},
    {8, 1024, 12, 12, 64, 0, 0.0f},    /* GPT-2 (124M): 12 heads of 64 */
    {1, 4096, 32, 8, 128, 1024, 0.0f}, /* Mistral-7B's heads (GQA 32/8) with a window of 1024: its own 4096
                                          masks nothing at t 4096 */
    {1, 4096, 32, 16, 128, 0, 50.0f},  /* Gemma-2-27B's heads (GQA 32/16), scores capped at 50 */
    {1, 4096, 16, 8, 256, 4096, 50.0f}, /* Gemma-2-9B's layer: 16 / 8 heads of 256, its window of 4096
                                           (masks nothing at t 4096) and cap of 50 */
};

/* The rows of one shape: random inputs (seeds 5 + seed and 7 + seed) filled
 * through stage; forward and backward timed on each path. 0, or 1 on a
 * failure. */
static int attention_row(const attn_shape *sh, void *stage, uint64_t seed)
{
    const int b = sh->b, t = sh->t, hq = sh->hq, d = sh->d;
    attn_run r = {.a = {.b = b, .t = t, .hq = hq, .hkv = sh->hkv, .d = d, .window = sh->window,
                        .softcap = sh->softcap}};
    size_t nqkv = (size_t)b * t * (hq + 2 * sh->hkv) * d, nout = (size_t)b * t * hq * d;
    void *qkv, *out, *dout, *dqkv, *lse, *dout32, *dqkv32;
    if (gpu_mem_alloc(dev, nqkv * 2, &qkv) != ZO_OK || gpu_mem_alloc(dev, nout * 2, &out) != ZO_OK ||
        gpu_mem_alloc(dev, nout * 2, &dout) != ZO_OK || gpu_mem_alloc(dev, nqkv * 2, &dqkv) != ZO_OK ||
        gpu_mem_alloc(dev, (size_t)b * hq * t * 4, &lse) != ZO_OK ||
        gpu_mem_alloc(dev, nout * 4, &dout32) != ZO_OK || gpu_mem_alloc(dev, nqkv * 4, &dqkv32) != ZO_OK)
        return fail("attention buffers");
    if (fill_random_bf16(qkv, nqkv, stage, 5 + seed) != ZO_OK ||
        fill_random_bf16(dout, nout, stage, 7 + seed) != ZO_OK)
        return fail("random attention inputs");
    r.qkv = gpu_t(qkv, ZO_DTYPE_BF16);
    r.out = gpu_t(out, ZO_DTYPE_BF16);
    r.dout = gpu_t(dout, ZO_DTYPE_BF16);
    r.dqkv = gpu_t(dqkv, ZO_DTYPE_BF16);
    r.lse = lse;
    /* the transformer's call: fp32 dout and dqkv (the GEMM path splits dO in
     * two bf16 parts: 10 GEMMs a chunk instead of 8) */
    attn_run r32 = r;
    r32.dout = gpu_t(dout32, ZO_DTYPE_F32);
    r32.dqkv = gpu_t(dqkv32, ZO_DTYPE_F32);
    r32.backward = 1;
    if (gpu_cast(S, r32.dout, r.dout, nout) != ZO_OK || gpu_stream_synchronize(S) != ZO_OK)
        return fail("gpu_cast (fp32 dout)");
    /* [path][direction]: path 0 the flash kernel, 1 the GEMM path, 2 the
     * fused tensor-core kernels, 3 the mma.sync kernels, 4 (when the bench
     * was started with ZO_ATTENTION=tune) the fastest of them per shape as
     * the backend tunes it, its first call of each shape untimed (the warm
     * calls); best32: the backward with fp32 grads */
    enum { PATHS = 5 };
    static const char *paths[PATHS] = {"flash", "gemm", "tc", "mma", "tune"};
    static const char *names[PATHS] = {"", " (GEMM path)", " (tensor-core kernels)", " (mma.sync)", " (tuned)"};
    static const char *rows[PATHS] = {"causal", "causal_gemm", "causal_tc", "causal_mma", "causal_tune"};
    const int n_paths = attn_tune ? PATHS : PATHS - 1;
    /* forced tc on a head size it does not cover would time the rule's choice */
    const int tc = zo_attn_tc_covers(1, d, sh->window, t, sh->softcap, 0.0f);
    double best[PATHS][2], best32[PATHS];
    for (int p = 0; p < PATHS; p++) best[p][0] = best[p][1] = best32[p] = INFINITY;
    /* the mma.sync backward with grads16 (FlashAttention-2's precision),
     * 16-bit and fp32 dout, timed right after the split one */
    double best16 = INFINITY, best16_32 = INFINITY;
    char what[96];
    for (int round = 0; round < ROUNDS; round++)
        for (int p = 0; p < n_paths; p++) {
            if (p == 2 && !tc) continue;
            setenv("ZO_ATTENTION", paths[p], 1);
            r.backward = 0;
            if (gpu_attention_forward(S, &r.a, r.out, r.lse, r.qkv) != ZO_OK ||
                gpu_stream_synchronize(S) != ZO_OK) {
                snprintf(what, sizeof what, "gpu_attention_forward%s", names[p]);
                return fail(what);
            }
            if (gpu_attention_backward(S, &r.a, r.dqkv, r.dout, r.qkv, r.out, r.lse) != ZO_OK ||
                gpu_stream_synchronize(S) != ZO_OK) {
                snprintf(what, sizeof what, "gpu_attention_backward%s", names[p]);
                return fail(what);
            }
            for (int dir = 0; dir < 2; dir++) {
                r.backward = dir;
                double tm = bench_time_best(run_attn, &r, 1, 3, 0.3);
                if (tm < best[p][dir]) best[p][dir] = tm;
            }
            if (p > 0) {
                double tm = bench_time_best(run_attn, &r32, 1, 3, 0.3);
                if (tm < best32[p]) best32[p] = tm;
            }
            if (p == 3) {
                attn_run r16 = r, r16_32 = r32;
                r16.backward = 1;
                r16.a.grads16 = r16_32.a.grads16 = 1;
                double tm = bench_time_best(run_attn, &r16, 1, 3, 0.3);
                if (tm < best16) best16 = tm;
                tm = bench_time_best(run_attn, &r16_32, 1, 3, 0.3);
                if (tm < best16_32) best16_32 = tm;
            }
        }
    unsetenv("ZO_ATTENTION");
    /* causal: half the t x t scores, forward 2 matmuls, backward 5; with a
     * window the score elements it leaves, (2 w t - w^2) / t^2 of that
     * (every path skips the tiles outside the window; memplan's
     * attn_window_work), so the rates compare with the unwindowed rows' */
    const double w = sh->window;
    const double share = sh->window > 0 && sh->window < t ? (2.0 * w * t - w * w) / ((double)t * t) : 1.0;
    const double f = 2.0 * b * hq * (double)t * t * d * share;
    bench_row("%-11s %6d %6d %6d %10.2f %10.1f %10.2f %10.1f %8s %8s %10s %10s %4d %4d %6d %5g", "causal", b, t, hq,
              best[0][0] * 1e3, f / best[0][0] * 1e-12, best[0][1] * 1e3, 2.5 * f / best[0][1] * 1e-12, "-", "-", "-",
              "-", d, sh->hkv, sh->window, (double)sh->softcap);
    for (int p = 1; p < n_paths; p++)
        if (p != 2 || tc)
            bench_row("%-11s %6d %6d %6d %10.2f %10.1f %10.2f %10.1f %8.2f %8.2f %10.2f %10.1f %4d %4d %6d %5g",
                      rows[p], b, t, hq, best[p][0] * 1e3, f / best[p][0] * 1e-12, best[p][1] * 1e3,
                      2.5 * f / best[p][1] * 1e-12, best[0][0] / best[p][0], best[0][1] / best[p][1], best32[p] * 1e3,
                      2.5 * f / best32[p] * 1e-12, d, sh->hkv, sh->window, (double)sh->softcap);
    bench_row("%-11s %6d %6d %6d %10.2f %10.1f %10.2f %10.1f %8.2f %8.2f %10.2f %10.1f %4d %4d %6d %5g", "causal_mma16",
              b, t, hq, best[3][0] * 1e3, f / best[3][0] * 1e-12, best16 * 1e3, 2.5 * f / best16 * 1e-12,
              best[0][0] / best[3][0], best[0][1] / best16, best16_32 * 1e3, 2.5 * f / best16_32 * 1e-12, d, sh->hkv,
              sh->window, (double)sh->softcap);
    gpu_mem_free(dev, qkv);
    gpu_mem_free(dev, out);
    gpu_mem_free(dev, dout);
    gpu_mem_free(dev, dqkv);
    gpu_mem_free(dev, lse);
    gpu_mem_free(dev, dout32);
    gpu_mem_free(dev, dqkv32);
    return 0;
}

/* The attention rows, one group per attn_shape (13B heads at sequences of
 * 2048 and 4096, then GPT-2's, a window's, a soft cap's and Gemma-2-9B's
 * (no causal_tc row: head size 256); the last four
 * columns say the shape: head dim, kv heads, window, cap): the
 * flash kernel's row ("causal"), the GEMM path's ("causal_gemm") and the
 * fused tensor-core kernels' ("causal_tc"), each of the last two with its
 * speedup (the flash kernel's time over its own) and its backward with fp32
 * dout and dqkv, as the transformer calls it, and the mma.sync kernels'
 * ("causal_mma", ZO_ATTENTION=mma, the same columns; "causal_mma16": its
 * backward with grads16, FlashAttention-2's precision, the forward's
 * columns causal_mma's), and, started with
 * ZO_ATTENTION=tune, the tuned choice's ("causal_tune", the same columns;
 * ZO_ATTENTION_LOG=1 prints what it chose); 0, or 1 on a failure. */
static int bench_attention(void *stage)
{
    bench_row("%-11s %6s %6s %6s %10s %10s %10s %10s %8s %8s %10s %10s %4s %4s %6s %5s", "attention", "b", "t",
              "heads", "fwd_ms", "fwd_TF/s", "bwd_ms", "bwd_TF/s", "fwd_x", "bwd_x", "bwd32_ms", "bwd32_TF/s", "d", "hkv",
              "window", "cap");
    for (size_t i = 0; i < sizeof attn_shapes / sizeof *attn_shapes; i++)
        if (attention_row(&attn_shapes[i], stage, (uint64_t)i) != 0) return 1;
    return 0;
}

/* ---- the MoE router -------------------------------------------------------------------- */

/* A router the rows time: `e` experts choosing k by `mode`, among the best
 * topk of `groups` groups, a choice bias and a scale where `bias` (those
 * of DeepSeek-V3's gate) */
typedef struct router_shape {
    const char *name;
    int e, k;
    gpu_moe_route mode;
    int groups, topk, bias;
    float scale;
} router_shape;

static const router_shape router_shapes[] = {
    {"mixtral", 8, 2, GPU_MOE_ROUTE_NORM, 0, 0, 0, 0.0f},
    {"qwen3_moe", 128, 8, GPU_MOE_ROUTE_NORM, 0, 0, 0, 0.0f},
    {"deepseek_v3", 256, 8, GPU_MOE_ROUTE_SIGMOID_NORM, 8, 4, 1, 2.5f},
    {"qwen3_next", 512, 10, GPU_MOE_ROUTE_NORM, 0, 0, 0, 0.0f},
};

typedef struct router_run {
    const gpu_moe_gate *g;
    gpu_tensor w, logits, dlogits;
    float *stats;
    uint8_t *order;
    int n, e, k, backward;
    float aux;
} router_run;

static void run_router(void *arg)
{
    router_run *r = arg;
    if (r->backward)
        (void)gpu_moe_router_backward(S, r->dlogits, r->w, r->logits, r->stats, r->n, r->e, r->k, r->g, 1, r->n,
                                      r->aux);
    else
        (void)gpu_moe_router_forward(S, r->w, r->logits, r->stats, r->order, r->n, r->e, r->k, r->g, r->n);
    (void)gpu_stream_synchronize(S);
}

/* n fp32 values uniform in [lo, hi) into device memory dst, through the
 * pinned staging (n at most STAGE / 4) */
static zo_status fill_random_f32(void *dst, size_t n, float lo, float hi, void *stage, uint64_t seed)
{
    uint64_t s = seed | 1;
    float *h = stage;
    for (size_t i = 0; i < n; i++) h[i] = lo + (hi - lo) * (float)((rng_next(&s) >> 40) * 0x1p-24);
    zo_status st = gpu_memcpy_async(S, dst, stage, n * sizeof(float), GPU_COPY_HOST_TO_DEVICE);
    return st == ZO_OK ? gpu_stream_synchronize(S) : st;
}

/* The router's rows at TOKENS tokens: the forward (the weights, the order
 * and the load-balancing statistics) and the backward (with the auxiliary
 * loss's share where the scores are a softmax), each against a device copy
 * of the logits' bytes (the least traffic either can have: read the
 * logits, write as many bytes); 0, or 1 on a failure. */
static int bench_router(void *stage)
{
    bench_row("%-12s %6s %5s %3s %10s %10s %10s %8s %8s", "router", "n", "e", "k", "fwd_ms", "bwd_ms", "copy_ms",
              "fwd_x", "bwd_x");
    for (size_t i = 0; i < sizeof router_shapes / sizeof *router_shapes; i++) {
        const router_shape *sh = &router_shapes[i];
        const int n = TOKENS, e = sh->e;
        const size_t ne = (size_t)n * e;
        float *logits, *w, *dl, *stats, *bias = NULL;
        uint8_t *order;
        if (gpu_mem_alloc(dev, ne * sizeof(float), (void **)&logits) != ZO_OK ||
            gpu_mem_alloc(dev, ne * sizeof(float), (void **)&w) != ZO_OK ||
            gpu_mem_alloc(dev, ne * sizeof(float), (void **)&dl) != ZO_OK ||
            gpu_mem_alloc(dev, 2 * (size_t)e * sizeof(float), (void **)&stats) != ZO_OK ||
            gpu_mem_alloc(dev, ne, (void **)&order) != ZO_OK ||
            (sh->bias && gpu_mem_alloc(dev, (size_t)e * sizeof(float), (void **)&bias) != ZO_OK))
            return fail("router buffers");
        if (fill_random_f32(logits, ne, -3.0f, 3.0f, stage, 100 + i) != ZO_OK ||
            (bias && fill_random_f32(bias, (size_t)e, -0.1f, 0.1f, stage, 200 + i) != ZO_OK))
            return fail("router inputs");
        const gpu_moe_gate g = {.mode = sh->mode, .groups = sh->groups, .topk_groups = sh->topk, .scale = sh->scale,
                                .bias = bias};
        router_run r = {.g = &g,
                        .w = {w, ZO_DTYPE_F32},
                        .logits = {logits, ZO_DTYPE_F32},
                        .dlogits = {dl, ZO_DTYPE_F32},
                        .stats = stats,
                        .order = order,
                        .n = n,
                        .e = e,
                        .k = sh->k,
                        .aux = sh->mode == GPU_MOE_ROUTE_SIGMOID_NORM ? 0.0f : 1e-3f};
        copy_run c = {dl, logits, ne * sizeof(float), GPU_COPY_DEVICE_TO_DEVICE};
        double t[3] = {1e30, 1e30, 1e30};
        for (int round = 0; round < ROUNDS; round++) {
            r.backward = 0; /* (the forward first: the backward reads its statistics) */
            double f = bench_time_best(run_router, &r, 1, 5, 0.1);
            r.backward = 1;
            double b = bench_time_best(run_router, &r, 1, 5, 0.1);
            double cp = bench_time_best(run_copy, &c, 1, 5, 0.1);
            t[0] = f < t[0] ? f : t[0], t[1] = b < t[1] ? b : t[1], t[2] = cp < t[2] ? cp : t[2];
        }
        r.backward = 0;
        if (gpu_moe_router_forward(S, r.w, r.logits, stats, order, n, e, sh->k, &g, n) != ZO_OK ||
            gpu_stream_synchronize(S) != ZO_OK)
            return fail("gpu_moe_router_forward");
        bench_row("%-12s %6d %5d %3d %10.3f %10.3f %10.3f %8.2f %8.2f", sh->name, n, e, sh->k, t[0] * 1e3,
                  t[1] * 1e3, t[2] * 1e3, t[0] / t[2], t[1] / t[2]);
        gpu_mem_free(dev, logits), gpu_mem_free(dev, w), gpu_mem_free(dev, dl), gpu_mem_free(dev, stats);
        gpu_mem_free(dev, order);
        if (bias) gpu_mem_free(dev, bias);
    }
    return 0;
}

int main(void)
{
    if (gpu_cuda_device_count() == 0) {
        printf("# bench_gpu_cuda: no CUDA device here (or a build without CUDA): skipped\n");
        return 77;
    }
    const char *za = getenv("ZO_ATTENTION");
    attn_tune = za && !strcmp(za, "tune");
    if (gpu_device_open("cuda:0", 0, &dev) != ZO_OK) return fail("gpu_device_open");
    if (gpu_stream_create(dev, &S) != ZO_OK) return fail("gpu_stream_create");
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    bench_header("bench_gpu_cuda",
                 "%s, %.0f GiB; LLaMA-2 13B layer, %d tokens, bf16, random inputs, %d rounds",
                 prop.name, (double)prop.totalGlobalMem / (1 << 30), TOKENS, ROUNDS);
    void *stage;
    if (gpu_host_alloc(dev, STAGE, &stage) != ZO_OK) return fail("gpu_host_alloc");
    double gemm_ratio = 0.0;
    if (bench_gemms(stage, &gemm_ratio) != 0 || bench_copies() != 0 || bench_attention(stage) != 0) return 1;
    /* the router's kernels, new to a GPU: a failure says so and exits 1,
     * after the GEMMs' ratio, so the rows above keep their summary */
    const int router_bad = bench_router(stage);
    gpu_host_free(dev, stage);
    gpu_stream_destroy(S);
    gpu_device_free(dev);
    bench_result("gpu_gemm / best cuBLASLt algorithm (TFLOP/s, geometric mean)", gemm_ratio);
    return router_bad;
}
