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
 * largest |measured / predicted - 1|. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench/bench.h"             /* defines: bench_header, bench_row, bench_result */
#include "common/units.h"            /* defines: zo_parse_int, zo_format_bytes */
#include "bench/gen_time.h"          /* defines: gen_time_machine, gen_time_measure, gen_time_predict */

int main(int argc, char **argv)
{
    long layers = 8, hidden = 1024, batch = 1, tokens = 32, rounds = 3, threads = 0, moe = 0;
    const char *nvme_dir = "/tmp";
    static const struct option opts[] = {
        {"layers", required_argument, 0, 'L'}, {"hidden", required_argument, 0, 'H'},
        {"batch", required_argument, 0, 'b'},  {"tokens", required_argument, 0, 't'},
        {"rounds", required_argument, 0, 'r'}, {"threads", required_argument, 0, 'T'},
        {"nvme-dir", required_argument, 0, 'n'}, {"moe", no_argument, 0, 'm'},
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
        case 'h':
            printf("usage: bench_generate [--layers N] [--hidden N] [--batch N] [--tokens N] [--rounds N]\n"
                   "                      [--threads N] [--nvme-dir DIR] [--moe]\n"
                   "defaults: a LLaMA of 8 layers x 1024 (ffn 8/3 h, vocab 4096), bf16, 1 sequence, a prompt of\n"
                   "16 and 32 new tokens, 3 rounds, every core, /tmp; --moe: a Mixtral of that shape, 8 experts\n"
                   "of ffn h, 2 a token (from host its routed experts stream apart)\n");
            return 0;
        default: return 2;
        }
        if (st != ZO_OK) {
            fprintf(stderr, "bench_generate: %s\n", zo_last_error());
            return 2;
        }
    }
    if (!threads) threads = sysconf(_SC_NPROCESSORS_ONLN);
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
