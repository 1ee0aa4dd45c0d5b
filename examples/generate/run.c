/* generate's run (run.h): its inputs, the set-up, a token at a time, what it
 * prints, and the end. */
#include "examples/generate/run.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/clock.h"       /* defines: zo_now */
#include "common/fileio.h"      /* defines: zo_file_read_all, zo_file_write_json */
#include "common/json.h"        /* defines: zo_json_parse */
#include "common/plan_schema.h" /* defines: zo_plan_check_run */
#include "common/units.h"       /* defines: zo_format_bytes, zo_parse_int */
#include "model/lora.h"         /* defines: model_lora_read_config */

/* ---- the inputs -------------------------------------------------------------------------- */

static int is_dir(const char *p)
{
    struct stat sb;
    return p && stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* --model: a config.json, a folder holding one, or a preset. */
static zo_status read_config(gen_run *r, const char *arg)
{
    char path[4200];
    if (is_dir(arg)) {
        snprintf(r->model_dir, sizeof r->model_dir, "%s", arg);
        snprintf(path, sizeof path, "%s/config.json", arg);
        if (!exists(path)) return zo_error(ZO_ERR_NOT_FOUND, "--model %s: a folder with no config.json", arg);
        return zo_model_config_load(path, &r->cfg);
    }
    if (exists(arg)) return zo_model_config_load(arg, &r->cfg);
    if (strchr(arg, '/') || strstr(arg, ".json")) return zo_error(ZO_ERR_NOT_FOUND, "--model %s: %s", arg, strerror(errno));
    zo_status st = zo_model_preset_find(arg, &r->cfg);
    return st == ZO_OK ? ZO_OK : zo_error_wrap(st, "--model");
}

/* A folder's file `name` into out when it is there. */
static int in_folder(const char *dir, const char *name, char *out, size_t len)
{
    if (!dir || !is_dir(dir)) return 0;
    snprintf(out, len, "%s/%s", dir, name);
    return exists(out);
}

/* The weights: --weights, else the model folder's (model.safetensors or its
 * index), else none (random from --seed). The tokenizer: --tokenizer, else
 * the model folder's or the weights folder's tokenizer.json. */
static zo_status find_files(gen_run *r)
{
    const gen_args *a = r->a;
    char p[4200];
    r->weights = a->weights;
    if (!r->weights && (in_folder(r->model_dir, "model.safetensors", p, sizeof p) ||
                        in_folder(r->model_dir, "model.safetensors.index.json", p, sizeof p)))
        r->weights = r->model_dir;
    if (a->tokenizer) snprintf(r->tok_path, sizeof r->tok_path, "%s", a->tokenizer);
    else if (!in_folder(r->model_dir, "tokenizer.json", r->tok_path, sizeof r->tok_path) &&
             !in_folder(r->weights, "tokenizer.json", r->tok_path, sizeof r->tok_path))
        r->tok_path[0] = 0;
    if (!r->tok_path[0]) return ZO_OK;
    zo_status st = model_tokenizer_load(r->tok_path, &r->tok);
    if (st != ZO_OK) return st;
    if (model_tokenizer_vocab(r->tok) > r->cfg.vocab)
        return zo_error(ZO_ERR_INVALID, "--tokenizer %s has %d ids, more than the model's vocabulary of %d",
                        r->tok_path, model_tokenizer_vocab(r->tok), r->cfg.vocab);
    return ZO_OK;
}

/* The end-of-sequence ids: --eos, else config.json's eos_token_id (a number
 * or a list), else the tokenizer's end-of-text. */
static zo_status find_eos(gen_run *r)
{
    const gen_args *a = r->a;
    r->n_eos = 0;
    if (a->eos) {
        if (!strcmp(a->eos, "none")) return ZO_OK;
        long v;
        zo_status st = zo_parse_int(a->eos, "--eos", 0, r->cfg.vocab - 1, &v);
        if (st != ZO_OK) return st;
        r->eos[r->n_eos++] = (int32_t)v;
        return ZO_OK;
    }
    char path[4200];
    const char *cfg_file = r->model_dir[0] ? (snprintf(path, sizeof path, "%s/config.json", r->model_dir), path)
                           : exists(a->model)  ? a->model
                                               : NULL;
    char *text = NULL;
    size_t len = 0;
    cJSON *doc = NULL;
    if (cfg_file && zo_file_read_all(cfg_file, 16u << 20, "--model", &text, &len) == ZO_OK &&
        zo_json_parse(text, len, cfg_file, &doc) == ZO_OK) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(doc, "eos_token_id"), *x;
        if (cJSON_IsNumber(e) && e->valueint >= 0 && e->valueint < r->cfg.vocab) r->eos[r->n_eos++] = e->valueint;
        if (cJSON_IsArray(e))
            cJSON_ArrayForEach(x, e) if (cJSON_IsNumber(x) && x->valueint >= 0 && x->valueint < r->cfg.vocab &&
                                         r->n_eos < GEN_MAX_EOS) r->eos[r->n_eos++] = x->valueint;
    }
    cJSON_Delete(doc);
    free(text);
    if (!r->n_eos && r->tok && model_tokenizer_eot(r->tok) >= 0) r->eos[r->n_eos++] = model_tokenizer_eot(r->tok);
    return ZO_OK;
}

/* "1,2,3" into ids below the vocabulary. */
static zo_status parse_ids(const char *s, int vocab, model_ids *out)
{
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= vocab)
            return zo_error(ZO_ERR_INVALID, "--prompt-ids %s: '%.*s' is not a token id below the vocabulary's %d", s,
                            (int)strcspn(p, ","), p, vocab);
        zo_status st = model_ids_push(out, (int32_t)v);
        if (st != ZO_OK) return st;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return zo_error(ZO_ERR_INVALID, "--prompt-ids %s: ids are separated by commas", s);
    }
    if (!out->n) return zo_error(ZO_ERR_INVALID, "--prompt-ids '%s': no ids", s);
    return ZO_OK;
}

/* Every prompt's ids, in the order given. */
static zo_status read_prompts(gen_run *r)
{
    const gen_args *a = r->a;
    zo_status st = ZO_OK;
    model_tok_ctx *ctx = NULL;
    r->n = a->n_prompts;
    if (!(r->prompts = calloc((size_t)r->n, sizeof *r->prompts)))
        return zo_error(ZO_ERR_NOMEM, "generate: out of host memory");
    for (int j = 0; j < r->n && st == ZO_OK; j++) {
        if (a->prompt_is_ids[j]) {
            st = parse_ids(a->prompt[j], r->cfg.vocab, &r->prompts[j]);
            continue;
        }
        if (!r->tok) {
            st = zo_error(ZO_ERR_INVALID, "--prompt needs the model's tokenizer.json: give --tokenizer FILE (or "
                          "--prompt-ids)");
            break;
        }
        if (!ctx && (st = model_tok_ctx_new(r->tok, &ctx)) != ZO_OK) break;
        st = model_tokenizer_encode(ctx, a->prompt[j], strlen(a->prompt[j]), MODEL_TOK_ADD_SPECIAL, &r->prompts[j]);
        if (st == ZO_OK && !r->prompts[j].n)
            st = zo_error(ZO_ERR_INVALID, "--prompt '%s': the tokenizer makes no tokens of it", a->prompt[j]);
        if (st != ZO_OK) st = zo_error_wrap(st, "--prompt %d", j + 1);
    }
    model_tok_ctx_free(ctx);
    return st;
}

/* The adapter's r, alpha and targets, checked against the plan's method. */
static zo_status read_adapter(gen_run *r)
{
    const gen_args *a = r->a;
    const zo_plan_training *pt = &a->p.file.training;
    if (a->plan && pt->method != ZO_PLAN_FULL && !a->adapter)
        return zo_error(ZO_ERR_INVALID, "--plan %s plans %s adapters: give --adapter DIR", a->plan,
                        zo_plan_method_name(pt->method));
    if (!a->adapter) return ZO_OK;
    zo_lora_config lc;
    zo_status st = model_lora_read_config(a->adapter, &r->cfg, &lc, NULL, 0);
    if (st != ZO_OK) return zo_error_wrap(st, "--adapter");
    if (a->plan && (pt->method == ZO_PLAN_FULL || (pt->method == ZO_PLAN_QLORA) != a->qlora || pt->lora.r != lc.r ||
                    pt->lora.targets != lc.targets))
        return zo_error(ZO_ERR_INVALID, "--plan %s plans %s%s, not the adapter %s (r %d%s)", a->plan,
                        zo_plan_method_name(pt->method), pt->method == ZO_PLAN_FULL ? " generation" : " adapters",
                        a->adapter, lc.r, a->qlora ? ", QLoRA" : "");
    r->lora = (tf_lora_options){.r = lc.r, .alpha = lc.alpha, .targets = lc.targets, .nf4 = a->qlora};
    return ZO_OK;
}

/* The model's buffers: a plan's batch and context (its prompt buffers the
 * whole context), else the prompts' and --max-new-tokens'. */
static zo_status sizes(gen_run *r)
{
    const gen_args *a = r->a;
    int longest = 0;
    for (int j = 0; j < r->n; j++)
        if ((int)r->prompts[j].n > longest) longest = (int)r->prompts[j].n;
    long need = longest + a->max_new_tokens;
    r->batch = r->n;
    r->ctx = (int)need;
    r->prompt_max = longest;
    if (a->plan) {
        r->batch = a->p.micro_batch;
        r->ctx = r->prompt_max = a->p.seq;
        if (r->n > r->batch)
            return zo_error(ZO_ERR_INVALID, "--plan %s plans %d sequences at once: %d prompts", a->plan, r->batch, r->n);
        if (need > r->ctx)
            return zo_error(ZO_ERR_INVALID, "--plan %s plans a context of %d: the longest prompt (%d tokens) and "
                            "--max-new-tokens %ld need %ld", a->plan, r->ctx, longest, a->max_new_tokens, need);
    }
    if (r->cfg.arch == ZO_ARCH_GPT && r->ctx > r->cfg.max_seq)
        return zo_error(ZO_ERR_INVALID, "--max-new-tokens %ld: the longest prompt (%d tokens) and the new tokens "
                        "need %d positions, past the %d learned positions of %s", a->max_new_tokens, longest, r->ctx,
                        r->cfg.max_seq, r->cfg.name);
    return ZO_OK;
}

zo_status gen_read_inputs(gen_run *r, gen_args *a)
{
    memset(r, 0, sizeof *r);
    r->a = a;
    r->phase = GEN_INPUT;
    zo_status st;
    if ((st = read_config(r, a->model)) != ZO_OK) return st;
    if (a->plan && (st = zo_plan_check_run(&a->p.file, &r->cfg, 1, a->plan)) != ZO_OK)
        return zo_error_wrap(st, "--plan");
    if ((st = find_files(r)) != ZO_OK || (st = find_eos(r)) != ZO_OK || (st = read_prompts(r)) != ZO_OK ||
        (st = read_adapter(r)) != ZO_OK)
        return st;
    return sizes(r);
}

/* ---- the set-up ---------------------------------------------------------------------------- */

/* --device with --device-mem as its capacity (a CUDA name says what is missing). */
static zo_status open_device(const gen_args *a, gpu_device_t *out)
{
    if (!strcmp(a->device, "cpu")) {
        gpu_cpu_options o = {.capacity = (size_t)a->device_mem, .n_threads = (int)a->threads};
        return gpu_device_init_cpu(&o, out);
    }
    zo_status st = gpu_device_open(a->device, (size_t)a->device_mem, out);
    if (st == ZO_ERR_NOT_FOUND && !gpu_cuda_device_count())
        return zo_error_wrap(st, "--device %s: no CUDA GPU found on this machine (use --device cpu)", a->device);
    return st == ZO_OK ? ZO_OK : zo_error_wrap(st, "--device %s (or use --device cpu)", a->device);
}

zo_status gen_setup(gen_run *r)
{
    gen_args *a = r->a;
    zo_status st;
    r->phase = GEN_SETUP;
    if ((st = open_device(a, &r->dev)) != ZO_OK) return st;
    tf_gen_config gc = {.batch = r->batch, .prompt_max = r->prompt_max, .ctx = r->ctx, .dtype = a->dtype,
                        .lora = r->lora, .mla_cache = a->mla_cache, .oc = a->p.cfg};
    if ((st = tf_gen_init(&r->g, &r->cfg, r->dev, &gc)) != ZO_OK) return st;
    r->out = calloc((size_t)r->n, sizeof *r->out);
    r->done = calloc((size_t)r->n, sizeof *r->done);
    r->logits = malloc((size_t)r->batch * r->cfg.vocab * sizeof *r->logits);
    if (!r->out || !r->done || !r->logits) return zo_error(ZO_ERR_NOMEM, "generate: out of host memory");
    if ((st = gen_sampler_init(&r->smp, r->cfg.vocab, a->temperature, (int)a->top_k, a->top_p, (uint64_t)a->seed)) !=
        ZO_OK)
        return st;
    /* the weights, block by block: what they hold is input */
    r->phase = GEN_INPUT;
    if ((st = tf_gen_load(&r->g, r->weights, (uint64_t)a->seed, a->adapter)) != ZO_OK) return st;
    offload_reset_times(r->g.rt); /* the report times the generation alone */
    r->phase = GEN_RUN;
    return ZO_OK;
}

void gen_report_start(const gen_run *r)
{
    const gen_args *a = r->a;
    const offload_config *oc = &a->p.cfg;
    char b1[32], b2[32], tg[128];
    gpu_mem_stats ms;
    gpu_mem_get_stats(r->dev, &ms);
    fprintf(stderr, "# generate: %s (%s), %llu parameters, %d layers, hidden %d, vocab %d; dtype %s; %d sequence(s) "
            "(buffers for %d x %d positions, prompts up to %d); device %s, %s in use of %s\n",
            r->cfg.name, zo_model_family_name(&r->cfg), (unsigned long long)zo_model_params(&r->cfg), r->cfg.n_layers,
            r->cfg.hidden, r->cfg.vocab, zo_dtype_name(a->dtype), r->n, r->batch, r->ctx, r->prompt_max,
            gpu_device_name(r->dev), zo_format_bytes(ms.in_use, b1, sizeof b1),
            ms.capacity ? zo_format_bytes(ms.capacity, b2, sizeof b2) : "unlimited");
    fprintf(stderr, "# weights: %s; placement: %s %s (prefetch %d)%s%s\n",
            r->weights ? r->weights : "random (--seed)", r->lora.r ? "base" : "weights",
            offload_tier_name(oc->params_on), oc->prefetch_depth, a->plan ? "; plan " : "", a->plan ? a->plan : "");
    if (r->cfg.mla.kv_rank) {
        int full = a->mla_cache == TF_MLA_CACHE_FULL;
        fprintf(stderr, "# cache: %s, %s (%s)\n", full ? "full" : "latent",
                zo_format_bytes(r->g.m.kv_bytes, b1, sizeof b1),
                full ? "every head's key and value" : "[k_pe | c_kv] a position, kv_b_proj absorbed");
    }
    if (r->lora.r)
        fprintf(stderr, "# adapters: %s, LoRA r %d alpha %g on %s%s, on %s\n", a->adapter, r->lora.r, r->lora.alpha,
                zo_lora_targets_str(r->lora.targets, tg, sizeof tg), r->lora.nf4 ? " over an NF4 base (QLoRA)" : "",
                offload_tier_name(oc->trainable_on));
    if (a->temperature > 0)
        fprintf(stderr, "# sampling: temperature %g, top-k %ld, top-p %g, seed %ld", a->temperature, a->top_k, a->top_p,
                a->seed);
    else
        fprintf(stderr, "# sampling: greedy");
    fprintf(stderr, "; at most %ld new tokens; end of sequence:", a->max_new_tokens);
    for (int e = 0; e < r->n_eos; e++) fprintf(stderr, " %d", r->eos[e]);
    fprintf(stderr, "%s; tokenizer %s\n", r->n_eos ? "" : " none", r->tok_path[0] ? r->tok_path : "none");
}

/* ---- a token at a time ----------------------------------------------------------------------- */

/* Bytes of buf[0..n) that end on a whole UTF-8 character (a character cut
 * by the last token waits for the next). */
static size_t utf8_whole(const char *buf, size_t n)
{
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)buf[i - 1] & 0xc0) == 0x80) i--, back++;
    if (i == 0) return n;
    unsigned char lead = (unsigned char)buf[i - 1];
    size_t want = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
    return back + 1 >= want ? n : i - 1;
}

/* One prompt's text as it comes: what is new since the last call. */
static zo_status stream_text(gen_run *r, int final)
{
    if (r->n != 1 || r->a->print_ids || !r->tok) return ZO_OK;
    char *text = NULL;
    size_t len = 0;
    zo_status st = model_tokenizer_decode(r->tok, r->out[0].v, r->out[0].n, MODEL_TOK_SKIP_SPECIAL, &text, &len);
    if (st != ZO_OK) return st;
    size_t upto = final ? len : utf8_whole(text, len);
    if (upto > r->printed) {
        fwrite(text + r->printed, 1, upto - r->printed, stdout);
        r->printed = upto;
    }
    if (final) fputc('\n', stdout);
    fflush(stdout);
    free(text);
    return ZO_OK;
}

static int is_eos(const gen_run *r, int32_t t)
{
    for (int e = 0; e < r->n_eos; e++)
        if (r->eos[e] == t) return 1;
    return 0;
}

/* Each sequence still going takes its next token from the logits. */
static zo_status take_tokens(gen_run *r)
{
    for (int j = 0; j < r->n; j++) {
        if (r->done[j]) continue;
        int32_t t = gen_sample(&r->smp, r->logits + (size_t)j * r->cfg.vocab);
        zo_status st = model_ids_push(&r->out[j], t);
        if (st != ZO_OK) return st;
        r->done[j] = is_eos(r, t) || (long)r->out[j].n >= r->a->max_new_tokens;
    }
    return stream_text(r, 0);
}

zo_status gen_first(gen_run *r)
{
    const int32_t **p = malloc((size_t)r->n * sizeof *p);
    int *lens = malloc((size_t)r->n * sizeof *lens);
    if (!p || !lens) {
        free(p);
        free(lens);
        return zo_error(ZO_ERR_NOMEM, "generate: out of host memory");
    }
    for (int j = 0; j < r->n; j++) {
        p[j] = r->prompts[j].v;
        lens[j] = (int)r->prompts[j].n;
    }
    r->t_start = zo_now();
    zo_status st = tf_gen_prompt(&r->g, p, lens, r->n, r->logits);
    free(p);
    free(lens);
    if (st == ZO_OK) st = take_tokens(r);
    r->t_first = r->t_end = zo_now();
    return st;
}

zo_status gen_next(gen_run *r, int *more)
{
    *more = 0;
    for (int j = 0; j < r->n; j++) *more |= !r->done[j];
    if (!*more) return ZO_OK;
    int32_t *next = malloc((size_t)r->n * sizeof *next);
    if (!next) return zo_error(ZO_ERR_NOMEM, "generate: out of host memory");
    /* every sequence goes on in the batch; those done are not read */
    for (int j = 0; j < r->n; j++) next[j] = r->out[j].v[r->out[j].n - 1];
    zo_status st = tf_gen_next(&r->g, next, r->logits);
    free(next);
    if (st == ZO_OK) st = take_tokens(r);
    r->t_end = zo_now();
    return st;
}

/* ---- the report and the end ------------------------------------------------------------------ */

/* Every sequence's ids, or (several) their texts, once done. */
static zo_status print_outputs(gen_run *r)
{
    if (r->a->print_ids || !r->tok) {
        for (int j = 0; j < r->n; j++) {
            for (size_t k = 0; k < r->out[j].n; k++) printf("%s%d", k ? " " : "", r->out[j].v[k]);
            printf("\n");
        }
        return ZO_OK;
    }
    if (r->n == 1) return stream_text(r, 1);
    for (int j = 0; j < r->n; j++) {
        char *text = NULL;
        size_t len = 0;
        zo_status st = model_tokenizer_decode(r->tok, r->out[j].v, r->out[j].n, MODEL_TOK_SKIP_SPECIAL, &text, &len);
        if (st != ZO_OK) return st;
        printf("==> sequence %d <==\n", j + 1);
        fwrite(text, 1, len, stdout);
        printf("\n");
        free(text);
    }
    return ZO_OK;
}

zo_status gen_report_end(gen_run *r)
{
    const gen_args *a = r->a;
    zo_status st = print_outputs(r);
    if (st != ZO_OK) return st;
    fflush(stdout);
    size_t prompt_tok = 0, new_tok = 0;
    for (int j = 0; j < r->n; j++) prompt_tok += r->prompts[j].n, new_tok += r->out[j].n;
    double ttft = r->t_first - r->t_start, decode = r->t_end - r->t_first, total = r->t_end - r->t_start;
    size_t after = new_tok - (size_t)r->n; /* the tokens after each sequence's first */
    double rate = decode > 0 ? (double)after / decode : 0.0;
    fprintf(stderr, "# %zu prompt tokens in %d sequence(s): time to first token %.4f s (the prompts' forward)\n",
            prompt_tok, r->n, ttft);
    fprintf(stderr, "# %zu new tokens, %zu after the first in %.4f s: %.2f tokens/s (%.2f per sequence)\n", new_tok,
            after, decode, rate, rate / r->n);
    offload_stats os;
    offload_get_stats(r->g.rt, &os);
    const offload_prediction *pr = a->plan && a->p.predicted.present ? &a->p.predicted : NULL;
    char b1[32], vs[160];
    fprintf(stderr, "# peak bytes per tier:");
    for (int t = 0; t < OFFLOAD_TIERS; t++) {
        offload_format_peak_vs_plan(vs, sizeof vs, os.peak[t], pr, (offload_tier)t);
        fprintf(stderr, " %s %s%s", offload_tier_name((offload_tier)t), zo_format_bytes(os.peak[t], b1, sizeof b1), vs);
        fprintf(stderr, t + 1 < OFFLOAD_TIERS ? "," : "\n");
    }
    /* the runtime's waits, and the rest of the generation's time (the host
     * enqueuing work, choosing and decoding tokens): they add up to the total */
    double parts = 0;
    fprintf(stderr, "# time:");
    for (int p = 0; p < OFFLOAD_TIME_PARTS; p++) {
        fprintf(stderr, " %s %.3fs,", offload_time_part_name((offload_time_part)p), os.time[p]);
        parts += os.time[p];
    }
    fprintf(stderr, " other %.3fs = total %.3fs\n", total - parts, total);
    if (os.n_expert_slots) /* an MoE model's routed experts streamed apart (docs/generate.md) */
        fprintf(stderr, "# experts streamed apart: %d slots of %s, %llu experts fetched, %s of weights copied to "
                "the device\n", os.n_expert_slots, zo_format_bytes(os.expert_slot_bytes, b1, sizeof b1),
                (unsigned long long)os.experts_fetched, zo_format_bytes(os.bytes_weights, vs, sizeof vs));
    if (pr && pr->step_s > 0)
        fprintf(stderr, "# plan predicts %.4f s per token (%.2f tokens/s per sequence); measured %.4f s\n", pr->step_s,
                1.0 / pr->step_s, rate > 0 ? r->n / rate : 0.0);
    if (!a->stats_json) return ZO_OK;
    cJSON *o = cJSON_CreateObject();
    if (!o) return zo_error(ZO_ERR_NOMEM, "--stats-json %s: out of host memory", a->stats_json);
    /* predicted_bytes: the plan's allocations, which the peak measures; planned_total_bytes:
     * its peak with the CUDA context, cuBLAS workspace and allocator allowance (as train's) */
    cJSON *pk = cJSON_AddObjectToObject(o, "peak_bytes"), *pd = pr ? cJSON_AddObjectToObject(o, "predicted_bytes") : NULL;
    cJSON *pt = pr ? cJSON_AddObjectToObject(o, "planned_total_bytes") : NULL;
    for (int t = 0; t < OFFLOAD_TIERS; t++) {
        cJSON_AddNumberToObject(pk, offload_tier_name((offload_tier)t), (double)os.peak[t]);
        if (pd) cJSON_AddNumberToObject(pd, offload_tier_name((offload_tier)t), (double)pr->alloc[t]);
        if (pt) cJSON_AddNumberToObject(pt, offload_tier_name((offload_tier)t), (double)pr->peak[t]);
    }
    cJSON *ts = cJSON_AddObjectToObject(o, "time_s");
    for (int p = 0; p < OFFLOAD_TIME_PARTS; p++)
        cJSON_AddNumberToObject(ts, offload_time_part_name((offload_time_part)p), os.time[p]);
    cJSON_AddNumberToObject(ts, "other", total - parts);
    cJSON_AddNumberToObject(ts, "total", total);
    cJSON_AddNumberToObject(o, "sequences", r->n);
    /* the key/value caches' device bytes as allocated, and what they hold */
    cJSON_AddNumberToObject(o, "kv_cache_bytes", (double)r->g.m.kv_bytes);
    if (r->cfg.mla.kv_rank)
        cJSON_AddStringToObject(o, "mla_cache", a->mla_cache == TF_MLA_CACHE_FULL ? "full" : "latent");
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)prompt_tok);
    cJSON_AddNumberToObject(o, "new_tokens", (double)new_tok);
    cJSON_AddNumberToObject(o, "time_to_first_token_s", ttft);
    cJSON_AddNumberToObject(o, "tokens_per_s", rate);
    cJSON_AddNumberToObject(o, "s_per_token", rate > 0 ? r->n / rate : 0.0);
    if (pr && pr->step_s > 0) cJSON_AddNumberToObject(o, "predicted_s_per_token", pr->step_s);
    cJSON *by = cJSON_AddObjectToObject(o, "bytes_moved");
    cJSON_AddNumberToObject(by, "h2d", (double)os.bytes_h2d);
    cJSON_AddNumberToObject(by, "disk_read", (double)os.bytes_disk_read);
    cJSON_AddNumberToObject(by, "weights", (double)os.bytes_weights);
    if (os.n_expert_slots) { /* an MoE model's routed experts streamed apart (docs/generate.md) */
        cJSON_AddNumberToObject(o, "expert_slots", os.n_expert_slots);
        cJSON_AddNumberToObject(o, "expert_slot_bytes", (double)os.expert_slot_bytes);
        cJSON_AddNumberToObject(o, "experts_fetched", (double)os.experts_fetched);
    }
    st = zo_file_write_json(a->stats_json, o);
    cJSON_Delete(o);
    if (st == ZO_OK) fprintf(stderr, "# stats %s\n", a->stats_json);
    return st;
}

/* memplan's and train's convention: 2 bad input, 1 failed at run time. */
static int exit_code(zo_status st, gen_phase phase)
{
    return zo_exit_status(st, phase == GEN_INPUT, phase == GEN_RUN);
}

int gen_finish(gen_run *r, zo_status st)
{
    tf_gen_free(&r->g);
    gpu_device_free(r->dev);
    gen_sampler_free(&r->smp);
    for (int j = 0; j < r->n; j++) {
        if (r->prompts) model_ids_free(&r->prompts[j]);
        if (r->out) model_ids_free(&r->out[j]);
    }
    free(r->prompts);
    free(r->out);
    free(r->done);
    free(r->logits);
    model_tokenizer_free(r->tok);
    if (st == ZO_OK) return 0;
    fprintf(stderr, "generate: %s\n", zo_last_error());
    return exit_code(st, r->phase);
}
