/* Generation's time on the CPU backend beside memplan's (gen_time.h). */
#include "bench/gen_time.h"

#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"           /* defines: bench_memcpy_rate */
#include "common/clock.h"         /* defines: zo_now */
#include "planner/calibrate.h"    /* defines: plan_calibrate_run */
#include "transformer/generate.h" /* defines: tf_gen */

/* The best of `reps` forwards of every block of model m on s (seconds). */
static double forward_time(tf_model *m, gpu_stream_t s, void *const *blocks, int reps)
{
    tf_model_bufs bufs = {.params = blocks};
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        gpu_stream_synchronize(s);
        double t0 = zo_now();
        if (tf_forward_all(m, &bufs, s) != ZO_OK || gpu_stream_synchronize(s) != ZO_OK) return -1;
        double t = zo_now() - t0;
        best = t < best ? t : best;
    }
    return best;
}

/* A block's random weights (fp32) into its device buffer in the model's dtype. */
typedef struct weight_sink {
    tf_model *m;
    gpu_stream_t s;
    void **buf;
    void *host;
} weight_sink;

static zo_status put_block(void *ctx, int block, const void *w)
{
    weight_sink *k = ctx;
    size_t bytes = tf_block_bytes(k->m, block);
    zo_convert(k->host, k->m->dtype, w, ZO_DTYPE_F32, bytes / zo_dtype_size(k->m->dtype));
    zo_status st = gpu_memcpy_async(k->s, k->buf[block], k->host, bytes, GPU_COPY_HOST_TO_DEVICE);
    return st == ZO_OK ? gpu_stream_synchronize(k->s) : st;
}

/* Seconds of a forward's compute on the CPU backend, outside the runtime:
 * the model of case c built for generation, every block resident in device
 * memory (zero weights; an MoE model's the run's random ones, seed 1, and
 * the run's prompt, so that its layers route as the run's do, not every
 * token to the first experts as zero weights would), its blocks forward
 * one after another (the best of several); *token: one new token a
 * sequence halfway through the generation, *prompt: the prompts at
 * position 0. */
static zo_status forward_compute(const gen_time_case *c, int threads, double *token, double *prompt)
{
    gpu_cpu_options o = {.n_threads = threads};
    gpu_device_t dev;
    gpu_stream_t s = NULL;
    tf_model m;
    memset(&m, 0, sizeof m);
    int nb = c->m.n_layers + 2;
    void **buf = calloc((size_t)nb, sizeof *buf);
    int *pos = calloc((size_t)c->batch, sizeof *pos), *last = calloc((size_t)c->batch, sizeof *last);
    int32_t *tok = calloc((size_t)c->batch * c->prompt, sizeof *tok);
    zo_status st = gpu_device_init_cpu(&o, &dev);
    if (st != ZO_OK) goto out_free;
    tf_options to = {.kv_len = c->prompt + c->new_tokens};
    if ((st = gpu_stream_create(dev, &s)) != ZO_OK ||
        (st = tf_init_opts(&m, &c->m, dev, c->dtype, c->batch, c->prompt, &to)) != ZO_OK)
        goto out_dev;
    size_t most = 0;
    for (int b = 0; b < nb; b++) {
        size_t bytes = tf_block_bytes(&m, b);
        if ((st = gpu_mem_alloc(dev, bytes, &buf[b])) != ZO_OK) goto out_dev;
        gpu_memset_async(s, buf[b], 0, bytes);
        most = bytes > most ? bytes : most;
    }
    if (c->m.moe.experts) {
        weight_sink sink = {.m = &m, .s = s, .buf = buf, .host = malloc(most)};
        st = sink.host ? tf_load_blocks(&m.layout, NULL, 1, put_block, &sink)
                       : zo_error(ZO_ERR_NOMEM, "gen_time: out of host memory for a block of %zu bytes", most);
        free(sink.host);
        if (st != ZO_OK) goto out_dev;
        for (int i = 0; i < c->batch * c->prompt; i++) tok[i] = (i % c->prompt * 7 + 1) % c->m.vocab;
    }
    for (int k = 0; k < 2; k++) { /* a token, then the prompts */
        int t = k ? c->prompt : 1;
        for (int j = 0; j < c->batch; j++) pos[j] = k ? 0 : c->prompt + c->new_tokens / 2, last[j] = t - 1;
        double ft;
        if ((st = tf_set_tokens(&m, s, tok, c->batch, t, pos, last)) != ZO_OK) goto out_dev;
        if ((ft = forward_time(&m, s, buf, 5)) < 0) {
            st = zo_error(ZO_ERR_INTERNAL, "gen_time: the forward: %s", zo_last_error());
            goto out_dev;
        }
        *(k ? prompt : token) = ft;
    }
out_dev:
    for (int b = 0; b < nb; b++) gpu_mem_free(dev, buf[b]);
    tf_free(&m);
    if (s) gpu_stream_destroy(s);
    gpu_device_free(dev);
out_free:
    free(buf);
    free(pos);
    free(last);
    free(tok);
    return st;
}

zo_status gen_time_measure_machine(const gen_time_case *c, int threads, const char *nvme_dir, gen_time_machine *out)
{
    plan_calibrate_opts co;
    plan_calibrate_defaults(&co);
    co.seconds = 0.1;
    co.threads = threads;
    co.nvme_dir = nvme_dir;
    /* a file the size of the weights, read again and again as each token
     * reads them: the rate sustained over 8 passes, all their bytes over all
     * their time (the disk's rate swings pass to pass; its best pass is not
     * what a run of 32 tokens gets) */
    co.nvme_bytes = zo_model_params(&c->m) * zo_dtype_size(c->dtype);
    co.nvme_reads = 8;
    /* read a block's weights at a time, as the runtime's weight store does */
    zo_param_counts pc;
    zo_model_param_counts(&c->m, &pc);
    co.nvme_tensor_bytes = pc.per_layer * zo_dtype_size(c->dtype);
    co.adam_params = 1u << 18;
    zo_status st = plan_calibrate_run(&co, &out->host);
    out->nvme_rounds = 1;
    if (st == ZO_OK) st = forward_compute(c, threads, &out->token_s, &out->prompt_s);
    out->copy_bw = bench_memcpy_rate();
    return st;
}

void gen_time_best(gen_time_machine *b, const gen_time_machine *m)
{
    double *faster[] = {&b->host.cpu_mem_bw, &b->copy_bw};
    const double got[] = {m->host.cpu_mem_bw, m->copy_bw};
    for (int i = 0; i < 2; i++) *faster[i] = got[i] > *faster[i] ? got[i] : *faster[i];
    /* the read rates, idle and beside compute: each round's bytes over the time of all */
    double *rate[] = {&b->host.nvme_read_bw, &b->host.nvme_read_bw_busy};
    const double mrate[] = {m->host.nvme_read_bw, m->host.nvme_read_bw_busy};
    double nb = b->nvme_rounds, nm = m->nvme_rounds;
    for (int i = 0; i < 2; i++)
        if (mrate[i] > 0 && *rate[i] > 0) *rate[i] = (nb + nm) / (nb / *rate[i] + nm / mrate[i]);
    if (m->host.nvme_read_bw > 0 && b->host.nvme_read_bw > 0) b->nvme_rounds += m->nvme_rounds;
    b->token_s = m->token_s < b->token_s ? m->token_s : b->token_s;
    b->prompt_s = m->prompt_s < b->prompt_s ? m->prompt_s : b->prompt_s;
}

zo_status gen_time_hw(const gen_time_case *c, const gen_time_machine *m, plan_hw *hw)
{
    /* a first split between compute and memory from the host's bandwidth
     * and a nominal peak; then the rounds that make both times exact (each
     * rate moves the other's time a little) */
    plan_hw_cpu_backend(&m->host, 1e10, m->copy_bw, 1ull << 40, hw);
    zo_status st = ZO_OK;
    for (int it = 0; it < 12 && st == ZO_OK; it++) {
        plan_gen_estimate e;
        if ((st = gen_time_predict(c, hw, &e)) != ZO_OK) break;
        hw->hbm_bw *= e.compute_s / m->token_s;
        if ((st = gen_time_predict(c, hw, &e)) != ZO_OK) break;
        hw->peak_flops_16 *= e.prompt_compute_s / m->prompt_s;
        hw->peak_flops_32 = hw->peak_flops_16;
    }
    return st;
}

zo_status gen_time_predict(const gen_time_case *c, const plan_hw *hw, plan_gen_estimate *e)
{
    plan_gen g;
    plan_gen_defaults(&g);
    g.batch = c->batch;
    g.prompt = c->prompt;
    g.new_tokens = c->new_tokens;
    g.dtype = c->dtype;
    g.params_on = c->params_on;
    g.prefetch_depth = c->prefetch;
    g.cuda_context = g.cublas_workspace = 0;
    g.fragmentation = 0;
    return plan_gen_estimate_run(&c->m, hw, &g, e);
}

zo_status gen_time_measure(const gen_time_case *c, int threads, const char *nvme_dir, double *s_per_token,
                           double *ttft)
{
    gpu_cpu_options o = {.n_threads = threads};
    gpu_device_t dev;
    zo_status st = gpu_device_init_cpu(&o, &dev);
    if (st != ZO_OK) return st;
    tf_gen_config gc = {.batch = c->batch, .prompt_max = c->prompt, .ctx = c->prompt + c->new_tokens, .dtype = c->dtype};
    offload_config_defaults(&gc.oc);
    gc.oc.params_on = (offload_tier)c->params_on;
    gc.oc.prefetch_depth = c->prefetch;
    gc.oc.nvme_dir = nvme_dir;
    gc.oc.n_threads = threads;
    tf_gen g;
    int32_t *prompt = calloc((size_t)c->prompt, sizeof *prompt), *next = calloc((size_t)c->batch, sizeof *next);
    const int32_t **pp = calloc((size_t)c->batch, sizeof *pp);
    int *lens = calloc((size_t)c->batch, sizeof *lens);
    float *logits = malloc((size_t)c->batch * c->m.vocab * sizeof *logits);
    if (!prompt || !next || !pp || !lens || !logits) {
        st = zo_error(ZO_ERR_NOMEM, "gen_time_measure: out of host memory");
        goto out_dev;
    }
    if ((st = tf_gen_init(&g, &c->m, dev, &gc)) != ZO_OK) goto out_dev;
    if ((st = tf_gen_load(&g, NULL, 1, NULL)) != ZO_OK) goto out_gen;
    for (int i = 0; i < c->prompt; i++) prompt[i] = (i * 7 + 1) % c->m.vocab;
    for (int j = 0; j < c->batch; j++) pp[j] = prompt, lens[j] = c->prompt;
    double t0 = zo_now();
    if ((st = tf_gen_prompt(&g, pp, lens, c->batch, logits)) != ZO_OK) goto out_gen;
    double t1 = zo_now();
    for (int k = 1; k < c->new_tokens; k++) {
        for (int j = 0; j < c->batch; j++) next[j] = (k * 13 + j) % c->m.vocab;
        if ((st = tf_gen_next(&g, next, logits)) != ZO_OK) goto out_gen;
    }
    *ttft = t1 - t0;
    *s_per_token = (zo_now() - t1) / (c->new_tokens - 1);
out_gen:
    tf_gen_free(&g);
out_dev:
    free(prompt);
    free(next);
    free(pp);
    free(lens);
    free(logits);
    gpu_device_free(dev);
    return st;
}
