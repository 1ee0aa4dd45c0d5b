/* Expert parallelism's exchange in the transformer (issue 31), under
 * mpiexec on P ranks: a model built with tf_options.ep = the world holds
 * this rank's E/P experts (the layout's window) and sends each (token,
 * expert) pair to its owner and back. Its forward and backward on this
 * rank's batch must give what the whole model (every expert here, no
 * exchange) gives:
 * - the loss of the rank's batch, and the gradients of everything but the
 *   routed experts (attention, norms, router, Qwen2-MoE's shared expert
 *   and its gate, the embedding and the head) from that batch;
 * - for each local expert, the gradient of every rank's batch summed (its
 *   owner computes all of them), against the whole model's backward of the
 *   P batches one after another;
 * - the windowed layout's random initialisation gives each expert the
 *   whole model's values (compared before any step);
 * - with recompute too (the exchange runs again before each backward).
 * Within 1e-6 relative (losses) and 1e-5 of the tensor's largest gradient;
 * how many are bit-identical is printed. One rank: skipped (77). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model_config.h"       /* defines: zo_model_config_parse */
#include "gpu/comm.h"                  /* defines: comm_init, comm_rank, comm_size */
#include "transformer/transformer.h"   /* defines: tf_init_opts, tf_block_forward */

#define B 2
#define T 16

static comm_t world;

/* Mixtral-shaped (4 experts, 2 a token, load-balancing loss) and
 * Qwen2-MoE-shaped (8 experts, 3 a token, shared expert and its gate) */
static const char *const configs[2] = {
    "{\"model_type\": \"mixtral\", \"num_hidden_layers\": 2, \"hidden_size\": 32, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 24, "
    "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"vocab_size\": 64, "
    "\"max_position_embeddings\": 64, \"output_router_logits\": true, \"router_aux_loss_coef\": 0.02}",
    "{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 2, \"hidden_size\": 32, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 64, "
    "\"moe_intermediate_size\": 16, \"shared_expert_intermediate_size\": 24, \"num_experts\": 8, "
    "\"num_experts_per_tok\": 3, \"norm_topk_prob\": false, \"decoder_sparse_step\": 1, "
    "\"mlp_only_layers\": [], \"vocab_size\": 64, \"max_position_embeddings\": 64, "
    "\"output_router_logits\": true, \"router_aux_loss_coef\": 0.05}"};

typedef struct run {
    tf_model m;
    void **params, **grads; /* [blocks] device */
} run;

static void run_open(run *r, const zo_model_config *cfg, gpu_device_t dev, gpu_stream_t s, const tf_options *o)
{
    if (tf_init_opts(&r->m, cfg, dev, ZO_DTYPE_F32, B, T, o) != ZO_OK) fail_msg("tf_init: %s", zo_last_error());
    const model_layout *l = &r->m.layout;
    r->params = calloc((size_t)l->n_blocks, sizeof *r->params);
    r->grads = calloc((size_t)l->n_blocks, sizeof *r->grads);
    uint64_t rng = tf_init_rng(7);
    for (int b = 0; b < l->n_blocks; b++) {
        size_t bytes = l->block_numel[b] * 4;
        float *w = malloc(bytes);
        tf_init_block_weights(l, b, w, &rng);
        assert_int_equal(gpu_mem_alloc(dev, bytes, &r->params[b]), ZO_OK);
        assert_int_equal(gpu_mem_alloc(dev, bytes, &r->grads[b]), ZO_OK);
        assert_int_equal(gpu_memcpy_async(s, r->params[b], w, bytes, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
        assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
        free(w);
    }
}

static void run_close(run *r)
{
    for (int b = 0; b < r->m.layout.n_blocks; b++) {
        gpu_mem_free(r->m.dev, r->params[b]);
        gpu_mem_free(r->m.dev, r->grads[b]);
    }
    free(r->params);
    free(r->grads);
    tf_free(&r->m);
}

static void zero_grads(run *r, gpu_stream_t s)
{
    for (int b = 0; b < r->m.layout.n_blocks; b++)
        assert_int_equal(gpu_memset_async(s, r->grads[b], 0, r->m.layout.block_numel[b] * 4), ZO_OK);
}

/* Rank p's batch: tokens from its own sequence, targets the next tokens. */
static void batch(int p, int vocab, int32_t *in, int32_t *tg)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(p + 1);
    int32_t seq[B * T + 1];
    for (int i = 0; i <= B * T; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        seq[i] = (int32_t)((x >> 33) % (uint64_t)vocab);
    }
    for (int i = 0; i < B * T; i++) {
        in[i] = seq[i];
        tg[i] = seq[i + 1];
    }
}

/* Forward and backward of batch p (gradients added), its loss. */
static float pass(run *r, gpu_stream_t s, int p)
{
    int32_t in[B * T], tg[B * T];
    batch(p, r->m.cfg.vocab, in, tg);
    tf_model *m = &r->m;
    float loss;
    tf_block_bufs bb = {0};
    assert_int_equal(tf_set_batch(m, s, in, tg, B, T), ZO_OK);
    for (int b = 0; b < m->layout.n_blocks; b++) {
        bb.params = r->params[b];
        bb.embed_params = r->params[0];
        if (tf_block_forward(m, b, &bb, s) != ZO_OK) fail_msg("forward: %s", zo_last_error());
    }
    assert_int_equal(tf_loss(m, s, &loss), ZO_OK);
    for (int b = m->layout.n_blocks - 1; b >= 0; b--) {
        bb.params = r->params[b];
        bb.grads = r->grads[b];
        bb.embed_params = r->params[0];
        bb.embed_grads = r->grads[0];
        if (tf_block_recompute(m, b, &bb, s) != ZO_OK || tf_block_backward(m, b, &bb, 1.0f, s) != ZO_OK)
            fail_msg("backward: %s", zo_last_error());
    }
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
    return loss;
}

/* Tensor t of run r's block buffers (params or grads) in host memory. */
static float *tensor(void **bufs, const model_tensor *t)
{
    float *h = malloc(t->numel * 4);
    memcpy(h, (const float *)bufs[t->block] + t->offset, t->numel * 4); /* the CPU device's memory */
    return h;
}

/* |a - b| <= tol max |b| over the tensor; *same counts bit-identical ones. */
static void compare(const char *what, const char *name, const float *a, const float *b, size_t n, double tol,
                    int *same)
{
    double most = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        most = fmax(most, fabs(b[i]));
        worst = fmax(worst, fabs((double)a[i] - b[i]));
    }
    *same += !memcmp(a, b, n * 4);
    if (!(worst <= tol * most)) fail_msg("rank %d: %s of %s: %.3e off (largest %.3e)", comm_rank(world), what, name,
                                         worst, most);
}

static int is_expert(const model_tensor *t)
{
    return t->role >= MODEL_ROLE_EXPERT_GATE_W && t->role <= MODEL_ROLE_EXPERT_DOWN_W;
}

static void exchange(int which, int recompute)
{
    const int me = comm_rank(world), P = comm_size(world);
    zo_model_config cfg;
    assert_int_equal(zo_model_config_parse(configs[which], "test", &cfg), ZO_OK);
    gpu_cpu_options co = {.n_threads = 1};
    gpu_device_t dev;
    gpu_stream_t s;
    assert_int_equal(gpu_device_init_cpu(&co, &dev), ZO_OK);
    assert_int_equal(gpu_stream_create(dev, &s), ZO_OK);
    tf_options whole_o = {.recompute = recompute}, ep_o = {.recompute = recompute, .ep = world};
    run whole, ep;
    run_open(&whole, &cfg, dev, s, &whole_o);
    run_open(&ep, &cfg, dev, s, &ep_o);
    const model_layout *wl = &whole.m.layout, *el = &ep.m.layout;
    assert_int_equal(el->expert_count, cfg.moe.experts / P);
    assert_int_equal(el->expert_first, me * (cfg.moe.experts / P));
    /* the rank's experts: the whole model's, by their global names */
    int same_w = 0, n_w = 0;
    for (int i = 0; i < el->n_tensors; i++) {
        const model_tensor *t = &el->tensors[i], *u = model_layout_find(wl, t->name);
        assert_non_null(u);
        float *a = tensor(ep.params, t), *b = tensor(whole.params, u);
        compare("weight", t->name, a, b, t->numel, 0.0, &same_w);
        n_w++;
        free(a);
        free(b);
    }
    zero_grads(&whole, s);
    zero_grads(&ep, s);
    uint64_t a2a0 = comm_all_to_all_bytes(world);
    float loss_ep = pass(&ep, s, me), loss_whole = pass(&whole, s, me);
    double rel = fabs((double)loss_ep - loss_whole) / fabs((double)loss_whole);
    if (!(rel <= 1e-6)) fail_msg("rank %d: loss %.9g against the whole model's %.9g", me, loss_ep, loss_whole);
    /* everything but the routed experts: from this rank's batch */
    int same_d = 0, n_d = 0, same_x = 0, n_x = 0;
    for (int i = 0; i < el->n_tensors; i++) {
        const model_tensor *t = &el->tensors[i], *u = model_layout_find(wl, t->name);
        if (is_expert(t)) continue;
        float *a = tensor(ep.grads, t), *b = tensor(whole.grads, u);
        compare("gradient", t->name, a, b, t->numel, 1e-5, &same_d);
        n_d++;
        free(a);
        free(b);
    }
    /* the routed experts: every rank's batch */
    for (int p = 0; p < P; p++)
        if (p != me) pass(&whole, s, p);
    for (int i = 0; i < el->n_tensors; i++) {
        const model_tensor *t = &el->tensors[i], *u = model_layout_find(wl, t->name);
        if (!is_expert(t)) continue;
        float *a = tensor(ep.grads, t), *b = tensor(whole.grads, u);
        compare("gradient", t->name, a, b, t->numel, 1e-5, &same_x);
        n_x++;
        free(a);
        free(b);
    }
    /* the bytes sent: what the model says its exchanges were, counted by
     * the communicator */
    const uint64_t(*pr)[2] = (const uint64_t(*)[2])ep.m.ep_pairs;
    uint64_t he = (uint64_t)cfg.hidden * 4, counts = (uint64_t)(P - 1) * (uint64_t)el->expert_count * 4;
    uint64_t want = ep.m.ep_layers[TF_EP_FORWARD] * counts + pr[TF_EP_FORWARD][0] * (he + 4) +
                    pr[TF_EP_FORWARD][1] * he + ep.m.ep_layers[TF_EP_RECOMPUTE] * counts +
                    pr[TF_EP_RECOMPUTE][0] * (he + 4) + pr[TF_EP_BACKWARD][0] * 4 * cfg.hidden +
                    pr[TF_EP_BACKWARD][1] * (4 * (uint64_t)cfg.hidden + 4);
    uint64_t got = comm_all_to_all_bytes(world) - a2a0;
    assert_int_equal(ep.m.ep_layers[TF_EP_RECOMPUTE], recompute ? ep.m.ep_layers[TF_EP_FORWARD] : 0);
    printf("  rank %d of %d, %s%s: loss %s (%.1e), weights %d of %d identical, gradients: dense %d of %d "
           "identical, experts %d of %d; %llu pairs out, %llu in; %llu all-to-all bytes, %llu counted\n",
           me, P, cfg.family, recompute ? ", recompute" : "", loss_ep == loss_whole ? "identical" : "within", rel,
           same_w, n_w, same_d, n_d, same_x, n_x, (unsigned long long)pr[TF_EP_FORWARD][0],
           (unsigned long long)pr[TF_EP_FORWARD][1], (unsigned long long)got, (unsigned long long)want);
    assert_int_equal(got, want);
    run_close(&ep);
    run_close(&whole);
    gpu_stream_destroy(s);
    gpu_device_free(dev);
}

static void test_mixtral(void **state)
{
    (void)state;
    exchange(0, 0);
    exchange(0, 1);
}

static void test_qwen2_moe(void **state)
{
    (void)state;
    exchange(1, 0);
    exchange(1, 1);
}

int main(void)
{
    comm_options o = {0};
    if (comm_init(&o, &world) != ZO_OK) {
        fprintf(stderr, "comm_init: %s\n", zo_last_error());
        return 1;
    }
    if (comm_size(world) < 2) {
        printf("skipped: expert parallelism needs 2 ranks or more (run under mpiexec)\n");
        comm_free(world);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_qwen2_moe),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    comm_free(world);
    return rc;
}
