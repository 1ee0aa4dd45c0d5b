/* LoRA adapter layouts with PEFT's names, and PEFT adapter directories. */
#include "lora.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common/fileio.h" /* defines: zo_file_read_all, zo_file_write_all */
#include "common/json.h"   /* defines: zo_json_parse */
#include "safetensors.h"   /* defines: model_save, model_load_path */

/* The weight an adapter sits beside (GPT-2's c_attn and Phi-3's qkv_proj:
 * the QKV view; Phi-3's gate_up_proj: the GATE_UP view). */
static model_role role_of(const zo_lora_module *m)
{
    switch (m->latent) { /* DeepSeek-V2's latent attention's projections */
    case ZO_LORA_LATENT_Q_A: return MODEL_ROLE_Q_A_W;
    case ZO_LORA_LATENT_Q_B: return MODEL_ROLE_Q_B_W;
    case ZO_LORA_LATENT_KV_A: return MODEL_ROLE_KV_A_W;
    case ZO_LORA_LATENT_KV_B: return MODEL_ROLE_KV_B_W;
    case ZO_LORA_LATENT_NONE: break;
    }
    if (m->experts)
        return m->targets == ZO_LORA_GATE ? MODEL_ROLE_EXPERT_GATE_W
               : m->targets == ZO_LORA_UP ? MODEL_ROLE_EXPERT_UP_W
                                          : MODEL_ROLE_EXPERT_DOWN_W;
    switch (m->targets) {
    case ZO_LORA_Q: return MODEL_ROLE_Q_W;
    case ZO_LORA_K: return MODEL_ROLE_K_W;
    case ZO_LORA_V: return MODEL_ROLE_V_W;
    case ZO_LORA_O: return MODEL_ROLE_ATTN_OUT_W;
    case ZO_LORA_GATE: return MODEL_ROLE_MLP_GATE_W;
    case ZO_LORA_UP: return MODEL_ROLE_MLP_UP_W;
    case ZO_LORA_DOWN: return MODEL_ROLE_MLP_DOWN_W;
    case ZO_LORA_GATE | ZO_LORA_UP: return MODEL_ROLE_MLP_GATE_UP_W;
    default: return MODEL_ROLE_QKV_W;
    }
}

zo_status model_lora_layout_init(model_layout *l, const zo_model_config *cfg, const zo_lora_config *lc)
{
    return model_lora_layout_init_experts(l, cfg, lc, 0, cfg->moe.experts);
}

zo_status model_lora_layout_init_experts(model_layout *l, const zo_model_config *cfg_in, const zo_lora_config *lc,
                                         int first, int count)
{
    zo_status st;
    memset(l, 0, sizeof *l);
    zo_model_config cfg = *cfg_in;
    if (first < 0 || count < 1 - !cfg.moe.experts || first + count > cfg.moe.experts)
        return zo_error(ZO_ERR_INVALID, "LoRA layout: %s: experts %d..%d of its %d", cfg.name, first,
                        first + count - 1, cfg.moe.experts);
    if ((st = zo_model_config_validate(&cfg)) != ZO_OK) return zo_error_wrap(st, "LoRA layout: %s", cfg.name);
    if ((st = zo_lora_check(&cfg, lc)) != ZO_OK) return zo_error_wrap(st, "LoRA layout: %s", cfg.name);
    zo_lora_module mods[ZO_LORA_MAX_MODULES];
    int nm;
    l->cfg = cfg;
    l->expert_first = first;
    l->expert_count = count;
    l->n_layers = cfg.n_layers;
    l->n_blocks = cfg.n_layers + 2;
    l->n_tensors = 0;
    /* (each layer's own modules: DeepSeek's dense first layers have LLaMA's MLP) */
    for (int layer = 0; layer < cfg.n_layers; layer++) {
        nm = zo_lora_layer_modules_at(&cfg, layer, lc->targets, mods);
        for (int j = 0; j < nm; j++) l->n_tensors += 2 * (mods[j].experts ? count : 1);
    }
    l->block_numel = calloc((size_t)l->n_blocks, sizeof *l->block_numel);
    l->views = calloc((size_t)l->n_blocks * MODEL_ROLE_COUNT, sizeof *l->views);
    l->tensors = calloc(l->n_tensors ? (size_t)l->n_tensors : 1, sizeof *l->tensors);
    if (!l->block_numel || !l->views || !l->tensors) {
        model_layout_free(l);
        return zo_error(ZO_ERR_NOMEM, "LoRA layout: %s: out of host memory", cfg.name);
    }
    const char *prefix = zo_model_neox(&cfg)       ? "gpt_neox.layers"
                         : zo_model_opt(&cfg)      ? "model.decoder.layers"
                         : zo_model_phi(&cfg) || zo_model_starcoder2(&cfg) ? "model.layers"
                         : cfg.mm_text             ? "model.language_model.layers" /* multimodal */
                         : cfg.arch == ZO_ARCH_GPT ? "transformer.h" /* GPT-2, Falcon, GPT-J */
                                                   : "model.layers";
    int k = 0;
    for (int layer = 0; layer < cfg.n_layers; layer++) {
        int blk = model_layout_layer_block(layer);
        nm = zo_lora_layer_modules_at(&cfg, layer, lc->targets, mods);
        for (int j = 0; j < nm; j++) {
            /* a routed expert's adapters lie together, expert after expert
             * (every expert module of the layer at the first of them) */
            int experts = mods[j].experts, last = j;
            if (experts)
                while (last + 1 < nm && mods[last + 1].experts) last++;
            for (int e = experts ? first : 0; e < (experts ? first + count : 1); e++)
                for (int i = j; i <= last; i++)
                    for (int part = MODEL_LORA_A; part <= MODEL_LORA_B; part++) {
                        model_tensor *t = &l->tensors[k++];
                        char path[128];
                        snprintf(t->name, sizeof t->name, "base_model.model.%s.%d.%s.lora_%c.weight", prefix,
                                 layer, zo_lora_module_path(&mods[i], e, path, sizeof path),
                                 part == MODEL_LORA_A ? 'A' : 'B');
                        t->block = blk;
                        t->role = role_of(&mods[i]);
                        t->layer = layer;
                        t->lora = part;
                        t->offset = l->block_numel[blk];
                        t->ndim = 2;
                        t->shape[0] = part == MODEL_LORA_A ? lc->r : mods[i].out;
                        t->shape[1] = part == MODEL_LORA_A ? mods[i].in : lc->r;
                        t->numel = (size_t)(t->shape[0] * t->shape[1]);
                        /* GPT-NeoX's and Falcon's query_key_value: lora_B's rows as the weight's */
                        if (part == MODEL_LORA_B && zo_model_qkv_grouped(&cfg) && t->role == MODEL_ROLE_QKV_W)
                            model_tensor_set_head_rows(t, &cfg);
                        /* GPT-J's and Cohere's q_proj and k_proj: lora_B's rotary pairs as the weight's */
                        if (part == MODEL_LORA_B && zo_model_rot_interleaved(&cfg) &&
                            (t->role == MODEL_ROLE_Q_W || t->role == MODEL_ROLE_K_W))
                            model_tensor_set_rot_pairs(t, &cfg);
                        /* DeepSeek-V2's: lora_B's rotary rows as the weight's */
                        if (part == MODEL_LORA_B && cfg.mla.kv_rank &&
                            (t->role == MODEL_ROLE_Q_W || t->role == MODEL_ROLE_Q_B_W))
                            model_tensor_set_rope_rows(t, cfg.mla.qk_rope, cfg.mla.qk_nope + cfg.mla.qk_rope, cfg.mla.qk_nope);
                        if (part == MODEL_LORA_B && cfg.mla.kv_rank && t->role == MODEL_ROLE_KV_A_W)
                            model_tensor_set_rope_rows(t, cfg.mla.qk_rope, cfg.mla.kv_rank + cfg.mla.qk_rope, cfg.mla.kv_rank);
                        l->block_numel[blk] += t->numel;
                    }
            j = last;
        }
    }
    for (int b = 0; b < l->n_blocks; b++) l->total_numel += l->block_numel[b];
    /* (the experts outside the window: their adapters) */
    uint64_t outside = 0;
    nm = zo_lora_layer_modules(&cfg, lc->targets, mods);
    for (int j = 0; j < nm; j++)
        if (mods[j].experts)
            outside += (uint64_t)(cfg.moe.experts - count) * (uint64_t)lc->r * (uint64_t)(mods[j].in + mods[j].out);
    outside *= (uint64_t)zo_model_moe_layers(&cfg);
    uint64_t want = zo_lora_trainable_params(&cfg, lc->r, lc->targets) - outside;
    if ((uint64_t)l->total_numel != want) {
        model_layout_free(l);
        return zo_error(ZO_ERR_INTERNAL, "LoRA layout: %s: laid out %zu, PEFT counts %llu", cfg.name,
                        l->total_numel, (unsigned long long)want);
    }
    if ((st = model_layout_index(l)) != ZO_OK) model_layout_free(l);
    return st;
}

/* ---- files ----------------------------------------------------------------------------- */

static void join(char *out, size_t len, const char *dir, const char *file)
{
    snprintf(out, len, "%s/%s", dir, file);
}

/* Block pointers for model_save / model_load: empty blocks point at a dummy. */
static void **block_ptrs(const model_layout *l, const void *const *blocks, void *dummy)
{
    void **p = calloc((size_t)l->n_blocks, sizeof *p);
    if (!p) return NULL;
    for (int b = 0; b < l->n_blocks; b++) p[b] = l->block_numel[b] && blocks[b] ? (void *)blocks[b] : dummy;
    return p;
}

static cJSON *config_json(const zo_model_config *cfg, const zo_lora_config *lc, const char *base_model)
{
    cJSON *o = cJSON_CreateObject(), *targets = cJSON_CreateArray();
    if (!o || !targets) {
        cJSON_Delete(o);
        cJSON_Delete(targets);
        return NULL;
    }
    zo_lora_module mods[ZO_LORA_MAX_MODULES];
    int nm = zo_lora_layer_modules(cfg, lc->targets, mods);
    for (int j = 0; j < nm; j++) {
        int seen = 0; /* Qwen2-MoE: the experts' and the shared expert's gate_proj are one entry */
        for (int i = 0; i < j; i++) seen |= !strcmp(mods[i].peft, mods[j].peft);
        if (!seen) cJSON_AddItemToArray(targets, cJSON_CreateString(mods[j].peft));
    }
    cJSON_AddStringToObject(o, "peft_type", "LORA");
    cJSON_AddStringToObject(o, "task_type", "CAUSAL_LM");
    if (base_model && *base_model)
        cJSON_AddStringToObject(o, "base_model_name_or_path", base_model);
    else
        cJSON_AddNullToObject(o, "base_model_name_or_path");
    cJSON_AddNumberToObject(o, "r", lc->r);
    cJSON_AddNumberToObject(o, "lora_alpha", lc->alpha);
    cJSON_AddNumberToObject(o, "lora_dropout", 0.0);
    cJSON_AddItemToObject(o, "target_modules", targets);
    cJSON_AddStringToObject(o, "bias", "none");
    /* GPT-2's Conv1D weights are [in, out]; GPT-NeoX's, Falcon's, OPT's,
     * Phi's, GPT-J's and StarCoder2's Linear ones are not */
    cJSON_AddBoolToObject(o, "fan_in_fan_out",
                          cfg->arch == ZO_ARCH_GPT && !zo_model_qkv_grouped(cfg) && !zo_model_opt(cfg) &&
                              !zo_model_phi(cfg) && !zo_model_gptj(cfg) && !zo_model_starcoder2(cfg));
    cJSON_AddBoolToObject(o, "inference_mode", 1);
    cJSON_AddBoolToObject(o, "init_lora_weights", 1);
    cJSON_AddNullToObject(o, "modules_to_save");
    return o;
}

char *model_lora_config_text(const zo_model_config *cfg, const zo_lora_config *lc, const char *base_model)
{
    cJSON *o = config_json(cfg, lc, base_model);
    char *text = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    return text;
}

zo_status model_lora_save(const char *dir, const model_layout *adapters, const zo_lora_config *lc,
                          const char *base_model, const void *const *blocks, zo_dtype buf_dt,
                          zo_dtype file_dt)
{
    zo_status st;
    char path[4096];
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return zo_error(ZO_ERR_IO, "%s: cannot create the adapter directory: %s", dir, strerror(errno));
    float dummy = 0.0f;
    void **ptrs = block_ptrs(adapters, blocks, &dummy);
    char *text = model_lora_config_text(&adapters->cfg, lc, base_model);
    if (!ptrs || !text) {
        st = zo_error(ZO_ERR_NOMEM, "%s: out of host memory for the adapter files", dir);
        goto out_free;
    }
    join(path, sizeof path, dir, MODEL_LORA_WEIGHTS);
    if ((st = model_save(path, adapters, (const void *const *)ptrs, buf_dt, file_dt)) != ZO_OK) goto out_free;
    join(path, sizeof path, dir, MODEL_LORA_CONFIG);
    st = zo_file_write_all(path, text, strlen(text));
out_free:
    free(text);
    free(ptrs);
    return st;
}

/* Whether PEFT's entry reaches the module at `path`: the name itself or
 * its end after a dot. */
static int entry_matches(const char *path, const char *entry)
{
    size_t ml = strlen(path), el = strlen(entry);
    return ml >= el && !strcmp(path + ml - el, entry) && (ml == el || path[ml - el - 1] == '.');
}

/* One target_modules entry as target bits, PEFT's way: an entry matches a
 * module whose name is the entry or ends with "." + the entry, so "c_proj"
 * is both of GPT-2's projections, "attn.c_proj" the attention's only, and
 * "self_attn.q_proj" every layer's q_proj. A dotted entry naming the
 * module under a longer path ("model.layers.0.self_attn.q_proj", an MoE's
 * "experts.0.w1") adapts some layers or experts only: refused, as is one
 * reaching some of the modules of a target only, unless the list's other
 * entries name the rest (Qwen2-MoE's "shared_expert.gate_proj": the
 * routed experts' gate_proj too or neither; DeepSeek-V2's
 * "kv_a_proj_with_mqa" with "kv_b_proj"), the router of an MoE layer ("gate": block_sparse_moe.gate,
 * mlp.gate; shared_expert_gate), which carries no adapters here, and one
 * matching nothing. A plain name of no module of this architecture goes by
 * its target name (gate_proj on GPT-2: zo_lora_check refuses it, naming
 * the target). */
/* Whether an entry of PEFT's list `list` reaches the module at `mpath`. */
static int list_matches(const cJSON *list, const char *mpath)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
    if (cJSON_IsString(e) && entry_matches(mpath, e->valuestring)) return 1;
    return 0;
}

/* (`list`: the whole target_modules list, whose other entries may name the
 * rest of a target's modules: DeepSeek-V2's q_a_proj with q_b_proj,
 * kv_a_proj_with_mqa with kv_b_proj) */
static zo_status module_bits(const char *path, const zo_model_config *cfg, const char *entry, const cJSON *list,
                             unsigned *bits)
{
    /* an MoE layer's modules, and a dense first layer's (DeepSeek's) */
    zo_lora_module mods[2 * ZO_LORA_MAX_MODULES];
    int n = zo_lora_layer_modules(cfg, ZO_LORA_ALL_LINEAR, mods), hit[2 * ZO_LORA_MAX_MODULES] = {0};
    if (cfg->moe.experts && cfg->moe.first_dense) n += zo_lora_layer_modules_at(cfg, 0, ZO_LORA_ALL_LINEAR, mods + n);
    *bits = 0;
    int deeper = 0;
    for (int i = 0; i < n; i++) {
        if ((hit[i] = entry_matches(mods[i].path, entry)))
            *bits |= mods[i].targets;
        else if (entry_matches(entry, mods[i].path))
            deeper = 1;
    }
    for (int i = 0; i < n; i++)
        if ((mods[i].targets & *bits) && !hit[i] && !(!mods[i].experts && list_matches(list, mods[i].path)))
            return zo_error(ZO_ERR_UNSUPPORTED, "%s: \"target_modules\": \"%s\" reaches some of the modules "
                            "this runtime adapts together only (not %s%s%s): name the module every layer's "
                            "experts and shared expert answer to (\"%s\")", path, entry,
                            mods[i].experts ? mods[i].expert_path : mods[i].path, mods[i].experts ? ".N." : "",
                            mods[i].experts ? mods[i].path : "", mods[i].peft);
    if (*bits) return ZO_OK;
    if (cfg->moe.experts) {
        const char *router = zo_model_mixtral_names(cfg)    ? "block_sparse_moe.gate"
                             : zo_model_granitemoe(cfg)          ? "block_sparse_moe.router.layer"
                                                                 : "mlp.gate";
        if (entry_matches(router, entry) || entry_matches("mlp.shared_expert_gate", entry))
            return zo_error(ZO_ERR_UNSUPPORTED, "%s: \"target_modules\": \"%s\" is the router of a "
                            "mixture-of-experts layer (%s, shared_expert_gate), which carries no adapters here: "
                            "adapters go on the attention's and the experts' projections", path, entry, router);
    }
    if (deeper)
        return zo_error(ZO_ERR_UNSUPPORTED, "%s: \"target_modules\": \"%s\" names the module of particular layers "
                        "or experts: only names every layer's module answers to (\"q_proj\", "
                        "\"self_attn.q_proj\", \"w1\") are supported", path, entry);
    if (!strchr(entry, '.') && zo_lora_targets_parse(entry, bits) == ZO_OK && *bits != ZO_LORA_ALL_LINEAR)
        return ZO_OK;
    return zo_error(ZO_ERR_UNSUPPORTED, "%s: \"target_modules\": \"%s\" is not a linear layer of a transformer layer",
                    path, entry);
}

/* A value that asks for nothing: absent, null, false, "", [] or {}. */
static int is_off(const cJSON *v)
{
    return !v || cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsString(v) && !v->valuestring[0]) ||
           ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !cJSON_GetArraySize(v));
}

/* The fields of PEFT's LoraConfig this reader reads or checks below, and
 * those that change nothing in what trained adapters compute (bookkeeping,
 * training-time dropout, settings of features that are off). */
static const char *const read_fields[] = {
    "r", "lora_alpha", "target_modules", "use_rslora", "init_lora_weights", "peft_type", "task_type", "bias",
    "base_model_name_or_path", "revision", "inference_mode", "auto_mapping", "peft_version", "lora_dropout",
    "fan_in_fan_out", "layers_pattern", "megatron_core", "qalora_group_size", "runtime_config", "eva_config",
    "ensure_weight_tying",
};

/* Fields that change what the adapters compute, or the base they sit on:
 * supported only off. */
static const struct {
    const char *name, *what;
} off_fields[] = {
    {"use_dora", "DoRA's magnitude vectors"},
    {"lora_bias", "a bias on lora_B"},
    {"modules_to_save", "whole modules trained and saved beside the adapters"},
    {"layers_to_transform", "adapters on some layers only"},
    {"rank_pattern", "ranks per module"},
    {"alpha_pattern", "alphas per module"},
    {"exclude_modules", "modules taken out of target_modules"},
    {"layer_replication", "layers stacked again, each with adapters of its own"},
    {"target_parameters", "adapters on parameters (MoE experts), not on linear layers"},
    {"trainable_token_indices", "embedding rows trained beside the adapters"},
    {"alora_invocation_tokens", "adapters active only after an invocation (aLoRA)"},
    {"use_qalora", "QALoRA's pooled inputs"},
    {"megatron_config", "Megatron's parallel layers"},
    {"loftq_config", "LoftQ's quantized base"},
    {"corda_config", "CorDA's decomposed base"},
    {"lora_ga_config", "LoRA-GA's offset base"},
    {"velora_config", "VeLoRA's compressed activations"},
    {"monteclora_config", "Monte Carlo sampled adapters"},
    {"use_bdlora", "block-diagonal factors"},
    {"arrow_config", "Arrow's routing among adapters"},
    {"kasa_config", "KaSA's truncated base and singular values"},
};

/* init_lora_weights: how PEFT initialises the adapters before the trained
 * weights are loaded over them. Those that leave the base as it is change
 * nothing here; those that rewrite the base (W minus a part PEFT recomputes
 * on every load) or freeze lora_B in training do. */
static zo_status check_init(const char *path, const cJSON *v)
{
    if (!v || cJSON_IsNull(v) || cJSON_IsBool(v)) return ZO_OK; /* true: Kaiming A, zero B; false: random */
    if (!cJSON_IsString(v))
        return zo_error(ZO_ERR_FORMAT, "%s: \"init_lora_weights\" must be true, false or a method's name", path);
    const char *m = v->valuestring;
    static const char *const base_kept[] = {"gaussian", "eva", "orthogonal"};
    for (size_t i = 0; i < sizeof base_kept / sizeof base_kept[0]; i++)
        if (!strcmp(m, base_kept[i])) return ZO_OK;
    static const char *const base_changed[] = {"pissa", "olora", "corda", "loftq", "lora_ga"};
    for (size_t i = 0; i < sizeof base_changed / sizeof base_changed[0]; i++)
        if (!strcmp(m, base_changed[i]) || (!strcmp(base_changed[i], "pissa") && !strncmp(m, "pissa_niter_", 12)))
            return zo_error(ZO_ERR_UNSUPPORTED, "%s: \"init_lora_weights\": \"%s\" changes the base weights (PEFT "
                            "subtracts a part of them that the adapters take over), and this runtime trains on the "
                            "base as it is: not supported (convert the adapter to plain LoRA with PEFT's "
                            "path_initial_model_for_weight_conversion)", path, m);
    if (!strcmp(m, "mica"))
        return zo_error(ZO_ERR_UNSUPPORTED, "%s: \"init_lora_weights\": \"mica\" freezes lora_B in training, which "
                        "this runtime trains: not supported", path);
    return zo_error(ZO_ERR_UNSUPPORTED, "%s: \"init_lora_weights\": \"%s\" is not known here: not supported", path, m);
}

/* Every field of the config: read below, harmless, off, or refused by name. */
static zo_status refuse_unsupported(const char *path, const cJSON *root)
{
    for (const cJSON *f = root->child; f; f = f->next) {
        int known = 0;
        for (size_t i = 0; i < sizeof read_fields / sizeof read_fields[0] && !known; i++)
            known = !strcmp(f->string, read_fields[i]);
        for (size_t i = 0; i < sizeof off_fields / sizeof off_fields[0] && !known; i++) {
            if (strcmp(f->string, off_fields[i].name)) continue;
            if (!is_off(f))
                return zo_error(ZO_ERR_UNSUPPORTED, "%s: \"%s\" is not supported (%s; only plain LoRA adapters)",
                                path, f->string, off_fields[i].what);
            known = 1;
        }
        if (!known && !is_off(f))
            return zo_error(ZO_ERR_UNSUPPORTED, "%s: \"%s\" is not a field this reader knows (a newer PEFT's?): "
                            "refused, as it may change what the adapters compute", path, f->string);
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "LORA")))
        return zo_error(ZO_ERR_UNSUPPORTED, "%s: \"peft_type\" must be \"LORA\"", path);
    const cJSON *task = cJSON_GetObjectItemCaseSensitive(root, "task_type");
    if (task && !cJSON_IsNull(task) && !(cJSON_IsString(task) && !strcmp(task->valuestring, "CAUSAL_LM")))
        return zo_error(ZO_ERR_UNSUPPORTED, "%s: \"task_type\": \"%s\" is not supported (a causal LM's adapters "
                        "only, CAUSAL_LM: another task has another head)", path,
                        cJSON_IsString(task) ? task->valuestring : "(not a string)");
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "bias");
    if (bias && !(cJSON_IsString(bias) && !strcmp(bias->valuestring, "none")))
        return zo_error(ZO_ERR_UNSUPPORTED, "%s: \"bias\": only \"none\" is supported", path);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "use_rslora");
    if (rs && !cJSON_IsBool(rs) && !cJSON_IsNull(rs))
        return zo_error(ZO_ERR_FORMAT, "%s: \"use_rslora\" must be true or false", path);
    return check_init(path, cJSON_GetObjectItemCaseSensitive(root, "init_lora_weights"));
}

static zo_status parse_targets(const char *path, const zo_model_config *cfg, const cJSON *tm, unsigned *out)
{
    *out = 0;
    if (cJSON_IsString(tm)) {
        if (!strcmp(tm->valuestring, "all-linear")) {
            *out = ZO_LORA_ALL_LINEAR;
            return ZO_OK;
        }
        return zo_error(ZO_ERR_UNSUPPORTED,
                        "%s: \"target_modules\": the pattern \"%s\" is not supported (a list of "
                        "module names, or \"all-linear\")",
                        path, tm->valuestring);
    }
    if (!cJSON_IsArray(tm) || !cJSON_GetArraySize(tm))
        return zo_error(ZO_ERR_FORMAT, "%s: \"target_modules\" must be a non-empty list of names", path);
    const cJSON *e;
    cJSON_ArrayForEach(e, tm)
    {
        unsigned bits;
        if (!cJSON_IsString(e))
            return zo_error(ZO_ERR_FORMAT, "%s: \"target_modules\" holds something other than a name", path);
        zo_status st = module_bits(path, cfg, e->valuestring, tm, &bits);
        if (st != ZO_OK) return st;
        *out |= bits;
    }
    return ZO_OK;
}

zo_status model_lora_read_config(const char *dir, const zo_model_config *cfg, zo_lora_config *lc,
                                 char *base_model, size_t base_len)
{
    char path[4096], *text;
    size_t len;
    zo_status st;
    join(path, sizeof path, dir, MODEL_LORA_CONFIG);
    if ((st = zo_file_read_all(path, 1u << 20, "an adapter config", &text, &len)) != ZO_OK) return st;
    st = model_lora_parse_config(text, len, path, cfg, lc, base_model, base_len);
    free(text);
    return st;
}

zo_status model_lora_parse_config(const char *text, size_t len, const char *path, const zo_model_config *cfg,
                                  zo_lora_config *lc, char *base_model, size_t base_len)
{
    cJSON *root;
    zo_status st = zo_json_parse(text, len, path, &root); /* keys given twice refused too */
    if (st != ZO_OK) return st;
    if (!cJSON_IsObject(root)) {
        st = zo_error(ZO_ERR_FORMAT, "%s: not a JSON object", path);
        goto out_free_root;
    }
    if ((st = refuse_unsupported(path, root)) != ZO_OK) goto out_free_root;
    memset(lc, 0, sizeof *lc);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
    if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > 1 << 20 ||
        r->valuedouble != (int)r->valuedouble) {
        st = zo_error(ZO_ERR_FORMAT, "%s: \"r\" must be a positive integer", path);
        goto out_free_root;
    }
    lc->r = (int)r->valuedouble;
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    lc->alpha = 8.0f; /* PEFT's default */
    if (alpha) {
        if (!cJSON_IsNumber(alpha)) {
            st = zo_error(ZO_ERR_FORMAT, "%s: \"lora_alpha\" must be a number", path);
            goto out_free_root;
        }
        lc->alpha = (float)alpha->valuedouble;
    }
    /* rank-stabilised LoRA scales by alpha / sqrt(r): plain LoRA's alpha / r
     * with alpha * sqrt(r), which is what is kept (and saved) */
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "use_rslora")))
        lc->alpha = (float)((alpha ? alpha->valuedouble : 8.0) * sqrt((double)lc->r));
    if ((st = parse_targets(path, cfg, cJSON_GetObjectItemCaseSensitive(root, "target_modules"),
                            &lc->targets)) != ZO_OK)
        goto out_free_root;
    if ((st = zo_lora_check(cfg, lc)) != ZO_OK) {
        st = zo_error_wrap(st, "%s", path);
        goto out_free_root;
    }
    if (base_model && base_len) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "base_model_name_or_path");
        snprintf(base_model, base_len, "%s", cJSON_IsString(b) ? b->valuestring : "");
    }
out_free_root:
    cJSON_Delete(root);
    return st;
}

zo_status model_lora_load(const char *dir, const model_layout *adapters, void *const *blocks,
                          zo_dtype dt)
{
    char path[4096];
    join(path, sizeof path, dir, MODEL_LORA_WEIGHTS);
    float dummy = 0.0f;
    void **ptrs = block_ptrs(adapters, (const void *const *)blocks, &dummy);
    if (!ptrs) return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
    model_load_report rep;
    /* an expert window (expert parallelism): the other experts' adapters are
     * in the file, each expert's as many tensors as the window's */
    const model_layout *l = adapters;
    int outside = l->cfg.moe.experts - l->expert_count, per = 0;
    for (int i = 0; outside && i < l->n_tensors; i++)
        per += l->tensors[i].role >= MODEL_ROLE_EXPERT_GATE_W && l->tensors[i].role <= MODEL_ROLE_EXPERT_DOWN_W;
    per = l->expert_count ? per / l->expert_count : 0;
    zo_status st = model_load_path(path, adapters, ptrs, dt, outside ? 0 : MODEL_LOAD_STRICT, &rep);
    free(ptrs);
    if (st == ZO_OK && outside && rep.n_unexpected != outside * per)
        return zo_error(ZO_ERR_FORMAT, "%s: %d tensors are not adapters of %s (%d are the other ranks' experts'), "
                        "first \"%s\"", path, rep.n_unexpected, l->cfg.name, outside * per, rep.first_unexpected);
    return st;
}
