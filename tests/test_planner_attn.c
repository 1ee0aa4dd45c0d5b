/* memplan's attention scratch against the runtime's: the CUDA backend's
 * attention launchers (gpu/cuda/ops_cuda.c, through the host shim) run each
 * path forward and backward as the transformer calls them (bf16 qkv, fp32
 * dout and dqkv), and the shim's pool reports the most its blocks held
 * (zo_shim_pool_peak); memplan's plan_attn_path and plan_attn_pool_bytes
 * (planner/memory.c, arithmetic written apart from the launchers) must
 * give the path the launcher took and exactly those bytes. The shim is
 * given a stand-in cuBLASLt handle, so that its automatic choice is a
 * GPU's (the GEMM path from ZO_ATTN_GEMM_MIN_T tokens where the fused
 * kernels do not cover a layer); its GEMMs still run the host's tiled
 * kernel, which takes nothing from the pool. Under ZO_OPS_SHIM_LEAN (the
 * sanitizer pass) the cases whose path another case runs are left out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"           /* defines: zo_f32_to_bf16 */
#include "common/model_config.h"    /* defines: zo_model_preset_find, zo_model_layer_window */
#include "gpu/cuda/shim/shim_ops.h" /* defines: shim_cuda_ops, shim_exec_init, zo_shim_pool_peak */
#include "planner/memory.h"         /* defines: plan_attn_path, plan_attn_pool_bytes, plan_attn_scratch */

static uint64_t rng = 88172645463325252ull;

static float urand_pm1(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* ZO_OPS_SHIM_LEAN=1 (the sanitizer pass, gpu/CMakeLists.txt): the shim's
 * fiber kernels are slow under the sanitizers, so the cases whose path
 * another case runs are left out, each naming that case. */
static int lean(void)
{
    const char *v = getenv("ZO_OPS_SHIM_LEAN");
    return v && *v && strcmp(v, "0");
}

/* The runtime's ZO_ATTENTION value for a plan's forced path. */
static int cuda_path_of(zo_attn_path p)
{
    switch (p) {
    case ZO_ATTN_FLASH: return CUDA_ATTN_FLASH;
    case ZO_ATTN_GEMM: return CUDA_ATTN_GEMM;
    case ZO_ATTN_TC: return CUDA_ATTN_TC;
    case ZO_ATTN_MMA: return CUDA_ATTN_MMA;
    default: return CUDA_ATTN_AUTO;
    }
}

/* The pool's peaks of one forward and one backward of desc a on a shim
 * with x's path and cap (the bytes held before each call subtracted). */
static void pool_peaks(shim_exec *x, const gpu_attn_desc *a, zo_dtype qkv_type, uint64_t *fwd, uint64_t *bwd)
{
    const size_t rows = (size_t)a->b * a->t, nq = rows * (size_t)(a->hq + 2 * a->hkv) * a->d;
    const size_t no = rows * (size_t)a->hq * a->d, es = zo_dtype_size(qkv_type);
    char *qkv = malloc(nq * es), *out = malloc(no * es);
    float *lse = malloc((size_t)a->b * a->hq * a->t * sizeof *lse), *dout = malloc(no * sizeof *dout);
    float *dqkv = malloc(nq * sizeof *dqkv);
    assert_non_null(qkv), assert_non_null(out), assert_non_null(lse), assert_non_null(dout);
    assert_non_null(dqkv);
    for (size_t i = 0; i < nq; i++) {
        float v = urand_pm1();
        if (qkv_type == ZO_DTYPE_BF16) ((uint16_t *)qkv)[i] = zo_f32_to_bf16(v);
        else ((float *)qkv)[i] = v;
    }
    for (size_t i = 0; i < no; i++) dout[i] = 0.01f * urand_pm1();
    gpu_op_args f = {0}, b = {0};
    f.d.attn = b.d.attn = *a;
    f.t[0] = gpu_t(out, qkv_type), f.t[1] = gpu_t(qkv, qkv_type), f.p[0] = lse;
    b.t[0] = gpu_t(dqkv, ZO_DTYPE_F32), b.t[1] = gpu_t(dout, ZO_DTYPE_F32), b.t[2] = gpu_t(qkv, qkv_type);
    b.t[3] = gpu_t(out, qkv_type), b.p[0] = lse;
    size_t held = zo_shim_pool_held();
    zo_shim_pool_reset_peak();
    assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_FORWARD](&x->exec, &f), ZO_OK);
    *fwd = zo_shim_pool_peak() - held;
    assert_int_equal(zo_shim_pool_held(), held); /* all given back */
    zo_shim_pool_reset_peak();
    assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_BACKWARD](&x->exec, &b), ZO_OK);
    *bwd = zo_shim_pool_peak() - held;
    assert_int_equal(zo_shim_pool_held(), held);
    free(qkv), free(out), free(lse), free(dout), free(dqkv);
}

/* A model of one layer shape for plan_attn_path: heads of d, ALiBi or not. */
static void one_layer(zo_model_config *m, plan_train *t, int hq, int hkv, int d, int alibi, int seq, int b)
{
    memset(m, 0, sizeof *m);
    m->arch = ZO_ARCH_LLAMA;
    m->n_layers = 1, m->n_heads = hq, m->n_kv_heads = hkv, m->head_dim = d, m->hidden = hq * d;
    m->pos = alibi ? ZO_POS_ALIBI : ZO_POS_ROTARY;
    memset(t, 0, sizeof *t);
    t->seq = seq, t->micro_batch = b, t->tp = 1;
}

/* Each path forward and backward at real head dims (64, 80, 128, 192: latent
 * attention's 128 + 64, 256), GQA, windows, ALiBi, t on both sides of
 * ZO_ATTN_GEMM_MIN_T, the GEMM path across its chunking (rows halved under a
 * small cap, several kv heads a chunk but not all, the last row block
 * short) and fp32 qkv: the pool's peaks are memplan's bytes for the path
 * memplan says the layer takes, and that path is the one expected. The
 * fused kernels stay at 200 tokens or fewer (the shim's fiber kernels are
 * slow; their scratch is D whatever t). */
static void test_attn_pool_paths(void **state)
{
    (void)state;
    typedef struct {
        int b, t, hq, hkv, d, window, alibi;
        zo_attn_path force, want;
        size_t cap;
        zo_dtype qkv;
        const char *lean_repeat; /* left out under ZO_OPS_SHIM_LEAN: the case that runs its path */
    } path_case;
    static const path_case cases[] = {
        {1, 130, 4, 2, 64, 0, 0, ZO_ATTN_AUTO, ZO_ATTN_MMA, 0, ZO_DTYPE_BF16, NULL},
        {1, 136, 2, 1, 128, 48, 0, ZO_ATTN_AUTO, ZO_ATTN_MMA, 0, ZO_DTYPE_BF16, "mma.sync at t 130"},
        {1, 96, 2, 1, 256, 0, 0, ZO_ATTN_AUTO, ZO_ATTN_MMA, 0, ZO_DTYPE_BF16, "Gemma-2-9B's layers"},
        {2, 72, 2, 2, 128, 0, 1, ZO_ATTN_AUTO, ZO_ATTN_TC, 0, ZO_DTYPE_BF16, "tensor-core at d 80"},
        {1, 120, 2, 1, 80, 0, 0, ZO_ATTN_TC, ZO_ATTN_TC, 0, ZO_DTYPE_BF16, NULL},
        {1, 300, 2, 1, 128, 0, 1, ZO_ATTN_AUTO, ZO_ATTN_GEMM, 0, ZO_DTYPE_BF16, NULL},
        {1, 300, 2, 2, 192, 0, 0, ZO_ATTN_AUTO, ZO_ATTN_GEMM, 0, ZO_DTYPE_BF16, NULL},
        {1, 100, 2, 2, 192, 0, 0, ZO_ATTN_AUTO, ZO_ATTN_FLASH, 0, ZO_DTYPE_BF16, NULL},
        {1, 150, 2, 1, 64, 0, 0, ZO_ATTN_GEMM, ZO_ATTN_GEMM, 0, ZO_DTYPE_BF16, NULL},
        {2, 300, 4, 2, 64, 0, 0, ZO_ATTN_GEMM, ZO_ATTN_GEMM, 64 << 10, ZO_DTYPE_BF16, NULL},
        {1, 272, 4, 4, 64, 0, 0, ZO_ATTN_GEMM, ZO_ATTN_GEMM, 1200 << 10, ZO_DTYPE_BF16, NULL},
        {1, 520, 4, 1, 128, 100, 0, ZO_ATTN_GEMM, ZO_ATTN_GEMM, 0, ZO_DTYPE_BF16, NULL},
        {1, 140, 4, 2, 64, 0, 0, ZO_ATTN_FLASH, ZO_ATTN_FLASH, 0, ZO_DTYPE_BF16, "flash at d 192"},
        {1, 96, 2, 1, 128, 0, 0, ZO_ATTN_MMA, ZO_ATTN_FLASH, 0, ZO_DTYPE_F32, NULL},
    };
    shim_exec x;
    assert_int_equal(shim_exec_init(&x), ZO_OK);
    x.exec.lt = (cublasLtHandle_t)&x; /* a device with cuBLASLt (never called in the shim) */
    unsetenv("ZO_ATTENTION");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const path_case *c = &cases[i];
        if (lean() && c->lean_repeat) {
            printf("  b %d t %3d d %3d: left out (ZO_OPS_SHIM_LEAN; %s runs its path)\n", c->b, c->t, c->d,
                   c->lean_repeat);
            continue;
        }
        zo_model_config m;
        plan_train t;
        one_layer(&m, &t, c->hq, c->hkv, c->d, c->alibi, c->t, c->b);
        t.attn_path = c->force;
        const zo_attn_path p = plan_attn_path(&m, &t, c->qkv != ZO_DTYPE_F32, c->d, c->window);
        gpu_attn_desc a = {.b = c->b, .t = c->t, .hq = c->hq, .hkv = c->hkv, .d = c->d, .window = c->window,
                           .alibi = c->alibi ? 1.0f : 0.0f};
        x.exec.attn_path = cuda_path_of(c->force);
        x.exec.attn_cap = c->cap;
        uint64_t fwd, bwd;
        pool_peaks(&x, &a, c->qkv, &fwd, &bwd);
        const uint64_t pf = plan_attn_pool_bytes(p, 0, c->b, c->t, c->hq, c->hkv, c->d, c->window, c->cap);
        const uint64_t pb = plan_attn_pool_bytes(p, 1, c->b, c->t, c->hq, c->hkv, c->d, c->window, c->cap);
        printf("  b %d t %3d heads %d/%d d %3d window %3d%s cap %7zu: path %d (want %d), forward %8llu (memplan "
               "%8llu), backward %8llu (memplan %8llu)\n",
               c->b, c->t, c->hq, c->hkv, c->d, c->window, c->alibi ? " alibi" : "", c->cap, (int)p, (int)c->want,
               (unsigned long long)fwd, (unsigned long long)pf, (unsigned long long)bwd, (unsigned long long)pb);
        assert_int_equal(p, c->want);
        assert_int_equal(fwd, pf);
        assert_int_equal(bwd, pb);
        /* what each path takes: nothing forward but on the GEMM path, D
         * [b, hq, t] fp32 backward on the fused kernels, nothing on flash */
        if (p == ZO_ATTN_GEMM) assert_true(fwd > 0 && bwd > fwd);
        else assert_int_equal(fwd, 0);
        if (p == ZO_ATTN_MMA || p == ZO_ATTN_TC) assert_int_equal(bwd, (uint64_t)c->b * c->hq * c->t * 4);
        if (p == ZO_ATTN_FLASH) assert_int_equal(bwd, 0);
    }
    shim_exec_free(&x);
}

/* Whole models, layer by layer as the transformer calls attention (its
 * layer_attn: each layer's window, the soft cap, the heads over TP): the
 * largest backward peak over the layers is plan_attn_scratch's bytes, and
 * its path plan_attn_scratch's. LLaMA-2-13B (40 heads of 128, TP 20: two a
 * rank) on the automatic choice; Gemma-2-9B (16 and 8 heads of 256, TP 8:
 * two and one) with its window cut (40, 64) so that it masks at these lengths,
 * automatic and with the GEMM path forced, where its global layers take
 * more than its windowed ones; DeepSeek-V2-Lite (MoE, latent attention: 16
 * heads of 128 + 64, TP 8), whose head dim no fused kernel takes: the GEMM
 * path from t 256 under the automatic rule. */
static void test_attn_pool_models(void **state)
{
    (void)state;
    typedef struct {
        const char *preset;
        int tp, seq, b, window;
        zo_attn_path force, want;
        const char *lean_repeat; /* left out under ZO_OPS_SHIM_LEAN: the case that runs its path */
    } model_case;
    static const model_case cases[] = {
        {"llama-2-13b", 20, 136, 1, 0, ZO_ATTN_AUTO, ZO_ATTN_MMA, "mma.sync at t 130"},
        {"gemma-2-9b", 8, 96, 1, 40, ZO_ATTN_AUTO, ZO_ATTN_MMA, NULL},
        {"gemma-2-9b", 8, 400, 1, 64, ZO_ATTN_GEMM, ZO_ATTN_GEMM, NULL},
        {ZO_FIXTURES_DIR "/hf-configs/deepseek-v2-lite.json", 8, 300, 1, 0, ZO_ATTN_AUTO, ZO_ATTN_GEMM, NULL},
    };
    shim_exec x;
    assert_int_equal(shim_exec_init(&x), ZO_OK);
    x.exec.lt = (cublasLtHandle_t)&x;
    unsetenv("ZO_ATTENTION");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const model_case *c = &cases[i];
        if (lean() && c->lean_repeat) {
            printf("  %s t %d: left out (ZO_OPS_SHIM_LEAN; %s runs its path)\n", c->preset, c->seq, c->lean_repeat);
            continue;
        }
        zo_model_config m;
        if (strchr(c->preset, '/')) assert_int_equal(zo_model_config_load(c->preset, &m), ZO_OK);
        else assert_int_equal(zo_model_preset_find(c->preset, &m), ZO_OK);
        if (c->window) m.sliding_window = c->window;
        plan_train t;
        plan_train_defaults(&t, &m);
        t.seq = c->seq, t.micro_batch = c->b, t.tp = c->tp, t.attn_path = c->force;
        const int hq = m.n_heads / c->tp, hkv = m.n_kv_heads / c->tp;
        x.exec.attn_path = cuda_path_of(c->force);
        x.exec.attn_cap = 0;
        /* each distinct window once: the layers of one window are alike */
        uint64_t most = 0;
        int seen[2] = {-1, -1}, distinct = 0;
        for (int l = 0; l < m.n_layers; l++) {
            const int w = zo_model_layer_window(&m, l);
            if (w == seen[0] || w == seen[1]) continue;
            assert_true(distinct < 2);
            seen[distinct++] = w;
            gpu_attn_desc a = {.b = c->b, .t = c->seq, .hq = hq, .hkv = hkv, .d = m.head_dim,
                               .window = w < c->seq ? w : 0, .softcap = m.attn_softcap};
            uint64_t fwd, bwd;
            pool_peaks(&x, &a, ZO_DTYPE_BF16, &fwd, &bwd);
            printf("  %s t %d window %d: forward %llu, backward %llu\n", c->preset, c->seq, w,
                   (unsigned long long)fwd, (unsigned long long)bwd);
            if (fwd > most) most = fwd;
            if (bwd > most) most = bwd;
        }
        zo_attn_path p;
        const uint64_t plan = plan_attn_scratch(&m, &t, 2, 0, m.n_layers, &p);
        printf("  %s: memplan %llu on path %d, measured %llu\n", c->preset, (unsigned long long)plan, (int)p,
               (unsigned long long)most);
        assert_int_equal(plan, most);
        assert_int_equal(p, c->want);
        assert_true(plan > 0);
        /* fp32 activations: the flash kernel, nothing from the pool */
        assert_int_equal(plan_attn_scratch(&m, &t, 4, 0, m.n_layers, &p), 0);
        assert_int_equal(p, ZO_ATTN_FLASH);
    }
    shim_exec_free(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attn_pool_paths),
        cmocka_unit_test(test_attn_pool_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
