/* generate: the sampler (examples/generate/sample.c) against the
 * probabilities Hugging Face's warpers give, computed here in double from
 * their definitions; the program's flags and errors; its text streamed
 * token by token against the tokenizer's decode of the ids it prints.
 * tokenize --decode: text through --print and back, a token file, errors.
 * The config.json a saved preset gets (model/hf.h) reads back to the
 * preset's shape. (generate's tokens against PyTorch:
 * tests/test_generate_torch.py; saved folders: tests/test_e2e_torch.py.) */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/fileio.h"             /* defines: zo_file_write_json */
#include "examples/generate/sample.h" /* defines: gen_sampler, gen_sample */
#include "model/hf.h"                 /* defines: model_hf_config */
#include "model/tokenizer.h"          /* defines: model_tokenizer_decode */
#include "tests/support/files.h"      /* defines: files_write_text */
#include "tests/support/run.h"        /* defines: run_program */

/* ---- the sampler --------------------------------------------------------------------- */
#include "tests/support/scratch.h" /* defines: scratch_path */

/* The probability of each token after temperature, top-k and top-p, as
 * Hugging Face's TemperatureLogitsWarper, TopKLogitsWarper (every token
 * scoring below the k-th largest removed) and TopPLogitsWarper (sorted
 * ascending, the tokens whose cumulative probability is <= 1 - p removed,
 * the most likely kept) define them, in double. */
static void reference(const float *logits, int V, double temp, int top_k, double top_p, double *prob)
{
    double *s = malloc(V * sizeof *s), *sorted = malloc(V * sizeof *sorted);
    for (int i = 0; i < V; i++) s[i] = logits[i] / temp;
    if (top_k > 0 && top_k < V) {
        for (int i = 0; i < V; i++) sorted[i] = s[i];
        for (int i = 0; i < V; i++) /* descending, by selection */
            for (int j = i + 1; j < V; j++)
                if (sorted[j] > sorted[i]) {
                    double t = sorted[i];
                    sorted[i] = sorted[j];
                    sorted[j] = t;
                }
        for (int i = 0; i < V; i++)
            if (s[i] < sorted[top_k - 1]) s[i] = -INFINITY;
    }
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < V; i++) mx = s[i] > mx ? s[i] : mx;
    for (int i = 0; i < V; i++) z += (prob[i] = exp(s[i] - mx));
    for (int i = 0; i < V; i++) prob[i] /= z;
    if (top_p < 1.0) {
        /* ascending by probability; ties in the order of decreasing id (the
         * most likely of equals is the lowest id, as the sampler keeps it) */
        int *ord = malloc(V * sizeof *ord);
        for (int i = 0; i < V; i++) ord[i] = i;
        for (int i = 0; i < V; i++)
            for (int j = i + 1; j < V; j++) {
                int a = ord[i], b = ord[j];
                if (prob[b] < prob[a] || (prob[b] == prob[a] && b > a)) ord[i] = b, ord[j] = a;
            }
        double cum = 0;
        for (int r = 0; r < V - 1; r++) {
            cum += prob[ord[r]];
            if (cum <= 1.0 - top_p) prob[ord[r]] = 0;
        }
        free(ord);
        z = 0;
        for (int i = 0; i < V; i++) z += prob[i];
        for (int i = 0; i < V; i++) prob[i] /= z;
    }
    free(s);
    free(sorted);
}

/* n draws from the sampler: each token's frequency within 5 standard
 * deviations of the reference's probability (and never a token it gives 0). */
static void check_draws(const float *logits, int V, double temp, int top_k, double top_p)
{
    gen_sampler smp;
    assert_int_equal(gen_sampler_init(&smp, V, temp, top_k, top_p, 99), 0);
    double *want = calloc(V, sizeof *want);
    long *count = calloc(V, sizeof *count);
    reference(logits, V, temp, top_k, top_p, want);
    const long n = 200000;
    for (long k = 0; k < n; k++) {
        int32_t t = gen_sample(&smp, logits);
        assert_true(t >= 0 && t < V);
        count[t]++;
    }
    for (int i = 0; i < V; i++) {
        double f = (double)count[i] / n, sd = sqrt(want[i] * (1 - want[i]) / n);
        if (want[i] == 0) assert_int_equal(count[i], 0);
        if (fabs(f - want[i]) > 5 * sd + 1e-9) {
            printf("  T %g top-k %d top-p %g: token %d drawn %.5f of the time, reference %.5f\n", temp, top_k, top_p,
                   i, f, want[i]);
            fail();
        }
    }
    free(want);
    free(count);
    gen_sampler_free(&smp);
}

static void test_sampler(void **state)
{
    (void)state;
    /* ties at the k-th score and at the top-p boundary; a token far below */
    const float logits[8] = {1.0f, 2.5f, 2.0f, 2.0f, -1.0f, 0.5f, 2.5f, -9.0f};
    gen_sampler g;
    assert_int_equal(gen_sampler_init(&g, 8, 0.0, 0, 1.0, 1), 0);
    assert_int_equal(gen_sample(&g, logits), 1); /* greedy: the first of the largest */
    gen_sampler_free(&g);
    check_draws(logits, 8, 1.0, 0, 1.0);
    check_draws(logits, 8, 0.7, 0, 1.0);
    check_draws(logits, 8, 1.3, 3, 1.0); /* the k-th is tied: both 2.0s stay */
    check_draws(logits, 8, 1.0, 2, 1.0);
    check_draws(logits, 8, 1.0, 0, 0.5);
    check_draws(logits, 8, 0.9, 0, 0.9);
    check_draws(logits, 8, 1.0, 4, 0.8);
    /* the same seed, the same tokens */
    gen_sampler a, b;
    assert_int_equal(gen_sampler_init(&a, 8, 1.0, 0, 1.0, 5), 0);
    assert_int_equal(gen_sampler_init(&b, 8, 1.0, 0, 1.0, 5), 0);
    for (int k = 0; k < 100; k++) assert_int_equal(gen_sample(&a, logits), gen_sample(&b, logits));
    gen_sampler_free(&a);
    gen_sampler_free(&b);
}

/* ---- the program ----------------------------------------------------------------------- */

static char dir[64], cfg[128];

static int setup(void **state)
{
    (void)state;
    scratch_path(dir, sizeof dir, "zo_test_generate_%d", (int)getpid());
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    if (system(cmd)) return -1;
    /* a tiny GPT-2 over the byte-level test tokenizer's 1024 ids */
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *f = fopen(cfg, "w");
    if (!f) return -1;
    fprintf(f, "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 2, \"n_positions\": 64,"
               " \"vocab_size\": 1024, \"eos_token_id\": 1023}\n");
    fclose(f);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) ? -1 : 0;
}

static int gen(const char *args, char *out, size_t len)
{
    return run_program(ZO_GENERATE_BIN, args, out, len);
}

/* stdout alone */
static int gen_out(const char *args, char *out, size_t len)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", ZO_GENERATE_BIN, args);
    return run_capture(cmd, out, len);
}

static void expect(const char *args, int code, const char *text)
{
    char out[8192];
    int rc = gen(args, out, sizeof out);
    if (rc != code || !strstr(out, text)) {
        printf("  generate %s: exit %d (expected %d), output:\n%s\n  (expected to contain \"%s\")\n", args, rc, code,
               out, text);
        fail();
    }
}

static void test_flags(void **state)
{
    (void)state;
    char a[1024];
    expect("--help", 0, "--max-new-tokens N");
    expect("--help", 0, "--mla-cache latent|full");
    expect("-h", 0, "--max-new-tokens N");
    expect("--version", 0, "generate (zoffload) "); /* issue 27: --version in every program */
    expect("--prompt-ids 1", 2, "--model is required");
    snprintf(a, sizeof a, "--model %s", cfg);
    expect(a, 2, "a prompt is required");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1,2,2000", cfg);
    expect(a, 2, "--prompt-ids 1,2,2000: '2000' is not a token id below the vocabulary's 1024");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1,x", cfg);
    expect(a, 2, "'x' is not a token id");
    snprintf(a, sizeof a, "--model %s --prompt hello", cfg);
    expect(a, 2, "--prompt needs the model's tokenizer.json");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --top-k 5", cfg);
    expect(a, 2, "give --temperature T > 0");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --temperature -1", cfg);
    expect(a, 2, "--temperature");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --top-p 0", cfg);
    expect(a, 2, "--top-p 0: must be in (0, 1]");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --max-new-tokens 100", cfg);
    expect(a, 2, "past the 64 learned positions");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --weights %s/missing.safetensors", cfg, dir);
    expect(a, 2, "missing.safetensors");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --tokenizer %s/none.json", cfg, dir);
    expect(a, 2, "none.json");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --adapter %s", cfg, dir);
    expect(a, 2, "adapter_config.json");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --params-on disk", cfg);
    expect(a, 2, "--params-on: 'disk' is not one of gpu, cpu, nvme");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --params-on nvme", cfg);
    expect(a, 2, "--nvme-dir");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --qlora", cfg);
    expect(a, 2, "--qlora needs --adapter DIR");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --device-mem 64KiB", cfg);
    expect(a, 1, "capacity");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --mla-cache half", cfg);
    expect(a, 2, "--mla-cache half: expected latent or full");
    snprintf(a, sizeof a, "--model %s --prompt-ids 1 --bogus", cfg);
    expect(a, 2, "unknown option --bogus");
}

/* Mixtures of experts generate (issue 31: tf_init refused a key/value cache
 * on them): a tiny Mixtral and a Qwen2-MoE with random weights, their ids
 * the same with the weights resident, streamed from host (the routed
 * experts apart from their layer, named on stderr) and read from NVMe
 * (whole layers). Their tokens against PyTorch: test_generate_torch. */
static void test_moe(void **state)
{
    (void)state;
    static const char *const configs[] = {
        "{\"model_type\": \"mixtral\", \"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 2,"
        " \"num_key_value_heads\": 1, \"intermediate_size\": 32, \"num_local_experts\": 4, \"num_experts_per_tok\": 2,"
        " \"vocab_size\": 256, \"max_position_embeddings\": 64, \"eos_token_id\": 255}",
        "{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 2,"
        " \"num_key_value_heads\": 1, \"intermediate_size\": 48, \"moe_intermediate_size\": 16,"
        " \"shared_expert_intermediate_size\": 32, \"num_experts\": 6, \"num_experts_per_tok\": 3,"
        " \"norm_topk_prob\": false, \"vocab_size\": 256, \"max_position_embeddings\": 64, \"eos_token_id\": 255}",
    };
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        char mcfg[128], a[1024], want[4096], got[4096], err[8192];
        snprintf(mcfg, sizeof mcfg, "%s/moe%zu.json", dir, i);
        files_write_text(mcfg, configs[i]);
        const char *base = "--prompt-ids 1,2,3 --prompt-ids 4,5 --max-new-tokens 6 --eos none --print-ids --seed 3";
        snprintf(a, sizeof a, "--model %s %s --params-on gpu", mcfg, base);
        assert_int_equal(gen_out(a, want, sizeof want), 0);
        assert_int_equal(strlen(want) > 8, 1);
        snprintf(a, sizeof a, "--model %s %s --params-on cpu --prefetch 1", mcfg, base);
        assert_int_equal(gen_out(a, got, sizeof got), 0);
        assert_string_equal(got, want);
        assert_int_equal(gen(a, err, sizeof err), 0);
        assert_non_null(strstr(err, "# experts streamed apart: 2 slots of"));
        snprintf(a, sizeof a, "--model %s %s --params-on nvme --nvme-dir %s", mcfg, base, dir);
        assert_int_equal(gen_out(a, got, sizeof got), 0);
        assert_string_equal(got, want);
        assert_int_equal(gen(a, err, sizeof err), 0);
        assert_null(strstr(err, "experts streamed apart"));
    }
}

/* The text one prompt streams is the tokenizer's decode of the ids the same
 * run prints with --print-ids (a character cut between tokens waits); the
 * tokens stop at the config's end-of-sequence id or the count; a seed gives
 * the same sample. */
static void test_text(void **state)
{
    (void)state;
    char a[1024], ids[8192], text[8192], again[8192];
    const char *tok = ZO_FIXTURES_DIR "/tokenizer/small-bpe.json";
    snprintf(a, sizeof a, "--model %s --tokenizer %s --prompt 'The cat sat' --temperature 1 --seed 7 "
                          "--max-new-tokens 40 --dtype fp32 --print-ids", cfg, tok);
    assert_int_equal(gen_out(a, ids, sizeof ids), 0);
    snprintf(a, sizeof a, "--model %s --tokenizer %s --prompt 'The cat sat' --temperature 1 --seed 7 "
                          "--max-new-tokens 40 --dtype fp32", cfg, tok);
    assert_int_equal(gen_out(a, text, sizeof text), 0);
    assert_int_equal(gen_out(a, again, sizeof again), 0);
    assert_string_equal(text, again);
    int32_t v[64];
    size_t n = 0;
    for (char *p = ids; *p && n < 64;) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p) break;
        v[n++] = (int32_t)x;
        p = end;
    }
    assert_true(n >= 1 && n <= 40);
    assert_true(n == 40 || v[n - 1] == 1023); /* the count, or the end of sequence */
    model_tokenizer *t;
    assert_int_equal(model_tokenizer_load(tok, &t), 0);
    char *dec;
    size_t len;
    assert_int_equal(model_tokenizer_decode(t, v, n, MODEL_TOK_SKIP_SPECIAL, &dec, &len), 0);
    assert_int_equal(strlen(text), len + 1);
    assert_memory_equal(text, dec, len);
    assert_int_equal(text[len], '\n');
    free(dec);
    model_tokenizer_free(t);
    /* another seed, other tokens */
    snprintf(a, sizeof a, "--model %s --tokenizer %s --prompt 'The cat sat' --temperature 1 --seed 8 "
                          "--max-new-tokens 40 --dtype fp32 --print-ids", cfg, tok);
    assert_int_equal(gen_out(a, again, sizeof again), 0);
    assert_string_not_equal(ids, again);
    /* several prompts: each one's text under its own header, and the report */
    snprintf(a, sizeof a, "--model %s --tokenizer %s --prompt 'The cat' --prompt 'A dog ran' --max-new-tokens 5", cfg,
             tok);
    assert_int_equal(gen(a, text, sizeof text), 0);
    assert_non_null(strstr(text, "==> sequence 1 <=="));
    assert_non_null(strstr(text, "==> sequence 2 <=="));
    assert_non_null(strstr(text, "time to first token"));
    assert_non_null(strstr(text, "tokens/s"));
    assert_non_null(strstr(text, "# peak bytes per tier: gpu"));
    assert_non_null(strstr(text, "= total"));
}

/* tokenize --decode: the ids --print makes of a text decode to the text;
 * a token file decodes to its documents and end-of-text tokens (left out
 * with --skip-special); a bad id is named with its line. */
static void test_decode(void **state)
{
    (void)state;
    char txt[128], bin[128], cmd[2048], out[8192];
    const char *tok = ZO_FIXTURES_DIR "/tokenizer/small-bpe.json";
    snprintf(txt, sizeof txt, "%s/doc.txt", dir);
    snprintf(bin, sizeof bin, "%s/doc.bin", dir);
    FILE *f = fopen(txt, "w");
    assert_non_null(f);
    fputs("Caf\xc3\xa9 au lait, na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xe2\x80\x94 200 tokens!", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s --tokenizer %s --print %s | %s --tokenizer %s --decode --skip-special", ZO_TOKENIZE_BIN,
             tok, txt, ZO_TOKENIZE_BIN, tok);
    assert_int_equal(run_capture(cmd, out, sizeof out), 0);
    assert_string_equal(out, "Caf\xc3\xa9 au lait, na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xe2\x80\x94 200 tokens!\n");
    snprintf(cmd, sizeof cmd, "%s --tokenizer %s --out %s %s %s >/dev/null && %s --tokenizer %s --decode %s",
             ZO_TOKENIZE_BIN, tok, bin, txt, txt, ZO_TOKENIZE_BIN, tok, bin);
    assert_int_equal(run_capture(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "200 tokens!<|endoftext|>Caf\xc3\xa9"));
    snprintf(cmd, sizeof cmd, "echo '1 2 99999' | %s --tokenizer %s --decode 2>&1", ZO_TOKENIZE_BIN, tok);
    assert_int_equal(run_capture(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "stdin:1:"));
    assert_non_null(strstr(out, "99999"));
}

/* A preset saved has a config.json of its family's keys: read back, the
 * same shape. */
static void test_preset_config(void **state)
{
    (void)state;
    const char *presets[] = {"gpt2", "llama-2-7b", "llama-3-8b", "mistral-7b"};
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        zo_model_config want, got;
        assert_int_equal(zo_model_preset_find(presets[i], &want), 0);
        cJSON *doc;
        assert_int_equal(model_hf_config(&want, ZO_DTYPE_BF16, &doc), 0);
        char path[128];
        snprintf(path, sizeof path, "%s/config-%zu.json", dir, i);
        assert_int_equal(zo_file_write_json(path, doc), 0);
        cJSON_Delete(doc);
        assert_int_equal(zo_model_config_load(path, &got), 0);
        assert_int_equal(zo_model_params(&got), zo_model_params(&want));
        assert_int_equal(got.arch, want.arch);
        assert_int_equal(got.n_kv_heads, want.n_kv_heads);
        assert_int_equal(got.max_seq, want.max_seq);
        assert_int_equal(got.tied_embeddings, want.tied_embeddings);
        assert_int_equal(got.sliding_window, want.sliding_window);
        assert_true(got.rope_theta == want.rope_theta && got.norm_eps == want.norm_eps);
        assert_string_equal(got.rope_scaling, want.rope_scaling);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampler),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_preset_config),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
