/* bench_generate: generation's time per token on the CPU backend with the
 * weights resident, streamed from pinned host memory and read from NVMe,
 * against memplan generate's prediction for this machine.
 *
 * The machine is described to the planner as a "GPU" that is its own CPU
 * (plan_hw_cpu_backend, bench/gen_time.h): the host's profile
 * measured here (the NVMe read rate of --nvme-dir), memcpy as the host
 * link, and the device's memory rate and peak fitted to the model's
 * forward run outside the runtime (a token, the prompt); what the planner
 * adds is the runtime's traffic and its bound. The measurements and the
 * cases alternate round by round; each takes its best round (the machine
 * may be shared), but the NVMe read rate is the one sustained over every
 * round's passes (a disk's best pass is not what a run gets). Rows: tokens/s measured and predicted, the bound, and the
 * ratio; then each placement against the resident weights; last, the
 * largest |measured / predicted - 1|.
 *
 * --mla: DeepSeek-V2's latent cache against its full one instead
 * (transformer.h, tf_options.mla_cache): a V2-Lite-like model (16 heads of
 * 128 + 64, v 128, kv_lora_rank 512, hidden 2048) of --layers dense layers
 * with an MLP of 1408 (V2-Lite's expert's width) and vocab 4096, resident,
 * --batch sequences of a --prompt and --tokens new tokens; the two caches'
 * tokens alternate one by one and their prompts' order swaps each round
 * (run_mla). Rows: each cache's bytes, the device's peak, the first token
 * and tokens/s; their ratios (the prompt's forward: full's best first token
 * over latent's); last, latent's tokens/s over full's. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench/bench.h"             /* defines: bench_header, bench_row, bench_result */
#include "common/units.h"            /* defines: zo_parse_int, zo_format_bytes */
#include "bench/gen_time.h"          /* defines: gen_time_machine, gen_time_measure, gen_time_predict */
#include "transformer/generate.h"    /* defines: tf_gen, tf_gen_prompt, tf_gen_next */

/* A generation of `cfg` over one of the caches, on a device of its own. */
typedef struct mla_side {
    gpu_device_t dev;
    tf_gen g;
    int ready;
} mla_side;

static zo_status mla_open(mla_side *x, const zo_model_config *cfg, int mla_cache, int batch, int prompt, int tokens,
                          int threads)
{
    gpu_cpu_options o = {.n_threads = threads};
    zo_status st = gpu_device_init_cpu(&o, &x->dev);
    if (st != ZO_OK) return st;
    tf_gen_config gc = {.batch = batch, .prompt_max = prompt, .ctx = prompt + tokens, .dtype = ZO_DTYPE_BF16,
                        .mla_cache = mla_cache};
    offload_config_defaults(&gc.oc);
    gc.oc.n_threads = threads;
    if ((st = tf_gen_init(&x->g, cfg, x->dev, &gc)) != ZO_OK) return st;
    x->ready = 1;
    return tf_gen_load(&x->g, NULL, 7, NULL); /* the same random weights on both sides */
}

static void mla_close(mla_side *x)
{
    if (x->ready) tf_gen_free(&x->g);
    if (x->dev) gpu_device_free(x->dev);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* --mla: the latent cache against the full one (above). Each round opens
 * both, runs their prompts' forwards and then their tokens alternately,
 * one token of each in turn (the order swapped every token), so that both
 * see the same load; a side's tokens/s is sequences over its median
 * token's time over every round, its first token the best round's. */
static int run_mla(long layers, long batch, long prompt, long tokens, long rounds, long threads)
{
    char json[1024];
    snprintf(json, sizeof json,
             "{\"model_type\": \"deepseek_v2\", \"num_hidden_layers\": %ld, \"hidden_size\": 2048, "
             "\"num_attention_heads\": 16, \"num_key_value_heads\": 16, \"q_lora_rank\": null, "
             "\"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, "
             "\"intermediate_size\": 1408, \"n_routed_experts\": null, \"vocab_size\": 4096, "
             "\"max_position_embeddings\": 8192, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0}",
             layers);
    zo_model_config cfg;
    if (zo_model_config_parse(json, "bench_generate --mla", &cfg) != ZO_OK) {
        fprintf(stderr, "bench_generate: %s\n", zo_last_error());
        return 1;
    }
    static const char *const names[2] = {"latent", "full"};
    const int kinds[2] = {TF_MLA_CACHE_LATENT, TF_MLA_CACHE_FULL};
    const int nt = (int)(tokens - 1) * (int)rounds;
    double *tok[2] = {malloc((size_t)nt * sizeof(double)), malloc((size_t)nt * sizeof(double))};
    double ttft[2] = {1e30, 1e30};
    size_t kv[2] = {0, 0}, peak[2] = {0, 0};
    int32_t *ids = malloc((size_t)prompt * sizeof *ids), next[64];
    float *logits = malloc((size_t)batch * cfg.vocab * sizeof *logits);
    const int32_t *pp[64];
    int lens[64], n = 0, rc = 1;
    if (!tok[0] || !tok[1] || !ids || !logits) goto out;
    for (int i = 0; i < prompt; i++) ids[i] = (int32_t)((i * 7 + 3) % cfg.vocab);
    for (int j = 0; j < batch; j++) pp[j] = ids, lens[j] = (int)prompt, next[j] = (int32_t)(j + 1);
    for (int r = 0; r < rounds; r++) {
        mla_side x[2] = {{0}, {0}};
        zo_status st = ZO_OK;
        for (int i = 0; i < 2 && st == ZO_OK; i++)
            if ((st = mla_open(&x[i], &cfg, kinds[i], (int)batch, (int)prompt, (int)tokens, (int)threads)) != ZO_OK)
                fprintf(stderr, "bench_generate --mla: %s cache: %s\n", names[i], zo_last_error());
        for (int q = 0; q < 2 && st == ZO_OK; q++) {
            int i = (r + q) % 2; /* the prompts' order swapped each round */
            double t0 = zo_now();
            st = tf_gen_prompt(&x[i].g, pp, lens, (int)batch, logits);
            ttft[i] = fmin(ttft[i], zo_now() - t0);
        }
        for (int k = 1; k < tokens && st == ZO_OK; k++, n++)
            for (int q = 0; q < 2 && st == ZO_OK; q++) {
                int i = (k + q) % 2; /* latent first on odd tokens, full first on even ones */
                double t0 = zo_now();
                st = tf_gen_next(&x[i].g, next, logits);
                tok[i][n] = zo_now() - t0;
            }
        for (int i = 0; i < 2 && st == ZO_OK; i++) {
            gpu_mem_stats ms;
            gpu_mem_get_stats(x[i].dev, &ms);
            kv[i] = x[i].g.m.kv_bytes;
            peak[i] = ms.high_water;
        }
        if (st != ZO_OK) fprintf(stderr, "bench_generate --mla: %s\n", zo_last_error());
        mla_close(&x[0]);
        mla_close(&x[1]);
        if (st != ZO_OK) goto out;
    }
    char b1[32], b2[32];
    double med[2];
    bench_header("bench_generate --mla", "DeepSeek-V2-Lite's attention (16 heads of 128 + 64, v 128, kv_lora_rank 512, "
                 "hidden 2048), %ld dense layers of MLP 1408, vocab 4096, random bf16 weights resident, CPU backend, "
                 "%ld sequence(s), a prompt of %ld and %ld new tokens, %ld thread(s), %ld rounds, the two caches' "
                 "tokens alternating", layers, batch, prompt, tokens, threads, rounds);
    for (int i = 0; i < 2; i++) {
        qsort(tok[i], (size_t)n, sizeof(double), cmp_double);
        med[i] = tok[i][n / 2];
        bench_row("%-7s cache %10s (%zu bytes)  device peak %10s  first token %.3f s  %8.2f tokens/s (median "
                  "token %.2f ms, best %.2f ms)", names[i], zo_format_bytes(kv[i], b1, sizeof b1), kv[i],
                  zo_format_bytes(peak[i], b2, sizeof b2), ttft[i], batch / med[i], 1e3 * med[i], 1e3 * tok[i][0]);
    }
    bench_row("full / latent cache bytes %.2f; device peak %.2f; latent / full prompt's forward speed %.2f "
              "(the best rounds' first tokens)", (double)kv[1] / (double)kv[0], (double)peak[1] / (double)peak[0],
              ttft[1] / ttft[0]);
    bench_result("latent / full tokens/s", med[1] / med[0]);
    rc = 0;
out:
    free(tok[0]);
    free(tok[1]);
    free(ids);
    free(logits);
    return rc;
}

int main(int argc, char **argv)
{
    long layers = 0, hidden = 1024, batch = 1, tokens = 0, rounds = 3, threads = 0, moe = 0, mla = 0, prompt = 0;
    const char *nvme_dir = "/tmp";
    static const struct option opts[] = {
        {"layers", required_argument, 0, 'L'}, {"hidden", required_argument, 0, 'H'},
        {"batch", required_argument, 0, 'b'},  {"tokens", required_argument, 0, 't'},
        {"rounds", required_argument, 0, 'r'}, {"threads", required_argument, 0, 'T'},
        {"nvme-dir", required_argument, 0, 'n'}, {"moe", no_argument, 0, 'm'},
        {"mla", no_argument, 0, 'M'},          {"prompt", required_argument, 0, 'p'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        zo_status st = ZO_OK;
        switch (o) {
        case 'L': st = zo_parse_int(optarg, "--layers", 1, 256, &layers); break;
        case 'H': st = zo_parse_int(optarg, "--hidden", 64, 8192, &hidden); break;
        case 'b': st = zo_parse_int(optarg, "--batch", 1, 64, &batch); break;
        case 't': st = zo_parse_int(optarg, "--tokens", 2, 4096, &tokens); break;
        case 'r': st = zo_parse_int(optarg, "--rounds", 1, 100, &rounds); break;
        case 'T': st = zo_parse_int(optarg, "--threads", 1, 1024, &threads); break;
        case 'n': nvme_dir = optarg; break;
        case 'm': moe = 1; break;
        case 'M': mla = 1; break;
        case 'p': st = zo_parse_int(optarg, "--prompt", 1, 8192, &prompt); break;
        case 'h':
            printf("usage: bench_generate [--layers N] [--hidden N] [--batch N] [--tokens N] [--rounds N]\n"
                   "                      [--threads N] [--nvme-dir DIR] [--moe]\n"
                   "       bench_generate --mla [--layers N] [--batch N] [--prompt N] [--tokens N] [--rounds N]\n"
                   "defaults: a LLaMA of 8 layers x 1024 (ffn 8/3 h, vocab 4096), bf16, 1 sequence, a prompt of\n"
                   "16 and 32 new tokens, 3 rounds, every core, /tmp; --moe: a Mixtral of that shape, 8 experts\n"
                   "of ffn h, 2 a token (from host its routed experts stream apart); --mla: DeepSeek-V2's latent\n"
                   "cache against its full one, a V2-Lite-like model of --layers (default 2) dense layers, a\n"
                   "prompt of 512 and 64 new tokens by default\n");
            return 0;
        default: return 2;
        }
        if (st != ZO_OK) {
            fprintf(stderr, "bench_generate: %s\n", zo_last_error());
            return 2;
        }
    }
    if (!threads) threads = sysconf(_SC_NPROCESSORS_ONLN);
    if (!layers) layers = mla ? 2 : 8;
    if (!tokens) tokens = mla ? 64 : 32;
    if (mla) return run_mla(layers, batch, prompt ? prompt : 512, tokens, rounds, threads);
    if (prompt) {
        fprintf(stderr, "bench_generate: --prompt is --mla's (the placements' prompt is 16)\n");
        return 2;
    }
    gen_time_case c = {.batch = (int)batch, .prompt = 16, .new_tokens = (int)tokens, .dtype = ZO_DTYPE_BF16,
                       .prefetch = 2};
    if (zo_model_preset_find("llama-2-7b", &c.m) != ZO_OK) return 1;
    c.m.n_layers = (int)layers;
    c.m.hidden = (int)hidden;
    c.m.n_heads = c.m.n_kv_heads = (int)(hidden / 128);
    c.m.head_dim = 0;
    c.m.ffn = (int)(hidden * 8 / 3 / 64 * 64);
    c.m.vocab = 4096;
    if (moe) { /* a Mixtral of the same attention, 8 experts of ffn h in place of the MLP */
        char json[512];
        snprintf(json, sizeof json,
                 "{\"model_type\": \"mixtral\", \"num_hidden_layers\": %ld, \"hidden_size\": %ld, "
                 "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"intermediate_size\": %ld, "
                 "\"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"vocab_size\": %d, "
                 "\"max_position_embeddings\": 4096}",
                 layers, hidden, c.m.n_heads, c.m.n_kv_heads, hidden, c.m.vocab);
        if (zo_model_config_parse(json, "bench_generate --moe", &c.m) != ZO_OK) {
            fprintf(stderr, "bench_generate: %s\n", zo_last_error());
            return 1;
        }
    }
    if (zo_model_config_validate(&c.m) != ZO_OK) return 1;
    enum { NP = 3 };
    const zo_plan_tier tiers[NP] = {ZO_PLAN_GPU, ZO_PLAN_CPU, ZO_PLAN_NVME};
    const char *names[NP] = {"resident", "streamed from host", "read from NVMe"};
    double got[NP], ttft[NP];
    for (int i = 0; i < NP; i++) got[i] = ttft[i] = 1e30;
    /* the machine measured in every round beside the runs: the best of each,
     * the NVMe read rate sustained over them all */
    gen_time_machine best = {.token_s = 1e30, .prompt_s = 1e30};
    for (int r = 0; r < rounds; r++) {
        gen_time_machine mr;
        c.params_on = ZO_PLAN_GPU;
        if (gen_time_measure_machine(&c, (int)threads, nvme_dir, &mr) != ZO_OK) {
            fprintf(stderr, "bench_generate: calibrate: %s\n", zo_last_error());
            return 1;
        }
        if (!r)
            best = mr;
        else
            gen_time_best(&best, &mr);
        for (int i = 0; i < NP; i++) {
            c.params_on = tiers[i];
            double sp, t;
            if (gen_time_measure(&c, (int)threads, nvme_dir, &sp, &t) != ZO_OK) {
                fprintf(stderr, "bench_generate: %s: %s\n", names[i], zo_last_error());
                return 1;
            }
            got[i] = sp < got[i] ? sp : got[i];
            ttft[i] = t < ttft[i] ? t : ttft[i];
        }
    }
    plan_hw hw;
    if (gen_time_hw(&c, &best, &hw) != ZO_OK) {
        fprintf(stderr, "bench_generate: %s\n", zo_last_error());
        return 1;
    }
    char b[32];
    bench_header("bench_generate", "%s %ld x %ld (heads of 128, ffn %d, vocab %d), %s weights, bf16, %ld "
                 "sequence(s), a prompt of %d and %ld new tokens, prefetch %d, %ld thread(s), best of %ld rounds; "
                 "the CPU backend as the planner sees it: peak %.3g FLOP/s and memory %.3g B/s (fitted to its "
                 "forward outside the runtime: a token %.4f s, the prompt %.4f s), memcpy %.3g B/s, NVMe reads "
                 "%.3g B/s (%.3g B/s beside compute)", moe ? "Mixtral (8 experts, 2 a token)" : "LLaMA", layers, hidden, c.m.ffn, c.m.vocab, zo_format_bytes(zo_model_params(&c.m) * 2, b, sizeof b),
                 batch, c.prompt, tokens, c.prefetch, threads, rounds, hw.peak_flops_16, hw.hbm_bw, best.token_s,
                 best.prompt_s, hw.pcie_bw, hw.nvme_read_bw, hw.nvme_read_bw_busy);
    double worst = 0;
    for (int i = 0; i < NP; i++) {
        c.params_on = tiers[i];
        plan_gen_estimate e;
        if (gen_time_predict(&c, &hw, &e) != ZO_OK) {
            fprintf(stderr, "bench_generate: %s\n", zo_last_error());
            return 1;
        }
        double ratio = e.s_per_token / got[i]; /* measured tokens/s over predicted */
        worst = fabs(ratio - 1) > worst ? fabs(ratio - 1) : worst;
        bench_row("%-20s measured %8.2f tokens/s  predicted %8.2f tokens/s (bound: %-7s)  ratio %.3f  "
                  "first token %.3f s (predicted %.3f s)", names[i], c.batch / got[i], e.tokens_per_s, e.bound, ratio,
                  ttft[i], e.ttft_s);
    }
    for (int i = 1; i < NP; i++)
        bench_row("%-20s %.3f of the resident weights' tokens/s", names[i], got[0] / got[i]);
    bench_result("largest |measured / predicted - 1| of tokens/s", worst);
    return 0;
}
