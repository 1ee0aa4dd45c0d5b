/* The plan schema (common/plan_schema.h) and its two users: what the one
 * writer writes the one reader reads back; every field is required, unknown
 * ones are refused by name, the version is checked; each limit of the table
 * holds for memplan's flags and for the runtime's reader alike, with the same
 * message; train's flags that set plan fields give memplan's verdict in
 * memplan's words; `train --plan` refuses a plan made for another model or
 * another number of ranks (zo_plan_check_run compares a family's features
 * too). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/plan_schema.h" /* defines: zo_plan_read, zo_plan_write_json, zo_plan_field_range */
#include "common/units.h"       /* defines: zo_format_bytes */
#include "offload/offload.h"    /* defines: offload_plan_load */
#include "tests/support/files.h" /* defines: files_write_text, files_read_text, files_json_set */
#include "tests/support/run.h"   /* defines: run_program, run_capture */
#include "tests/support/scratch.h" /* defines: scratch_path */

static char tmp_dir[256];

/* A plan with every object: the schema's defaults for LLaMA-2-7B, values off
 * the defaults, a hardware profile and a prediction. */
static void full_plan(zo_plan *p)
{
    zo_model_config m;
    assert_int_equal(zo_model_preset_find("llama-2-7b", &m), ZO_OK);
    zo_plan_defaults(p, &m);
    p->training.seq = 2048;
    p->training.micro_batch = 3;
    p->training.grad_accum = 5;
    p->training.grad_dtype = ZO_DTYPE_F32;
    p->training.recompute = ZO_PLAN_RECOMPUTE_FULL;
    p->training.dp_overlap = 0;
    p->training.fused_grad_accum = 1;
    p->training.method = ZO_PLAN_QLORA;
    p->training.has_lora = 1;
    p->training.lora = (zo_lora_config){.r = 16, .alpha = 32, .targets = ZO_LORA_ALL_LINEAR};
    p->training.optimizer_schedule = ZO_PLAN_SCHED_DPU;
    p->training.dpu_warmup = 5;
    p->training.opt_threads = 3;
    p->training.clip_stale = 1;
    p->parallel = (zo_plan_parallel){.dp = 2, .tp = 2, .pp = 2, .vpp = 2, .sp = 1, .ep = 2,
                                     .capacity_factor = 1.5, .zero = 1};
    p->placement = (zo_plan_placement){.params = ZO_PLAN_NVME, .grads = ZO_PLAN_CPU,
                                       .checkpoints = ZO_PLAN_CPU, .adapters = ZO_PLAN_CPU,
                                       .optimizer = {0.25, 0.5, 0.25}};
    snprintf(p->nvme.dir, sizeof p->nvme.dir, "/mnt/nvme0");
    p->nvme.sub_group = 12345;
    p->nvme.swap_buffers = 4;
    p->buffers = (zo_plan_buffers){.prefetch_depth = 3, .comm_bucket_elems = 1000,
                                   .comm_buckets = 2, .pinned_staging = 4096,
                                   .cuda_context = 1 << 20, .cublas_workspace = 1 << 10,
                                   .fragmentation = 0.125};
    p->has_hardware = 1;
    p->hardware = (zo_hw_profile){.name = "box", .gpu = "GPU-X", .gpus = 8, .gpus_per_node = 8,
                                  .gpu_mem = 1ull << 34, .cpu_mem = 1ull << 38, .nvme = 1ull << 40,
                                  .pcie_bw = 2.5e10, .gemm_eff_max = 0.5, .measured = 1,
                                  .cpu_adam_rate = 2e9, .cpu_adam_thread_rate = 4e8,
                                  .note = "measured"};
    p->has_predicted = 1;
    p->predicted = (zo_plan_predicted){.peak_bytes = {1, 2, 3}, .capacity_bytes = {4, 5, 6},
                                       .fits = 1, .step_s = 1.5, .tokens_per_s = 1e4, .mfu = 0.25};
}

static char *plan_text(const zo_plan *p)
{
    cJSON *doc;
    assert_int_equal(zo_plan_write_json(p, "plan", &doc), ZO_OK);
    char *text = cJSON_Print(doc);
    cJSON_Delete(doc);
    assert_non_null(text);
    return text;
}

static zo_status read_doc(const cJSON *doc, zo_plan *out)
{
    char *text = cJSON_PrintUnformatted(doc);
    assert_non_null(text);
    zo_status st = zo_plan_read(text, strlen(text), "p.json", out);
    free(text);
    return st;
}

/* Every leaf of a document, as its dotted name and its object. */
typedef struct leaf {
    char name[128];
    cJSON *parent;
    cJSON *item;
} leaf;

static void leaves(cJSON *o, const char *prefix, leaf *out, int *n, int max)
{
    for (cJSON *c = o->child; c; c = c->next) {
        char name[128];
        snprintf(name, sizeof name, "%s%s%s", prefix, prefix[0] ? "." : "", c->string);
        if (cJSON_IsObject(c)) {
            leaves(c, name, out, n, max);
            continue;
        }
        assert_true(*n < max);
        snprintf(out[*n].name, sizeof out[*n].name, "%s", name);
        out[*n].parent = o;
        out[*n].item = c;
        (*n)++;
    }
}

/* full_plan as a parsed document, and its leaves. */
static cJSON *full_doc(leaf *l, int *n, int max)
{
    zo_plan *p = malloc(sizeof *p);
    assert_non_null(p);
    full_plan(p);
    char *text = plan_text(p);
    free(p);
    cJSON *doc = cJSON_Parse(text);
    free(text);
    assert_non_null(doc);
    *n = 0;
    leaves(doc, "", l, n, max);
    return doc;
}

/* ---- the schema alone -------------------------------------------------------------------- */

/* What the writer writes, the reader reads to the same plan (written again,
 * the same text). */
static void test_roundtrip(void **state)
{
    (void)state;
    zo_plan *p = malloc(sizeof *p), *q = malloc(sizeof *q);
    assert_non_null(p);
    assert_non_null(q);
    full_plan(p);
    char *text = plan_text(p);
    assert_int_equal(zo_plan_read(text, strlen(text), "p.json", q), ZO_OK);
    char *again = plan_text(q);
    assert_string_equal(text, again);
    assert_int_equal(q->parallel.vpp, 2);
    assert_true(q->placement.optimizer[ZO_PLAN_NVME] == 0.25);
    assert_string_equal(q->nvme.dir, "/mnt/nvme0");
    assert_true(q->hardware.gpu_mem == 1ull << 34 && q->predicted.capacity_bytes[2] == 6);
    assert_true(zo_model_params(&q->model) == zo_model_params(&p->model));
    assert_true(q->parallel.ep == 2 && q->parallel.capacity_factor == 1.5);
    assert_true(q->training.dp_overlap == 0 && q->training.fused_grad_accum == 1);
    assert_true(q->training.method == ZO_PLAN_QLORA && q->training.has_lora);
    assert_true(q->training.lora.r == 16 && q->training.lora.alpha == 32 &&
                q->training.lora.targets == ZO_LORA_ALL_LINEAR);
    assert_non_null(strstr(text, "\"all-linear\""));
    assert_non_null(strstr(text, "\"qlora\""));
    assert_non_null(strstr(text, "\"dpu\""));
    assert_true(q->training.optimizer_schedule == ZO_PLAN_SCHED_DPU && q->training.dpu_warmup == 5 &&
                q->training.opt_threads == 3 && q->training.clip_stale == 1);
    assert_true(q->hardware.cpu_adam_thread_rate == 4e8);
    assert_true(q->placement.adapters == ZO_PLAN_CPU);
    free(again);
    free(text);

    /* the families' features (experts, latent attention, positions, norms),
     * and a multimodal checkpoint's text model (its count without the
     * vision tower), from published config.json files */
    static const char *configs[] = {"deepseek-v2-lite.json", "qwen1.5-moe-a2.7b.json",
                                    "deepseek-v3.json",      "gemma-2-2b.json",
                                    "falcon-7b.json",        "opt-125m.json",
                                    "bloom-560m.json",       "qwen3-0.6b.json",
                                    "gemma-3-4b-it.json"};
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        char path[512];
        zo_model_config m;
        snprintf(path, sizeof path, "%s/hf-configs/%s", ZO_FIXTURES_DIR, configs[i]);
        assert_int_equal(zo_model_config_load(path, &m), ZO_OK);
        assert_int_equal(m.mm_text, !strcmp(configs[i], "gemma-3-4b-it.json"));
        zo_plan_defaults(p, &m);
        text = plan_text(p);
        assert_int_equal(zo_plan_read(text, strlen(text), "p.json", q), ZO_OK);
        again = plan_text(q);
        assert_string_equal(text, again);
        assert_memory_equal(&q->model.moe, &m.moe, sizeof m.moe);
        assert_memory_equal(&q->model.mla, &m.mla, sizeof m.mla);
        assert_string_equal(q->model.act, m.act);
        assert_true(q->model.pos == m.pos && q->model.pos_offset == m.pos_offset &&
                    q->model.layer_norms == m.layer_norms &&
                    q->model.parallel_block == m.parallel_block &&
                    q->model.embed_norm == m.embed_norm && q->model.qk_norm == m.qk_norm &&
                    q->model.mm_text == m.mm_text);
        assert_true(zo_model_params(&q->model) == zo_model_params(&m));
        assert_int_equal(zo_plan_check_run(q, &m, 1, "p.json"), ZO_OK);
        free(again);
        free(text);
    }

    /* hardware and prediction are optional, as wholes */
    p->has_hardware = p->has_predicted = 0;
    text = plan_text(p);
    assert_null(strstr(text, "\"hardware\""));
    assert_int_equal(zo_plan_read(text, strlen(text), "p.json", q), ZO_OK);
    assert_false(q->has_hardware || q->has_predicted);
    free(text);

    /* a model known only by its size carries no shape */
    zo_model_config m = {.name = "big", .max_seq = 4096, .params_override = 70000000000ull};
    zo_plan_defaults(p, &m);
    text = plan_text(p);
    assert_null(strstr(text, "\"layers\""));
    assert_null(strstr(text, "\"features\""));
    assert_non_null(strstr(text, "\"params_only\""));
    assert_int_equal(zo_plan_read(text, strlen(text), "p.json", q), ZO_OK);
    assert_true(q->model.params_override == 70000000000ull);
    free(text);
    free(p);
    free(q);
}

/* The fields added after plans were written (issues 33, 31, 30, 29): absent, they
 * take the value every plan before them meant (no MoE model ran before
 * issue 31: its router's fields default to 0). */
static const char *const optional_fields[] = {"training.recompute_layers", "training.reduce_dtype",
                                              "hardware.peers_via_host", "model.features.moe.norm_topk",
                                              "model.features.moe.aux_loss",
                                              "model.features.moe.aux_coef", "model.features.moe.aux_per_layer",
                                              "model.features.moe.seq_aux", "model.features.moe.sparsemixer",
                                              "model.features.moe.jitter_eps", "training.optim_dtype",
                                              "training.master", "training.loss_chunk",
                                              "hardware.nvme_read_bw_busy", "model.features.head_bias",
                                              "model.features.attn_out_nobias",
                                              "model.features.qk_norm_heads", "model.text_model_of_multimodal",
                                              "model.features.qk_norm_full", "model.features.post_norms_only",
                                              "model.features.attn_sinks", "model.features.moe.expert_bias",
                                              "model.features.moe.router_logit_bias",
                                              "model.features.moe.glu_limit", "model.features.moe.glu_alpha"};

static int is_optional(const char *name)
{
    for (size_t i = 0; i < sizeof optional_fields / sizeof optional_fields[0]; i++)
        if (!strcmp(name, optional_fields[i])) return 1;
    return 0;
}

/* Each field of a full plan, removed, is refused as missing, by its name (an
 * optional one reads as its default: every layer recomputed as
 * training.recompute says, gradients reduced in fp32, peers reached at
 * nvlink_bw, no bias on the output layer, the attention output
 * biased as out_bias says, a text model of its own); an unknown field in any object is refused by its name. */
static void test_required_and_unknown(void **state)
{
    (void)state;
    zo_plan *q = malloc(sizeof *q);
    assert_non_null(q);
    static leaf l[256];
    int n;
    cJSON *doc = full_doc(l, &n, 256);
    assert_true(n > 80);
    char want[200];
    for (int i = 0; i < n; i++) {
        if (is_optional(l[i].name)) {
            cJSON *item = cJSON_DetachItemViaPointer(l[i].parent, l[i].item);
            assert_int_equal(read_doc(doc, q), ZO_OK);
            assert_int_equal(q->training.recompute_layers, 0);
            assert_int_equal(q->training.reduce_dtype, ZO_DTYPE_F32);
            assert_int_equal(q->hardware.peers_via_host, 0);
            assert_int_equal(q->training.optim_dtype, ZO_PLAN_STATE_FP32);
            assert_int_equal(q->training.master, ZO_PLAN_MASTER_FP32);
            assert_int_equal(q->training.loss_chunk, 0);
            assert_true(q->hardware.nvme_read_bw_busy == 0); /* (0: nvme_read_bw applies) */
            assert_int_equal(q->model.head_bias, 0);
            assert_int_equal(q->model.attn_out_nobias, 0);
            assert_int_equal(q->model.qk_norm_heads, 0);
            assert_int_equal(q->model.qk_norm_full, 0);
            assert_int_equal(q->model.post_norms_only, 0);
            assert_int_equal(q->model.mm_text, 0);
            assert_int_equal(q->model.moe.sparsemixer, 0);
            assert_int_equal(q->model.attn_sinks, 0);
            assert_int_equal(q->model.moe.expert_bias, 0);
            assert_int_equal(q->model.moe.router_logit_bias, 0);
            assert_true(q->model.moe.glu_limit == 0 && q->model.moe.glu_alpha == 0);
            cJSON_AddItemToObject(l[i].parent, l[i].item->string, item);
            continue;
        }
        cJSON *item = cJSON_DetachItemViaPointer(l[i].parent, l[i].item);
        assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
        snprintf(want, sizeof want, "p.json: missing field \"%.127s\"", l[i].name);
        if (!strstr(zo_last_error(), want)) {
            fprintf(stderr, "without %s: %s\n", l[i].name, zo_last_error());
            fail();
        }
        cJSON_AddItemToObject(l[i].parent, l[i].item->string, item);
    }
    assert_int_equal(read_doc(doc, q), ZO_OK);
    /* an unknown field, in every object */
    const char *objects[] = {"", "model", "model.features", "model.features.mla",
                             "model.features.moe", "hardware", "training", "training.lora", "parallel",
                             "placement", "placement.optimizer", "nvme", "buffers", "predicted",
                             "predicted.peak_bytes"};
    for (size_t i = 0; i < sizeof objects / sizeof objects[0]; i++) {
        cJSON *o = doc;
        char path[64];
        snprintf(path, sizeof path, "%s", objects[i]);
        for (char *sv = NULL, *k = strtok_r(path, ".", &sv); k; k = strtok_r(NULL, ".", &sv))
            assert_non_null(o = cJSON_GetObjectItemCaseSensitive(o, k));
        cJSON_AddNumberToObject(o, "colour", 1);
        assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
        snprintf(want, sizeof want, "p.json: unknown field \"%s%scolour\"", objects[i],
                 objects[i][0] ? "." : "");
        if (!strstr(zo_last_error(), want)) {
            fprintf(stderr, "%s: %s\n", want, zo_last_error());
            fail();
        }
        cJSON_DeleteItemFromObjectCaseSensitive(o, "colour");
    }
    /* a field given twice */
    cJSON_AddNumberToObject(cJSON_GetObjectItemCaseSensitive(doc, "buffers"), "prefetch_depth", 1);
    assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "p.json: field \"buffers.prefetch_depth\" appears twice"));
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "buffers"),
                                            "prefetch_depth");
    assert_int_equal(read_doc(doc, q), ZO_OK);
    /* the version, the format, the parameter count against the shape */
    cJSON_ReplaceItemInObjectCaseSensitive(doc, "version", cJSON_CreateNumber(2));
    assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "p.json: field \"version\""));
    cJSON_ReplaceItemInObjectCaseSensitive(doc, "version", cJSON_CreateNumber(1));
    cJSON_DeleteItemFromObjectCaseSensitive(doc, "format");
    assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "\"zoffload-plan\""));
    cJSON_AddStringToObject(doc, "format", "zoffload-plan");
    cJSON *model = cJSON_GetObjectItemCaseSensitive(doc, "model");
    cJSON_ReplaceItemInObjectCaseSensitive(model, "params", cJSON_CreateNumber(1000));
    assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "model.params"));
    cJSON_Delete(doc);
    free(q);
}

/* training.lora is there exactly for a LoRA or QLoRA plan; its targets are
 * PEFT's module names or ours, and must exist in the model. */
static void test_method(void **state)
{
    (void)state;
    zo_plan *q = malloc(sizeof *q);
    assert_non_null(q);
    static leaf l[256];
    int n;
    cJSON *doc = full_doc(l, &n, 256);
    cJSON *tr = cJSON_GetObjectItemCaseSensitive(doc, "training");
    cJSON *lora = cJSON_GetObjectItemCaseSensitive(tr, "lora");
    /* PEFT's names are read as ours */
    cJSON_ReplaceItemInObjectCaseSensitive(lora, "targets", cJSON_CreateString("q_proj,v_proj"));
    assert_int_equal(read_doc(doc, q), ZO_OK);
    assert_true(q->training.lora.targets == (ZO_LORA_Q | ZO_LORA_V));
    cJSON_ReplaceItemInObjectCaseSensitive(lora, "targets", cJSON_CreateString("q,attn"));
    assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "p.json: field \"training.lora.targets\" must be a "
                                            "comma-separated list of q, k, v, o, gate, up, down, or all-linear"));
    cJSON_ReplaceItemInObjectCaseSensitive(lora, "targets", cJSON_CreateString(""));
    assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
    cJSON_ReplaceItemInObjectCaseSensitive(lora, "targets", cJSON_CreateString("all-linear"));
    /* a full plan carries no adapters, a LoRA plan must */
    cJSON_ReplaceItemInObjectCaseSensitive(tr, "method", cJSON_CreateString("full"));
    assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "\"training.lora\" is given but \"training.method\" is full"));
    cJSON *detached = cJSON_DetachItemFromObjectCaseSensitive(tr, "lora");
    /* without adapters, nothing has the adapters' placement */
    cJSON *pl = cJSON_GetObjectItemCaseSensitive(doc, "placement");
    assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "\"placement.adapters\" is cpu but \"training.method\" is full"));
    cJSON_ReplaceItemInObjectCaseSensitive(pl, "adapters", cJSON_CreateString("gpu"));
    assert_int_equal(read_doc(doc, q), ZO_OK);
    assert_false(q->training.has_lora);
    cJSON_ReplaceItemInObjectCaseSensitive(tr, "method", cJSON_CreateString("lora"));
    assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "field \"training.method\" is lora: missing object "
                                            "\"training.lora\""));
    cJSON_AddItemToObject(tr, "lora", detached);
    assert_int_equal(read_doc(doc, q), ZO_OK);
    assert_true(q->training.method == ZO_PLAN_LORA);
    cJSON_ReplaceItemInObjectCaseSensitive(tr, "method", cJSON_CreateString("adapters"));
    assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "field \"training.method\" must be full, lora or qlora"));
    cJSON_ReplaceItemInObjectCaseSensitive(tr, "method", cJSON_CreateString("lora"));
    cJSON_ReplaceItemInObjectCaseSensitive(tr, "optimizer_schedule", cJSON_CreateString("async"));
    assert_int_equal(read_doc(doc, q), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "\"training.optimizer_schedule\" must be serial, overlap or dpu"));
    cJSON_ReplaceItemInObjectCaseSensitive(tr, "optimizer_schedule", cJSON_CreateString("overlap"));
    assert_int_equal(read_doc(doc, q), ZO_OK);
    cJSON_Delete(doc);

    /* GPT-2 has no gate; a model known by its size has no layers to adapt */
    zo_model_config gpt2;
    assert_int_equal(zo_model_preset_find("gpt2", &gpt2), ZO_OK);
    zo_plan_defaults(q, &gpt2);
    q->training.method = ZO_PLAN_LORA;
    q->training.has_lora = 1;
    q->training.lora = (zo_lora_config){.r = 8, .alpha = 16, .targets = ZO_LORA_GATE};
    cJSON *out;
    assert_int_equal(zo_plan_write_json(q, "g.json", &out), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "g.json: field \"training.lora\": LoRA: gpt2 has no gate"));
    q->training.lora.targets = ZO_LORA_Q | ZO_LORA_V;
    assert_int_equal(zo_plan_write_json(q, "g.json", &out), ZO_OK);
    cJSON_Delete(out);
    zo_model_config big = {.name = "big", .max_seq = 4096, .params_override = 70000000000ull};
    zo_plan_defaults(q, &big);
    q->training.method = ZO_PLAN_QLORA;
    q->training.has_lora = 1;
    q->training.lora = (zo_lora_config){.r = 8, .alpha = 16, .targets = ZO_LORA_Q};
    assert_int_equal(zo_plan_write_json(q, "b.json", &out), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "the adapters need the model's shape"));
    free(q);
}

/* Each number of the table at its limits is read; one past is refused with
 * the file, the field and the table's message for the value. The model's
 * numbers and the optimizer's fractions are tied to each other (the
 * parameter count, the sum), so they are left to the other tests. */
static void test_limits(void **state)
{
    (void)state;
    zo_plan *q = malloc(sizeof *q);
    assert_non_null(q);
    static leaf l[256];
    int n, tried = 0;
    cJSON *doc = full_doc(l, &n, 256);
    for (int i = 0; i < n; i++) {
        double lo, hi;
        if (!cJSON_IsNumber(l[i].item) || !strncmp(l[i].name, "model.", 6) ||
            !strncmp(l[i].name, "placement.", 10) || !strcmp(l[i].name, "version") ||
            !strcmp(l[i].name, "hardware.version"))
            continue;
        assert_int_equal(zo_plan_field_range(l[i].name, &lo, &hi), ZO_OK);
        double keep = l[i].item->valuedouble;
        int integer = keep == floor(keep) && zo_plan_field_check(l[i].name, lo + 0.5) != ZO_OK &&
                      lo + 0.5 <= hi;
        double step = integer ? 1 : (hi - lo) / 2;
        /* past a limit: one more, or the next double where one more is not one */
        double up = hi + step > hi ? hi + step : nextafter(hi, INFINITY);
        double cases[] = {lo, hi, lo - step, up};
        for (int k = 0; k < 4; k++) {
            cJSON_SetNumberValue(l[i].item, cases[k]);
            zo_status st = read_doc(doc, q);
            if (k < 2) {
                if (st != ZO_OK) fprintf(stderr, "%s = %g: %s\n", l[i].name, cases[k], zo_last_error());
                assert_int_equal(st, ZO_OK);
                continue;
            }
            assert_int_equal(st, ZO_ERR_FORMAT);
            char want[300];
            snprintf(want, sizeof want, "%s", zo_last_error());
            assert_int_equal(zo_plan_field_check(l[i].name, cases[k]), ZO_ERR_INVALID);
            char full[600];
            snprintf(full, sizeof full, "p.json: field \"%.127s\": %.300s", l[i].name, zo_last_error());
            if (strcmp(want, full)) {
                fprintf(stderr, "got  %s\nwant %s\n", want, full);
                fail();
            }
        }
        cJSON_SetNumberValue(l[i].item, keep);
        tried++;
    }
    assert_true(tried > 40);
    cJSON_Delete(doc);
    free(q);
}

/* zo_plan_check_run: the parameter count, then the shape (two models of the
 * same size that differ in heads, or in a family's positions), then the
 * ranks. */
static void test_check_run(void **state)
{
    (void)state;
    zo_model_config a = {.name = "a", .arch = ZO_ARCH_LLAMA, .n_layers = 2, .hidden = 64,
                         .n_heads = 4, .n_kv_heads = 4, .ffn = 128, .vocab = 256, .max_seq = 64,
                         .norm_eps = 1e-5f, .rope_theta = 1e4f};
    zo_model_config b = a;
    snprintf(b.name, sizeof b.name, "b");
    b.n_heads = b.n_kv_heads = 8;
    assert_int_equal(zo_model_config_validate(&a), ZO_OK);
    assert_int_equal(zo_model_config_validate(&b), ZO_OK);
    assert_true(zo_model_params(&a) == zo_model_params(&b));
    zo_plan *p = malloc(sizeof *p);
    assert_non_null(p);
    zo_plan_defaults(p, &a);
    assert_int_equal(zo_plan_check_run(p, &a, 1, "p.json"), ZO_OK);
    assert_int_equal(zo_plan_check_run(p, &b, 1, "p.json"), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "p.json: the plan's model.heads is 4; the run's model \"b\" has 8"));
    zo_model_config c = a;
    c.n_layers = 3;
    assert_int_equal(zo_plan_check_run(p, &c, 1, "p.json"), ZO_ERR_INVALID);
    char want[200];
    snprintf(want, sizeof want, "of %llu parameters; the run's model \"a\" has %llu",
             (unsigned long long)zo_model_params(&a), (unsigned long long)zo_model_params(&c));
    assert_non_null(strstr(zo_last_error(), want));
    /* what a family adds, of the same size: ALiBi for rotary positions */
    zo_model_config d = a;
    d.pos = ZO_POS_ALIBI;
    assert_true(zo_model_params(&a) == zo_model_params(&d));
    assert_int_equal(zo_plan_check_run(p, &d, 1, "p.json"), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "p.json: the plan's model.features.positions is arch; "
                                            "the run's model \"a\" has alibi"));
    p->parallel.dp = 4;
    p->parallel.pp = 2;
    assert_int_equal(zo_plan_check_run(p, &a, 1, "p.json"), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "for 8 ranks (parallel.dp 4 x tp 1 x pp 2); this run has 1"));
    assert_int_equal(zo_plan_check_run(p, &a, 8, "p.json"), ZO_OK);
    /* what memplan plans beyond the runtime is refused by name (issue 33):
     * recomputing by op with host checkpoints; recomputing by op of a full
     * fine-tune and of a LoRA/QLoRA run, part of the layers and a reduction
     * in bf16 run */
    p->training.recompute = ZO_PLAN_RECOMPUTE_OPS;
    assert_int_equal(p->training.method, ZO_PLAN_FULL);
    assert_int_equal(p->placement.checkpoints, ZO_PLAN_GPU);
    assert_int_equal(zo_plan_check_run(p, &a, 8, "p.json"), ZO_OK);
    p->training.method = ZO_PLAN_LORA;
    assert_int_equal(zo_plan_check_run(p, &a, 8, "p.json"), ZO_OK);
    p->training.method = ZO_PLAN_QLORA;
    assert_int_equal(zo_plan_check_run(p, &a, 8, "p.json"), ZO_OK);
    p->training.method = ZO_PLAN_FULL;
    p->placement.checkpoints = ZO_PLAN_CPU;
    assert_int_equal(zo_plan_check_run(p, &a, 8, "p.json"), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "is ops with placement.checkpoints cpu"));
    p->placement.checkpoints = ZO_PLAN_GPU;
    p->training.recompute = ZO_PLAN_RECOMPUTE_FULL;
    p->training.recompute_layers = 1;
    assert_int_equal(zo_plan_check_run(p, &a, 8, "p.json"), ZO_OK);
    p->training.recompute_layers = 0;
    p->training.reduce_dtype = ZO_DTYPE_BF16;
    assert_int_equal(zo_plan_check_run(p, &a, 8, "p.json"), ZO_OK);
    p->training.reduce_dtype = ZO_DTYPE_F32;
    assert_int_equal(zo_plan_check_run(p, &a, 8, "p.json"), ZO_OK);
    free(p);
}

/* The fields issue 33 added round-trip, and a plan written before them reads
 * as it meant: every layer recomputed as training.recompute says, gradients
 * reduced in fp32. */
static void test_added_fields(void **state)
{
    (void)state;
    zo_plan *p = malloc(sizeof *p), *q = malloc(sizeof *q);
    assert_non_null(p);
    assert_non_null(q);
    full_plan(p);
    p->training.recompute = ZO_PLAN_RECOMPUTE_FULL;
    p->training.recompute_layers = 3;
    p->training.reduce_dtype = ZO_DTYPE_BF16;
    char *text = plan_text(p);
    assert_non_null(strstr(text, "\"recompute_layers\""));
    assert_non_null(strstr(text, "\"reduce_dtype\""));
    assert_int_equal(zo_plan_read(text, strlen(text), "p.json", q), ZO_OK);
    assert_int_equal(q->training.recompute_layers, 3);
    assert_int_equal(q->training.reduce_dtype, ZO_DTYPE_BF16);
    free(text);
    p->training.recompute = ZO_PLAN_RECOMPUTE_OPS;
    p->training.recompute_layers = 0;
    text = plan_text(p);
    assert_non_null(strstr(text, "\"ops\""));
    assert_int_equal(zo_plan_read(text, strlen(text), "p.json", q), ZO_OK);
    assert_int_equal(q->training.recompute, ZO_PLAN_RECOMPUTE_OPS);
    free(text);
    /* issue 29's: the disk's read rate beside compute */
    p->hardware.nvme_read_bw_busy = 8.5e8;
    text = plan_text(p);
    assert_non_null(strstr(text, "\"nvme_read_bw_busy\""));
    assert_int_equal(zo_plan_read(text, strlen(text), "p.json", q), ZO_OK);
    assert_true(q->hardware.nvme_read_bw_busy == 8.5e8);
    free(text);
    p->hardware.nvme_read_bw_busy = 0;
    /* issue 30's: the state's encoding, the master, the loss chunk */
    p->training.optim_dtype = ZO_PLAN_STATE_8BIT;
    p->training.master = ZO_PLAN_MASTER_STOCHASTIC;
    p->training.loss_chunk = 2048;
    text = plan_text(p);
    assert_non_null(strstr(text, "\"8bit\""));
    assert_non_null(strstr(text, "\"stochastic\""));
    assert_int_equal(zo_plan_read(text, strlen(text), "p.json", q), ZO_OK);
    assert_int_equal(q->training.optim_dtype, ZO_PLAN_STATE_8BIT);
    assert_int_equal(q->training.master, ZO_PLAN_MASTER_STOCHASTIC);
    assert_int_equal(q->training.loss_chunk, 2048);
    free(text);
    p->training.optim_dtype = ZO_PLAN_STATE_FP32;
    p->training.master = ZO_PLAN_MASTER_FP32;
    p->training.loss_chunk = 0;
    /* an older plan: without the two fields */
    p->training.recompute = ZO_PLAN_RECOMPUTE_FULL;
    p->training.reduce_dtype = ZO_DTYPE_F32;
    cJSON *doc;
    assert_int_equal(zo_plan_write_json(p, "p.json", &doc), ZO_OK);
    cJSON *tr = cJSON_GetObjectItem(doc, "training");
    cJSON_DeleteItemFromObject(tr, "recompute_layers");
    cJSON_DeleteItemFromObject(tr, "reduce_dtype");
    text = cJSON_Print(doc);
    cJSON_Delete(doc);
    memset(q, 0xff, sizeof *q);
    assert_int_equal(zo_plan_read(text, strlen(text), "old.json", q), ZO_OK);
    assert_int_equal(q->training.recompute_layers, 0);
    assert_int_equal(q->training.reduce_dtype, ZO_DTYPE_F32);
    assert_int_equal(q->training.recompute, ZO_PLAN_RECOMPUTE_FULL);
    free(text);
    free(p);
    free(q);
}

/* ---- memplan and the runtime ------------------------------------------------------------ */

#if defined(ZO_MEMPLAN_BIN) && defined(ZO_TRAIN_BIN)
static const char tiny_config[] =
    "{\"model_type\": \"llama\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 128, "
    "\"vocab_size\": 256, \"max_position_embeddings\": 64}";

/* `memplan estimate` of the tiny model with `extra` flags last, writing the
 * plan to `plan`; its exit status, its output in out. */
static int estimate(const char *extra, const char *plan, char *out, size_t len)
{
    char args[2000];
    snprintf(args, sizeof args,
             "estimate --model %s/config.json --gpu-mem 64MiB --cpu-mem 1GiB --nvme 1GiB "
             "--seq 32 --params cpu --grads cpu --optimizer cpu --cuda-context 0 "
             "--cublas-workspace 0 %s --plan-out %s",
             tmp_dir, extra, plan);
    return run_program(ZO_MEMPLAN_BIN, args, out, len);
}

/* The field of a plan file, set to `v`, written back. */
static void edit_plan(const char *path, const char *field, double v)
{
    char *text = files_read_text(path);
    cJSON *doc = cJSON_Parse(text);
    free(text);
    assert_non_null(doc);
    char value[64];
    snprintf(value, sizeof value, "%.17g", v);
    files_json_set(doc, field, value);
    files_write_json(path, doc);
    cJSON_Delete(doc);
}

static double plan_value(const zo_plan *p, const char *field)
{
    if (!strcmp(field, "training.micro_batch")) return p->training.micro_batch;
    if (!strcmp(field, "training.grad_accum")) return p->training.grad_accum;
    if (!strcmp(field, "parallel.zero")) return p->parallel.zero;
    if (!strcmp(field, "buffers.prefetch_depth")) return p->buffers.prefetch_depth;
    if (!strcmp(field, "buffers.comm_buckets")) return p->buffers.comm_buckets;
    if (!strcmp(field, "buffers.fragmentation")) return p->buffers.fragmentation;
    if (!strcmp(field, "nvme.swap_buffers")) return p->nvme.swap_buffers;
    if (!strcmp(field, "nvme.sub_group")) return (double)p->nvme.sub_group;
    fail_msg("no field %s", field);
    return 0;
}

/* memplan writes a plan at each limit of the fields its flags set, and the
 * runtime reads it; one past the limit, memplan refuses the flag and the
 * runtime the plan holding it, with the table's one message. */
static void test_limits_memplan_runtime(void **state)
{
    (void)state;
    char path[400], plan[400], flags[200];
    static char out[1 << 16];
    snprintf(path, sizeof path, "%s/config.json", tmp_dir);
    files_write_text(path, tiny_config);
    snprintf(plan, sizeof plan, "%s/limits.json", tmp_dir);
    const struct {
        const char *flag, *field;
        int below; /* the flag can say one below the limit (--sub-group 0 is a count's error) */
    } f[] = {
        {"--micro-batch", "training.micro_batch", 1}, {"--grad-accum", "training.grad_accum", 1},
        {"--zero", "parallel.zero", 1},              {"--prefetch", "buffers.prefetch_depth", 1},
        {"--comm-buckets", "buffers.comm_buckets", 1}, {"--fragmentation", "buffers.fragmentation", 1},
        {"--swap-buffers", "nvme.swap_buffers", 1},  {"--sub-group", "nvme.sub_group", 0},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        double lo, hi;
        assert_int_equal(zo_plan_field_range(f[i].field, &lo, &hi), ZO_OK);
        double step = strcmp(f[i].field, "buffers.fragmentation") ? 1 : 0.5;
        double at[] = {lo, hi}, past[] = {hi + step, lo - step};
        for (int k = 0; k < 2; k++) {
            snprintf(flags, sizeof flags, "%s %.17g", f[i].flag, at[k]);
            int rc = estimate(flags, plan, out, sizeof out);
            if (rc != 0 && rc != 1) fprintf(stderr, "memplan %s: exit %d\n%s\n", flags, rc, out);
            assert_true(rc == 0 || rc == 1); /* fits or not, the plan is written */
            offload_plan p;
            offload_plan_defaults(&p);
            zo_status st = offload_plan_load(plan, &p);
            if (st != ZO_OK) fprintf(stderr, "%s: %s\n", flags, zo_last_error());
            assert_int_equal(st, ZO_OK);
            assert_true(plan_value(&p.file, f[i].field) == at[k]);
        }
        /* the plan at the upper limit, edited one past it */
        for (int k = 0; k < 1 + f[i].below; k++) {
            assert_int_equal(zo_plan_field_check(f[i].field, past[k]), ZO_ERR_INVALID);
            char why[200], want[700];
            snprintf(why, sizeof why, "%s", zo_last_error());
            snprintf(flags, sizeof flags, "%s %.17g", f[i].flag, past[k]);
            char other[400];
            snprintf(other, sizeof other, "%s/past.json", tmp_dir);
            assert_int_equal(estimate(flags, other, out, sizeof out), 2);
            snprintf(want, sizeof want, "memplan: %s: %s\n", f[i].flag, why);
            if (!strstr(out, want)) {
                fprintf(stderr, "memplan %s said:\n%s\nwanted: %s", flags, out, want);
                fail();
            }
            assert_int_not_equal(access(other, F_OK), 0); /* no plan written */
            snprintf(flags, sizeof flags, "%s %.17g", f[i].flag, hi);
            assert_true(estimate(flags, plan, out, sizeof out) <= 1);
            edit_plan(plan, f[i].field, past[k]);
            offload_plan p;
            offload_plan_defaults(&p);
            assert_int_equal(offload_plan_load(plan, &p), ZO_ERR_FORMAT);
            snprintf(want, sizeof want, "%s: field \"%s\": %s", plan, f[i].field, why);
            if (strcmp(zo_last_error(), want)) {
                fprintf(stderr, "runtime said: %s\nwanted:       %s\n", zo_last_error(), want);
                fail();
            }
        }
    }
    remove(plan);
    remove(path);
}

/* The line of `out` that starts with `prefix`, from the prefix to the end
 * of the line, into line (empty when there is none). */
static void line_from(const char *out, const char *prefix, char *line, size_t len)
{
    const char *p = strstr(out, prefix);
    line[0] = '\0';
    if (p) snprintf(line, len, "%.*s", (int)strcspn(p, "\n"), p);
}

/* train's flags that set a plan field are checked as memplan checks its own
 * (the schema's table, the run vocabulary, the optimizer's fractions): one
 * value, one verdict, exit 2 from both, in the same words after the flag's
 * name ("--prefetch: 0 is out of range [1, 16]"). Values at the limits pass
 * train's flags: it goes on to refuse --check-plan without --plan. */
static void test_train_flags_as_memplan(void **state)
{
    (void)state;
    static char out[1 << 16];
    char cfg[300], plan[300], args[600], want[400], said[400];
    snprintf(cfg, sizeof cfg, "%s/config.json", tmp_dir);
    snprintf(plan, sizeof plan, "%s/refused.json", tmp_dir);
    files_write_text(cfg, tiny_config);

    /* --prefetch 0, the example, said in full */
    assert_int_equal(estimate("--prefetch 0", plan, out, sizeof out), 2);
    assert_non_null(strstr(out, "memplan: --prefetch: 0 is out of range [1, 16]\n"));
    assert_int_equal(run_program(ZO_TRAIN_BIN, "--model gpt2 --data x.bin --prefetch 0", out, sizeof out), 2);
    assert_non_null(strstr(out, "train: --prefetch: 0 is out of range [1, 16]\n"));

    const struct {
        const char *train, *memplan, *value;
    } bad[] = {
        {"--prefetch", "--prefetch", "17"},        {"--micro-batch", "--micro-batch", "0"},
        {"--grad-accum", "--grad-accum", "0"},     {"--grad-accum", "--grad-accum", "16777217"},
        {"--seq", "--seq", "0"},                   {"--zero", "--zero", "4"},
        {"--sub-group", "--sub-group", "0"},       {"--lora", "--lora", "0"},
        {"--lora-alpha", "--lora-alpha", "0.001"}, {"--dpu-warmup", "--dpu-warmup", "2000000"},
        {"--opt-threads", "--opt-threads", "4097"}, {"--schedule", "--schedule", "later"},
        {"--recompute", "--recompute", "some"},    {"--adapters-on", "--adapters-on", "device"},
        {"--checkpoints-on", "--checkpoints", "nvme"},
        {"--recompute-layers", "--recompute-layers", "-1"}, {"--reduce-dtype", "--reduce-dtype", "fp8"},
        {"--optimizer-on", "--optimizer", "cpu=0.5,nvme=0.3"},
        {"--optimizer-on", "--optimizer", "gpu=1.5"},
        {"--optimizer-on", "--optimizer", "device"},
        /* issue 30: the optimizer state's flags */
        {"--optim-dtype", "--optim-dtype", "fp8"}, {"--master", "--master", "half"},
        {"--loss-chunk", "--loss-chunk", "-1"},  {"--optim", "--optim", "adam4bit"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "%s %s", bad[i].memplan, bad[i].value);
        assert_int_equal(estimate(args, plan, out, sizeof out), 2);
        assert_int_not_equal(access(plan, F_OK), 0); /* no plan written */
        snprintf(want, sizeof want, "memplan: %s: ", bad[i].memplan);
        line_from(out, want, said, sizeof said);
        if (!said[0]) {
            fprintf(stderr, "memplan %s said:\n%s\n", args, out);
            fail();
        }
        const char *why = said + strlen(want);
        snprintf(args, sizeof args, "--model %s --data x.bin %s %s", cfg, bad[i].train, bad[i].value);
        assert_int_equal(run_program(ZO_TRAIN_BIN, args, out, sizeof out), 2);
        snprintf(want, sizeof want, "train: %s: %s\n", bad[i].train, why);
        if (!strstr(out, want)) {
            fprintf(stderr, "train %s said:\n%s\nwanted: %s", args, out, want);
            fail();
        }
    }

    const char *good[] = {"--prefetch 1", "--prefetch 16", "--grad-accum 16777216", "--opt-threads 0",
                          "--lora-alpha 0.015625", "--dpu-warmup 1048576", "--sub-group 1",
                          "--params-on NVMe", "--checkpoints-on CPU", "--optimizer-on GPU=0.5,Cpu=0.5",
                          "--schedule DPU", "--recompute Selective"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(args, sizeof args, "--check-plan %s", good[i]);
        assert_int_equal(run_program(ZO_TRAIN_BIN, args, out, sizeof out), 2);
        if (!strstr(out, "train: --check-plan needs --plan FILE")) {
            fprintf(stderr, "train %s said:\n%s\n", args, out);
            fail();
        }
    }
    remove(cfg);
}

/* A plan that trains adapters is read by the schema and refused by the
 * runtime by its field until the runtime trains them from a plan. */
static void test_runtime_reads_lora(void **state)
{
    (void)state;
    char path[400], plan[400], data[400], cmd[2000];
    static char out[1 << 16];
    snprintf(path, sizeof path, "%s/config.json", tmp_dir);
    files_write_text(path, tiny_config);
    snprintf(plan, sizeof plan, "%s/lora.json", tmp_dir);
    snprintf(data, sizeof data, "%s/text.txt", tmp_dir);
    files_write_sample_text(data, 200);
    assert_true(estimate("--lora 4 --qlora --schedule overlap --clip-stale", plan, out, sizeof out) <= 1);
    zo_plan *f = malloc(sizeof *f);
    assert_non_null(f);
    assert_int_equal(zo_plan_load(plan, f), ZO_OK);
    assert_true(f->training.method == ZO_PLAN_QLORA && f->training.lora.r == 4);
    free(f);
    /* the runtime takes the schedule and the adapters' place; train the method */
    offload_plan p;
    offload_plan_defaults(&p);
    assert_int_equal(offload_plan_load(plan, &p), ZO_OK);
    assert_int_equal(p.cfg.schedule, OFFLOAD_SCHEDULE_OVERLAP);
    assert_int_equal(p.cfg.clip_stale, 1);
    assert_int_equal(p.cfg.trainable_on, OFFLOAD_DEVICE);
    snprintf(cmd, sizeof cmd, "%s --plan %s --model %s --data %s --text --steps 2 --threads 2 2>&1", ZO_TRAIN_BIN,
             plan, path, data);
    assert_int_equal(run_capture(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "# LoRA r 4"));
    assert_non_null(strstr(out, "(QLoRA: NF4 base)"));
    remove(plan);
    remove(path);
}

/* `train --plan` runs a plan made for its model and one rank, and refuses a
 * plan made for another model or for more ranks, naming both values. */
static void test_train_refuses_other_plans(void **state)
{
    (void)state;
    char cfg[300], data[300], plan[300], cmd[3000];
    static char out[1 << 16];
    snprintf(cfg, sizeof cfg, "%s/config.json", tmp_dir);
    snprintf(data, sizeof data, "%s/text.txt", tmp_dir);
    snprintf(plan, sizeof plan, "%s/other.json", tmp_dir);
    files_write_text(cfg, tiny_config);
    files_write_sample_text(data, 200);
    zo_model_config tiny, big;
    assert_int_equal(zo_model_config_load(cfg, &tiny), ZO_OK);
    assert_int_equal(zo_model_preset_find("llama-2-13b", &big), ZO_OK);

    /* LLaMA-2-13B on 64 GPUs */
    snprintf(cmd, sizeof cmd, "estimate --model llama-2-13b --hw dgx-h100 --gpus 64 --zero 3 "
             "--plan-out %s", plan);
    int rc = run_program(ZO_MEMPLAN_BIN, cmd, out, sizeof out);
    assert_true(rc == 0 || rc == 1);
    const char *train_args = "--data %s --text --steps 1 --threads 1 --model %s --plan %s";
    char args[1200];
    snprintf(args, sizeof args, train_args, data, cfg, plan);
    assert_int_equal(run_program(ZO_TRAIN_BIN, args, out, sizeof out), 2);
    char want[600];
    snprintf(want, sizeof want, "train: --plan %s: the plan is for model \"llama-2-13b\" of %llu "
             "parameters; the run's model \"%s\" has %llu", plan,
             (unsigned long long)zo_model_params(&big), tiny.name,
             (unsigned long long)zo_model_params(&tiny));
    if (!strstr(out, want)) {
        fprintf(stderr, "train said:\n%s\nwanted: %s\n", out, want);
        fail();
    }
    assert_null(strstr(out, "step 1 loss"));

    /* the tiny model's own plan, for DP 2 */
    assert_true(estimate("--dp 2", plan, out, sizeof out) <= 1);
    assert_int_equal(run_program(ZO_TRAIN_BIN, args, out, sizeof out), 2);
    assert_non_null(strstr(out, "the plan is for 2 ranks (parallel.dp 2 x tp 1 x pp 1); this run has 1"));
    /* and for one rank: it trains */
    assert_true(estimate("", plan, out, sizeof out) <= 1);
    rc = run_program(ZO_TRAIN_BIN, args, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "step 1 loss"));
    /* issue 30: a plan's 8-bit state trains in the CPU optimizer, and its
     * loss in chunks; without an fp32 master on NVMe, the capability
     * table's words */
    assert_true(estimate("--optim adamw8bit --loss-chunk 16", plan, out, sizeof out) <= 1);
    rc = run_program(ZO_TRAIN_BIN, args, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "step 1 loss"));
    /* bf16 weights updated without an fp32 master in the CPU optimizer
     * (each rounding), and QLoRA's recipe (no master, 32-bit AdamW) */
    const char *runs[] = {"--master none --dtype bf16", "--master stochastic --dtype bf16",
                          "--master kahan --dtype bf16 --optim-dtype bf16", "--recipe qlora",
                          /* 8-bit and bf16 m and v in the GPU optimizer */
                          "--optim adamw8bit --params gpu --grads gpu --optimizer gpu",
                          "--optim-dtype bf16 --params gpu --grads gpu --optimizer gpu=0.5,cpu=0.5",
                          /* ... and without an fp32 master (its bf16 weights on the device) */
                          "--master stochastic --dtype bf16 --optim-dtype bf16 --params gpu --grads gpu "
                          "--optimizer gpu=0.5,cpu=0.5",
                          "--master kahan --dtype bf16 --params cpu --optimizer gpu",
                          "--master stochastic --dtype bf16 --params gpu --grads gpu --optimizer gpu"};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        assert_true(estimate(runs[i], plan, out, sizeof out) <= 1);
        rc = run_program(ZO_TRAIN_BIN, args, out, sizeof out);
        if (rc || !strstr(out, "step 1 loss")) fail_msg("train --plan (%s) said:\n%s", runs[i], out);
    }
    const struct {
        const char *flags, *said;
    } gap[] = {
        {"--master kahan --dtype bf16 --optimizer cpu=0.5,nvme=0.5",
         "weights without an fp32 master (--master kahan, training.master) with optimizer state on NVMe "
         "(--optimizer cpu=0.5,nvme=0.5, placement.optimizer) does not run"},
    };
    for (size_t i = 0; i < sizeof gap / sizeof gap[0]; i++) {
        assert_true(estimate(gap[i].flags, plan, out, sizeof out) <= 1);
        assert_int_equal(run_program(ZO_TRAIN_BIN, args, out, sizeof out), 2);
        if (!strstr(out, gap[i].said)) fail_msg("train --plan (%s) said:\n%s", gap[i].flags, out);
    }
    /* a report is not a plan */
    snprintf(cmd, sizeof cmd, "%s estimate --model %s --json > %s", ZO_MEMPLAN_BIN, cfg, plan);
    assert_true(system(cmd) != -1);
    assert_int_equal(run_program(ZO_TRAIN_BIN, args, out, sizeof out), 2);
    assert_non_null(strstr(out, "missing field \"format\" (\"zoffload-plan\")"));
    remove(plan);
    remove(cfg);
    remove(data);
}

/* `train --check-plan`: a 13B plan checked against its model in 8 GB of
 * address space (nothing of the model allocated, no device, no data): the
 * placement and the plan's predicted peaks printed, exit 0; against another
 * model, the refusal a run gives, exit 2; without --plan, exit 2. */
static void test_train_check_plan(void **state)
{
    (void)state;
    char plan[300], cfg[300], cmd[2000];
    static char out[1 << 16];
    snprintf(plan, sizeof plan, "%s/check.json", tmp_dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", tmp_dir);
    files_write_text(cfg, tiny_config);
    snprintf(cmd, sizeof cmd, "estimate --model llama-2-13b --hw h200-141gb --seq 2048 --recompute full "
             "--params cpu --optimizer gpu=0.25,cpu=0.5,nvme=0.25 --plan-out %s", plan);
    int rc = run_program(ZO_MEMPLAN_BIN, cmd, out, sizeof out);
    assert_true(rc == 0 || rc == 1);
    zo_plan *p = malloc(sizeof *p);
    assert_non_null(p);
    assert_int_equal(zo_plan_load(plan, p), ZO_OK);

    /* 8 GB of address space: the shared libraries (cuBLAS in a CUDA build)
     * fit, the 13B model's 26 GB of bf16 weights do not; a sanitizer's
     * shadow memory needs terabytes */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    const char *limit = "";
#else
    const char *limit = "ulimit -v 8000000; ";
#endif
    snprintf(cmd, sizeof cmd, "%s%s --check-plan --plan %s 2>&1", limit, ZO_TRAIN_BIN, plan);
    rc = run_capture(cmd, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    char want[400], b[3][32];
    snprintf(want, sizeof want, "# check-plan: llama-2-13b (llama2), %llu parameters",
             (unsigned long long)zo_model_params(&p->model));
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "# placement: weights cpu (prefetch 2), optimizer cpu 0.50 nvme 0.25 gpu 0.25"));
    snprintf(want, sizeof want, "# plan predicts peak bytes per tier: gpu %s, cpu %s, nvme %s",
             zo_format_bytes(p->predicted.peak_bytes[ZO_PLAN_GPU], b[0], sizeof b[0]),
             zo_format_bytes(p->predicted.peak_bytes[ZO_PLAN_CPU], b[1], sizeof b[1]),
             zo_format_bytes(p->predicted.peak_bytes[ZO_PLAN_NVME], b[2], sizeof b[2]));
    if (!strstr(out, want)) {
        fprintf(stderr, "train said:\n%s\nwanted: %s\n", out, want);
        fail();
    }
    assert_null(strstr(out, "step 1 loss"));

    snprintf(cmd, sizeof cmd, "--check-plan --plan %s --model %s", plan, cfg);
    assert_int_equal(run_program(ZO_TRAIN_BIN, cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "the plan is for model \"llama-2-13b\""));
    assert_int_equal(run_program(ZO_TRAIN_BIN, "--check-plan --model gpt2", out, sizeof out), 2);
    assert_non_null(strstr(out, "--check-plan needs --plan FILE"));
    free(p);
    remove(plan);
    remove(cfg);
}

/* What memplan plans beyond the runtime (issue 33): a plan that recomputes
 * by op is written by memplan and refused by `train --check-plan` by its
 * field, exit 2; one that recomputes 2 of the tiny model's 4 layers, or
 * reduces in bf16, runs (train says so); `memplan plan --json-out` writes
 * only what the runtime runs. */
/* A plan for gpt-oss runs dropless: full fine-tuning, LoRA and QLoRA, on
 * several data-parallel ranks, with expert parallelism; the runtime check
 * names the plan field of a capacity factor. */
static void test_gpt_oss_plan_refusals(void **state)
{
    (void)state;
    zo_plan p;
    memset(&p, 0, sizeof p);
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gpt_oss\", \"num_hidden_layers\": 2, "
                                           "\"hidden_size\": 32, \"num_attention_heads\": 2, "
                                           "\"num_key_value_heads\": 1, \"head_dim\": 16, \"intermediate_size\": 8, "
                                           "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"vocab_size\": 32}",
                                           "gpt_oss.json", &p.model),
                     ZO_OK);
    p.parallel.dp = p.parallel.tp = p.parallel.pp = p.parallel.ep = 1;
    assert_int_equal(zo_plan_runtime_check(&p, "plan.json"), ZO_OK);
    for (int i = 0; i < 4; i++) {
        zo_plan q = p;
        q.training.method = i == 0 ? ZO_PLAN_LORA : i == 1 ? ZO_PLAN_QLORA : ZO_PLAN_FULL;
        if (i >= 2) q.parallel.dp = 2;
        if (i == 3) q.parallel.ep = 2;
        if (zo_plan_runtime_check(&q, "plan.json") != ZO_OK) fail_msg("case %d: %s", i, zo_last_error());
    }
    zo_plan q = p;
    q.parallel.capacity_factor = 1.25;
    assert_int_equal(zo_plan_runtime_check(&q, "plan.json"), ZO_ERR_UNSUPPORTED);
    if (!strstr(zo_last_error(), "field \"parallel.capacity_factor\" on gpt-oss")) fail_msg("%s", zo_last_error());
}

static void test_train_refuses_partial_recompute(void **state)
{
    (void)state;
    char plan[300], cfg[300], cmd[2000];
    static char out[1 << 16];
    snprintf(plan, sizeof plan, "%s/partial.json", tmp_dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", tmp_dir);
    files_write_text(cfg, tiny_config);
    /* plans that run (issue 33): part of the layers, by op, a bf16 reduction */
    static const struct { const char *flags, *says; } ok[] = {
        {"--recompute full --recompute-layers 2", "recompute full of the first 2 layers"},
        {"--recompute ops", "recompute ops (every other matmul)"},
        {"--reduce-dtype bf16", "gradients reduced in bf16"},
    };
    snprintf(cmd, sizeof cmd, "--check-plan --plan %s --model %s", plan, cfg);
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_true(estimate(ok[i].flags, plan, out, sizeof out) <= 1);
        assert_int_equal(run_program(ZO_TRAIN_BIN, cmd, out, sizeof out), 0);
        if (!strstr(out, ok[i].says)) {
            fprintf(stderr, "train said:\n%s\nwanted: %s\n", out, ok[i].says);
            fail();
        }
    }
    /* K more than the model's layers, K without recompute, K beside host checkpoints */
    static const struct { const char *flags, *why; } k[] = {
        {"--recompute full --recompute-layers 5", "--recompute-layers 5 (training.recompute_layers): the model"},
        {"--recompute-layers 2", "--recompute-layers K needs --recompute full"},
        {"--recompute full --recompute-layers 2 --checkpoints-on cpu", "host checkpoints need every layer"},
        {"--recompute ops --recompute-layers 2", "--recompute-layers K needs --recompute full"},
        {"--recompute ops --checkpoints-on cpu", "--checkpoints cpu needs --recompute full"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        snprintf(cmd, sizeof cmd, "--model %s --data %s %s", cfg, cfg, k[i].flags);
        assert_int_equal(run_program(ZO_TRAIN_BIN, cmd, out, sizeof out), 2);
        if (!strstr(out, k[i].why)) {
            fprintf(stderr, "train %s said:\n%s\nwanted: %s\n", cmd, out, k[i].why);
            fail();
        }
    }
    /* the search's plan file: recompute none or full of every layer (ops only when asked) */
    snprintf(cmd, sizeof cmd, "plan --model %s --gpu-mem 3MiB --cpu-mem 1GiB --nvme 1GiB --seq 64 "
             "--global-batch 4 --cuda-context 0 --cublas-workspace 0 --fragmentation 0 --json-out %s",
             cfg, plan);
    int rc = run_program(ZO_MEMPLAN_BIN, cmd, out, sizeof out);
    assert_true(rc == 0 || rc == 1);
    if (rc == 0) {
        zo_plan p;
        assert_int_equal(zo_plan_load(plan, &p), ZO_OK);
        assert_int_equal(p.training.recompute_layers, 0);
        assert_true(p.training.recompute != ZO_PLAN_RECOMPUTE_OPS);
    }
    remove(plan);
    remove(cfg);
}
#endif

#ifdef ZO_MEMPLAN_BIN
/* One --json convention in every command: --json prints the command's JSON
 * on stdout (nothing else), --json-out FILE writes it beside the table
 * (plan --json took a FILE, max-model --json demanded a value and wrote
 * nothing). */
static void test_memplan_json_convention(void **state)
{
    (void)state;
    static char out[1 << 18];
    char args[1500], path[400];
    snprintf(path, sizeof path, "%s/out.json", tmp_dir);
    const char *plan_flags = "plan --model llama-2-7b --hw dgx-a100-80gb --gpus 8 --global-batch 64 --top 2";
    const char *cmds[] = {"estimate --model gpt2 --seq 128", plan_flags,
                          "max-model --family llama --gpu rtx-4090 --strategy zero-offload"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        /* --json: stdout is one JSON document */
        snprintf(args, sizeof args, "%s %s --json 2>/dev/null", ZO_MEMPLAN_BIN, cmds[i]);
        int rc = run_capture(args, out, sizeof out);
        assert_true(rc == 0 || rc == 1);
        cJSON *a = cJSON_Parse(out);
        if (!a) {
            fprintf(stderr, "memplan %s: stdout is not JSON:\n%.400s\n", args, out);
            fail();
        }
        /* --json-out FILE: the same document in FILE, the table on stdout */
        remove(path);
        snprintf(args, sizeof args, "%s %s --json-out %s 2>/dev/null", ZO_MEMPLAN_BIN, cmds[i], path);
        assert_int_equal(run_capture(args, out, sizeof out), rc);
        assert_null(cJSON_Parse(out));
        char *text = files_read_text(path);
        cJSON *b = cJSON_Parse(text);
        assert_non_null(b);
        if (i == 1) { /* plan: the document is the best plan, as train reads it */
            zo_plan p;
            assert_int_equal(zo_plan_read(text, strlen(text), path, &p), ZO_OK);
            assert_non_null(strstr(out, "best: "));
        }
        assert_true(cJSON_Compare(a, b, 1) || i == 1); /* the plan's timings are rounded the same */
        cJSON_Delete(a);
        cJSON_Delete(b);
        free(text);
    }
    /* the old plan --json FILE is refused, saying what to use */
    snprintf(args, sizeof args, "%s --json %s", plan_flags, path);
    assert_int_equal(run_program(ZO_MEMPLAN_BIN, args, out, sizeof out), 2);
    assert_non_null(strstr(out, "--json-out FILE writes it to FILE"));
    remove(path);
}

/* --version and -h/--help after every command (issue 27: `memplan estimate
 * --version` was an unknown option): the version line or the command's
 * usage on stdout, exit 0; a listing given anything else exits 2. */
static void test_memplan_version_help(void **state)
{
    (void)state;
    static char out[1 << 16];
    char args[256];
    const char *cmds[] = {"estimate", "plan", "max-model", "calibrate", "generate", "models", "hardware"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        snprintf(args, sizeof args, "%s --version", cmds[i]);
        int rc = run_program(ZO_MEMPLAN_BIN, args, out, sizeof out);
        if (rc || strstr(out, "memplan (zoffload) ") != out) fprintf(stderr, "memplan %s: exit %d\n%s\n", args, rc, out);
        assert_int_equal(rc, 0);
        assert_ptr_equal(strstr(out, "memplan (zoffload) "), out);
        for (int h = 0; h < 2; h++) {
            snprintf(args, sizeof args, "%s %s", cmds[i], h ? "-h" : "--help");
            rc = run_program(ZO_MEMPLAN_BIN, args, out, sizeof out);
            char want[64];
            snprintf(want, sizeof want, "usage: memplan %s", cmds[i]);
            if (rc || strstr(out, want) != out) fprintf(stderr, "memplan %s: exit %d\n%s\n", args, rc, out);
            assert_int_equal(rc, 0);
            assert_ptr_equal(strstr(out, want), out);
        }
    }
    assert_int_equal(run_program(ZO_MEMPLAN_BIN, "models --bogus", out, sizeof out), 2);
    assert_non_null(strstr(out, "'--bogus'"));
}

/* A layout the flags rule out everywhere is said, naming the flag, exit 2
 * (issue 27: `plan --gpus 2 --tp 2` on a preset of one GPU a node printed
 * "searched 0 configurations" and "nothing fits: more GPUs"). */
static void test_memplan_plan_nothing_searched(void **state)
{
    (void)state;
    static char out[1 << 16];
    const struct {
        const char *args, *want;
    } v[] = {
        {"plan --model llama-2-7b --hw a100-80gb --gpus 2 --tp 2", "--tp 2: tensor parallelism runs within a node, "
                                                                   "and a100-80gb has 1 GPU a node"},
        {"plan --model llama-2-7b --hw dgx-a100-80gb --gpus 8 --tp 3", "--tp 3 does not divide the 8 GPUs"},
        {"plan --model llama-2-7b --hw dgx-a100-80gb --gpus 8 --pp 3", "--pp 3 does not divide the 8 GPUs left by --tp 1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        int rc = run_program(ZO_MEMPLAN_BIN, v[i].args, out, sizeof out);
        if (rc != 2 || !strstr(out, v[i].want)) fprintf(stderr, "memplan %s: exit %d\n%s\n", v[i].args, rc, out);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(out, v[i].want));
        assert_null(strstr(out, "nothing fits"));
    }
    /* a layout that runs is searched as before */
    assert_int_equal(run_program(ZO_MEMPLAN_BIN, "plan --model llama-2-7b --hw dgx-a100-80gb --gpus 8 --tp 2 --top 1",
                                 out, sizeof out), 0);
    assert_non_null(strstr(out, "best: "));
}
#endif

int main(void)
{
    scratch_path(tmp_dir, sizeof tmp_dir, "zo_test_plan_schema_%d", (int)getpid());
    mkdir(tmp_dir, 0755);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_required_and_unknown),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_method),
        cmocka_unit_test(test_check_run),
        cmocka_unit_test(test_added_fields),
#if defined(ZO_MEMPLAN_BIN) && defined(ZO_TRAIN_BIN)
        cmocka_unit_test(test_limits_memplan_runtime),
        cmocka_unit_test(test_train_refuses_other_plans),
        cmocka_unit_test(test_train_check_plan),
        cmocka_unit_test(test_train_flags_as_memplan),
        cmocka_unit_test(test_train_refuses_partial_recompute),
        cmocka_unit_test(test_runtime_reads_lora),
#endif
#ifdef ZO_MEMPLAN_BIN
        cmocka_unit_test(test_memplan_json_convention),
        cmocka_unit_test(test_memplan_version_help),
        cmocka_unit_test(test_memplan_plan_nothing_searched),
        cmocka_unit_test(test_gpt_oss_plan_refusals),
#endif
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd)) {}
    return rc;
}
