/* Loading a model layout from safetensors checkpoints and saving it back with
 * Hugging Face names and layouts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fnmatch.h> /* fnmatch: modules_to_not_convert's patterns */
#include <strings.h> /* strcasecmp */

#include "model_io.h"   /* defines: model_io_convert_rows */
#include "safetensors.h"

static int starts_with(const char *s, const char *prefix)
{
    return !strncmp(s, prefix, strlen(prefix));
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

#define GPT_PREFIX "transformer."
#define FP8_SCALE_SUFFIX "_scale_inv" /* <m>.weight_scale_inv: an FP8 <m>.weight's block scales */
#define MXFP4_BLOCKS_SUFFIX "_blocks"   /* X_blocks, X_scales: an MXFP4 X's codes and scales */
#define MXFP4_SCALES_SUFFIX "_scales"
#define OPT_PREFIX "model."

/* A text model inside its multimodal checkpoint (zo_model_config.mm_text:
 * Gemma-3, Mistral-Small-3.1, LLaVA): X as language_model.X (the published
 * files: language_model.model.layers..., language_model.lm_head.weight) or
 * model.X as model.language_model.X (as later versions of transformers save
 * them; lm_head.weight as it is); the vision tower and projector are not
 * read. */
#define MM_OLD "language_model."
#define MM_NEW "model.language_model."

static int mm_vision(const char *name)
{
    return starts_with(name, "vision_tower.") || starts_with(name, "multi_modal_projector.") ||
           starts_with(name, "model.vision_tower.") || starts_with(name, "model.multi_modal_projector.");
}

const model_tensor *model_layout_match_hf(const model_layout *l, const char *hf_name,
                                          int *ignored)
{
    *ignored = 0;
    const char *name = hf_name;
    char text[sizeof MM_NEW + MODEL_TENSOR_NAME_MAX];
    if (l->cfg.mm_text) {
        if (starts_with(name, MM_OLD)) {
            name += strlen(MM_OLD);
        } else if (starts_with(name, MM_NEW)) {
            snprintf(text, sizeof text, "model.%s", name + strlen(MM_NEW));
            name = text;
        } else if (mm_vision(name)) {
            *ignored = 1;
            return NULL;
        }
    }
    /* GPT-2's names without the prefix (Falcon's keep it, GPT-NeoX's have none) */
    if (l->cfg.arch == ZO_ARCH_GPT && !zo_model_qkv_grouped(&l->cfg) && !zo_model_gptj(&l->cfg) &&
        starts_with(name, GPT_PREFIX))
        name += strlen(GPT_PREFIX);
    const model_tensor *t = model_layout_find(l, name);
    if (t) return t;
    /* OPT's checkpoints saved from OPTModel (decoder.* without model.) and
     * BLOOM's from BloomModel (without transformer.) */
    const char *pre = zo_model_opt(&l->cfg)     ? (starts_with(name, "decoder.") ? OPT_PREFIX : NULL)
                      : zo_model_bloom(&l->cfg) ? GPT_PREFIX
                                                : NULL;
    if (pre) {
        char full[sizeof GPT_PREFIX + sizeof text];
        snprintf(full, sizeof full, "%s%s", pre, name);
        if ((t = model_layout_find(l, full))) return t;
    }
    if (zo_model_qkv_grouped(&l->cfg)) {
        /* GPT-NeoX's buffers in older checkpoints: the causal mask, its fill
         * value and the rotary frequencies */
        *ignored = ends_with(name, ".attention.bias") || ends_with(name, ".attention.masked_bias") ||
                   ends_with(name, ".rotary_emb.inv_freq");
    } else if (zo_model_gptj(&l->cfg)) {
        /* GPT-J's causal-mask buffers in its checkpoints: transformer.h.N.attn.bias
         * (its projections have none) and attn.masked_bias */
        *ignored = starts_with(name, GPT_PREFIX "h.") &&
                   (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"));
    } else if (l->cfg.arch == ZO_ARCH_GPT && !zo_model_phi(&l->cfg) && !zo_model_starcoder2(&l->cfg)) {
        /* causal-mask buffers that old GPT-2 checkpoints carry: h.N.attn.bias
         * (not c_attn.bias) and h.N.attn.masked_bias */
        *ignored = starts_with(name, "h.") &&
                   (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"));
    } else {
        *ignored = ends_with(name, ".rotary_emb.inv_freq");
    }
    /* DeepSeek-V3: the router score corrections, read apart (tf_load_router_bias),
     * and the multi-token prediction layers (model.layers.<num_hidden_layers>
     * on: num_nextn_predict_layers), which Hugging Face's model does not build */
    if (l->cfg.moe.router_bias) {
        int layer = -1, used = 0;
        if (ends_with(name, ".mlp.gate.e_score_correction_bias") ||
            (sscanf(name, "model.layers.%d.%n", &layer, &used) == 1 && used > 0 && layer >= l->cfg.n_layers))
            *ignored = 1;
    }
    /* a tied head written out anyway: it is the token embedding */
    if (l->cfg.tied_embeddings && !strcmp(name, "lm_head.weight")) *ignored = 1;
    /* an FP8 weight's block scales, an MXFP4 weight's blocks and scales:
     * read with it (model_load_block) */
    static const char *const with[] = {FP8_SCALE_SUFFIX, MXFP4_BLOCKS_SUFFIX, MXFP4_SCALES_SUFFIX};
    for (size_t k = 0; k < sizeof with / sizeof with[0] && !*ignored; k++) {
        if (!ends_with(hf_name, with[k])) continue;
        char base[sizeof MM_NEW + MODEL_TENSOR_NAME_MAX];
        size_t n = strlen(hf_name) - strlen(with[k]);
        int sub;
        if (n < sizeof base) {
            memcpy(base, hf_name, n);
            base[n] = '\0';
            *ignored = model_layout_match_hf(l, base, &sub) != NULL;
        }
    }
    return NULL;
}

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    int n = snprintf(buf, len, "[");
    for (int i = 0; i < ndim && n > 0 && (size_t)n < len; i++)
        n += snprintf(buf + n, len - (size_t)n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, "]");
}

/* The entry named pre + name + sfx, or NULL. */
static const model_ckpt_entry *find_named(const model_ckpt *c, const char *pre, const char *name, const char *sfx)
{
    char full[sizeof MM_NEW + MODEL_TENSOR_NAME_MAX + 16];
    snprintf(full, sizeof full, "%s%s%s", pre, name, sfx);
    return model_ckpt_find(c, full);
}

/* The checkpoint entry for a layout tensor (its name followed by sfx: ""
 * for the tensor itself): its own name, for GPT-2 the name with the
 * "transformer." prefix, for OPT the name without "model.", for BLOOM
 * without "transformer.", for a text model in its multimodal checkpoint
 * under either of its prefixes (MM_OLD, MM_NEW) */
static const model_ckpt_entry *find_entry_sfx(const model_ckpt *c, const model_layout *l, const model_tensor *t,
                                              const char *sfx)
{
    const model_ckpt_entry *e = find_named(c, "", t->name, sfx);
    if (!e && l->cfg.mm_text) {
        if (!(e = find_named(c, MM_OLD, t->name, sfx)) && starts_with(t->name, "model."))
            e = find_named(c, MM_NEW, t->name + strlen("model."), sfx);
        return e;
    }
    if (!e && zo_model_opt(&l->cfg) && starts_with(t->name, OPT_PREFIX))
        return find_named(c, "", t->name + strlen(OPT_PREFIX), sfx);
    if (!e && zo_model_bloom(&l->cfg) && starts_with(t->name, GPT_PREFIX))
        return find_named(c, "", t->name + strlen(GPT_PREFIX), sfx);
    if (!e && l->cfg.arch == ZO_ARCH_GPT) e = find_named(c, GPT_PREFIX, t->name, sfx);
    return e;
}

static const model_ckpt_entry *find_entry(const model_ckpt *c, const model_layout *l, const model_tensor *t)
{
    return find_entry_sfx(c, l, t, "");
}

/* A row of a GPT-NeoX or Falcon query_key_value as its file numbers it (per
 * kv group g of G: its Q query heads, its key, its value, d rows each) to
 * ours ([all q | all k | all v]): model_tensor.hf_head_rows, hf_head_groups. */
static size_t head_row_ours(const model_tensor *t, size_t file_row)
{
    size_t d = (size_t)t->hf_head_rows, G = (size_t)t->hf_head_groups;
    size_t per = (size_t)t->shape[0] / (G * d), Q = per - 2; /* heads in a group's rows */
    size_t g = file_row / (per * d), s = file_row % (per * d) / d, r = file_row % d;
    size_t head = s < Q ? g * Q + s : s == Q ? G * Q + g : G * Q + G + g;
    return head * d + r;
}

/* Rows of a tensor read in the file's order put in ours, in place: each
 * group's key and value rows are set aside (2 G heads of rows, not the
 * tensor), the query rows move down group by group (ours never lie after the
 * file's, so moving in ascending order overwrites only rows already moved),
 * and the keys, then the values, fill the end. */
static zo_status head_rows_from_file(const model_tensor *t, uint8_t *buf, size_t esz, const char *path)
{
    size_t G = (size_t)t->hf_head_groups, d = (size_t)t->hf_head_rows;
    size_t head = d * (t->ndim == 2 ? (size_t)t->shape[1] : 1) * esz; /* bytes of one head's rows */
    size_t Q = (size_t)t->shape[0] / (G * d) - 2;                     /* query heads of a group */
    uint8_t *kv = malloc(2 * G * head);
    if (!kv)
        return zo_error(ZO_ERR_NOMEM, "%s: tensor \"%s\": cannot allocate %zu bytes for its key and value rows",
                        path, t->name, 2 * G * head);
    for (size_t g = 0; g < G; g++) {
        const uint8_t *grp = buf + g * (Q + 2) * head;
        memcpy(kv + g * head, grp + Q * head, head);
        memcpy(kv + (G + g) * head, grp + (Q + 1) * head, head);
    }
    for (size_t g = 1; g < G; g++) memmove(buf + g * Q * head, buf + g * (Q + 2) * head, Q * head);
    memcpy(buf + G * Q * head, kv, 2 * G * head);
    free(kv);
    return ZO_OK;
}

/* Our row of a file row (the same row where the file holds our order). */
static size_t row_ours(const model_tensor *t, size_t file_row)
{
    return t->hf_head_rows ? head_row_ours(t, file_row) : model_tensor_rope_our_row(t, file_row);
}

/* Rows of a tensor read in the file's order put in ours (hf_rope_rows:
 * GPT-J's, Cohere's and DeepSeek-V2's rotary rows), through a copy of the
 * tensor. */
static zo_status rope_rows_from_file(const model_tensor *t, uint8_t *buf, size_t esz, const char *path)
{
    size_t rows = t->hf_rope_elems ? t->numel : (size_t)t->shape[0];
    size_t row = (t->ndim == 2 && !t->hf_rope_elems ? (size_t)t->shape[1] : 1) * esz;
    uint8_t *file = malloc(rows * row);
    if (!file)
        return zo_error(ZO_ERR_NOMEM, "%s: tensor \"%s\": cannot allocate %zu bytes to reorder its rotary rows", path,
                        t->name, rows * row);
    memcpy(file, buf, rows * row);
    for (size_t r = 0; r < rows; r++) memcpy(buf + r * row, file + model_tensor_rope_file_row(t, r) * row, row);
    free(file);
    return ZO_OK;
}

/* The first of n values of type dt that is inf or nan (exponent all ones),
 * n when none. */
static size_t first_nonfinite(const void *p, zo_dtype dt, size_t n)
{
    if (dt == ZO_DTYPE_F32) {
        const uint32_t *u = p;
        for (size_t i = 0; i < n; i++)
            if ((u[i] & 0x7f800000u) == 0x7f800000u) return i;
        return n;
    }
    const uint16_t *u = p, e = dt == ZO_DTYPE_F16 ? 0x7c00 : 0x7f80;
    for (size_t i = 0; i < n; i++)
        if ((u[i] & e) == e) return i;
    return n;
}

/* Checkpoint tensor s (entry e, or its slice of a fused tensor) into dst
 * for layout tensor t: an FP8 weight dequantized with its `_scale_inv`
 * (which may lie in another shard), any other through model_st_read. A
 * scale without an FP8 weight, or an FP8 weight without its scale, is
 * refused: either would load wrong values. */
static zo_status read_weight(const model_ckpt *c, const model_layout *l, const model_ckpt_entry *e,
                             const model_tensor *t, const model_st_tensor *s, void *dst, zo_dtype dt)
{
    const model_st_file *f = &c->files[e->file];
    char sname[MODEL_TENSOR_NAME_MAX + sizeof MM_NEW + sizeof FP8_SCALE_SUFFIX];
    snprintf(sname, sizeof sname, "%s" FP8_SCALE_SUFFIX, e->name);
    const model_ckpt_entry *se = model_ckpt_find(c, sname);
    int fp8 = !strncmp(s->dtype_name, "F8_", 3);
    const model_ckpt_entry *mx = find_entry_sfx(c, l, t, MXFP4_BLOCKS_SUFFIX);
    if (mx)
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\" beside \"%s\" of %s: the weight twice, as MXFP4 and as %s",
                        c->files[mx->file].path, mx->name, e->name, f->path, s->dtype_name);
    if (!fp8 && se)
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": block scales for tensor \"%s\" of %s, which is %s, not FP8",
                        c->files[se->file].path, sname, e->name, f->path, s->dtype_name);
    if (!fp8) return model_st_read(f, s, dst, dt, t->hf_transposed);
    if (!se)
        return zo_error(ZO_ERR_FORMAT,
                        "%s: tensor \"%s\" is %s but the checkpoint has no \"%s\" (its block scales, "
                        "quantization_config \"fp8\")",
                        f->path, e->name, s->dtype_name, sname);
    if (t->hf_fused[0])
        return zo_error(ZO_ERR_UNSUPPORTED, "%s: tensor \"%s\": an FP8 tensor fused across experts cannot be loaded",
                        f->path, e->name);
    /* (F8_E4M3 or F8_E5M2: the format quantization_config's fmt names) */
    if (l->cfg.fp8_fmt[0] && strcasecmp(s->dtype_name + 3, l->cfg.fp8_fmt))
        return zo_error(ZO_ERR_FORMAT,
                        "%s: tensor \"%s\" is %s but the config's quantization_config \"fmt\" is \"%s\"",
                        f->path, e->name, s->dtype_name, l->cfg.fp8_fmt);
    int block[2] = {l->cfg.fp8_block[0] ? l->cfg.fp8_block[0] : MODEL_FP8_BLOCK,
                    l->cfg.fp8_block[1] ? l->cfg.fp8_block[1] : MODEL_FP8_BLOCK};
    return model_st_read_fp8(f, s, &c->files[se->file], se->tensor, block, dst, dt, t->hf_transposed);
}

/* Whether checkpoint name `name` lies in a module that the config's
 * modules_to_not_convert keeps unquantized: a pattern ('*' any run of
 * characters) that matches its start. */
static int mxfp4_kept(const model_layout *l, const char *name, char *pat, size_t len)
{
    for (const char *p = l->cfg.quant_keep; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        snprintf(pat, len, "%.*s*", (int)n, p);
        if (!fnmatch(pat, name, 0)) {
            pat[n] = '\0';
            return 1;
        }
        p += n + (nl != NULL);
    }
    return 0;
}

/* Layout tensor t from an MXFP4 weight: its checkpoint name's `_blocks`
 * (entry b) and `_scales`, dequantized (model_st_read_mxfp4) into dst,
 * the slice of a fused tensor at its elements. Refused by name: scales
 * missing, a config whose quant_method is not "mxfp4", a module the config
 * keeps unquantized. */
static zo_status read_mxfp4(const model_ckpt *c, const model_layout *l, const model_ckpt_entry *b,
                            const model_tensor *t, void *dst, zo_dtype dt)
{
    const model_st_file *f = &c->files[b->file];
    char base[MODEL_TENSOR_NAME_MAX + sizeof MM_NEW], sname[sizeof base + sizeof MXFP4_SCALES_SUFFIX], pat[512];
    snprintf(base, sizeof base, "%.*s", (int)(strlen(b->name) - strlen(MXFP4_BLOCKS_SUFFIX)), b->name);
    snprintf(sname, sizeof sname, "%s" MXFP4_SCALES_SUFFIX, base);
    if (strcmp(l->cfg.quant_method, "mxfp4"))
        return zo_error(ZO_ERR_FORMAT,
                        "%s: tensor \"%s\" holds \"%s\" as MXFP4 but the config's quantization_config "
                        "\"quant_method\" is %s%s%s, not \"mxfp4\"",
                        f->path, b->name, base, l->cfg.quant_method[0] ? "\"" : "",
                        l->cfg.quant_method[0] ? l->cfg.quant_method : "not given", l->cfg.quant_method[0] ? "\"" : "");
    if (mxfp4_kept(l, base, pat, sizeof pat))
        return zo_error(ZO_ERR_FORMAT,
                        "%s: tensor \"%s\" holds \"%s\" as MXFP4 but the config's quantization_config "
                        "\"modules_to_not_convert\" keeps it unquantized (\"%s\")",
                        f->path, b->name, base, pat);
    const model_ckpt_entry *se = model_ckpt_find(c, sname);
    if (!se)
        return zo_error(ZO_ERR_FORMAT,
                        "%s: tensor \"%s\" holds \"%s\" as MXFP4 but the checkpoint has no \"%s\" (its E8M0 scales)",
                        f->path, b->name, base, sname);
    /* (a fused slice stored [in, out] is a whole matrix of X: D's, transposed back) */
    return model_st_read_mxfp4(f, b->tensor, &c->files[se->file], se->tensor, t->hf_fused[0] ? t->hf_fused_at : 0,
                               t->numel, dst, dt, t->hf_transposed);
}

static void note_name(char *dst, const char *name, int count)
{
    if (count == 1) snprintf(dst, MODEL_TENSOR_NAME_MAX, "%s", name);
}

zo_status model_load_block(const model_ckpt *c, const model_layout *l, int block, void *buf,
                           zo_dtype dt, unsigned flags, model_load_report *rep)
{
    model_load_report local;
    if (!rep) {
        memset(&local, 0, sizeof local);
        rep = &local;
    }
    if (block < 0 || block >= l->n_blocks || !buf || (unsigned)dt >= ZO_DTYPE_COUNT)
        return zo_error(ZO_ERR_INVALID, "%s: load block %d of %d: bad block, buffer or dtype",
                        c->path, block, l->n_blocks);
    int missing = 0;
    const char *first_missing = NULL;
    size_t esz = zo_dtype_size(dt);
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *t = &l->tensors[i];
        if (t->block != block) continue;
        const model_ckpt_entry *e = find_entry(c, l, t);
        /* an MXFP4 weight: X_blocks and X_scales where the file has no X */
        const model_ckpt_entry *mx = e ? NULL : find_entry_sfx(c, l, t, MXFP4_BLOCKS_SUFFIX);
        if (mx) e = mx;
        if (!e) {
            if (!missing++) first_missing = t->name;
            rep->n_missing++;
            note_name(rep->first_missing, t->name, rep->n_missing);
            continue;
        }
        const model_st_file *f = &c->files[e->file];
        const model_st_tensor *s = e->tensor;
        /* the shape the checkpoint must have: Conv1D weights are [in, out];
         * a slice of a fused tensor the whole one's */
        int64_t want[3] = {t->shape[0], t->shape[1], 0};
        int want_ndim = t->ndim;
        if (t->hf_transposed) {
            want[0] = t->shape[1];
            want[1] = t->shape[0];
        }
        if (t->hf_fused[0]) {
            memcpy(want, t->hf_fused, sizeof want);
            want_ndim = model_tensor_fused_ndim(t);
        }
        /* (an MXFP4 weight's: the one its blocks hold) */
        int64_t xs[MODEL_ST_MAX_DIMS];
        int got_ndim = mx ? model_mxfp4_shape(s, xs) : s->ndim;
        const int64_t *got = mx ? xs : s->shape;
        if (mx && (got_ndim < 0 || strcmp(s->dtype_name, "U8"))) /* refused by name */
            return model_st_read_mxfp4(f, s, f, s, 0, 0, buf, dt, 0);
        int same = got_ndim == want_ndim;
        for (int d = 0; same && d < want_ndim; d++) same = got[d] == want[d];
        if (!same) {
            char got_s[128], want_s[64];
            shape_str(got_s, sizeof got_s, got_ndim, got);
            shape_str(want_s, sizeof want_s, want_ndim, want);
            if (mx && want_ndim >= 2 && want[want_ndim - 2] % MODEL_MXFP4_BLOCK)
                return zo_error(ZO_ERR_FORMAT,
                                "%s: tensor \"%s\": the model (%s) expects %s, whose %lld columns before the "
                                "transpose are not a multiple of 32: it cannot be MXFP4 (blocks of 32 values)",
                                f->path, s->name, l->cfg.name, want_s, (long long)want[want_ndim - 2]);
            return zo_error(ZO_ERR_FORMAT,
                            "%s: tensor \"%s\": shape %s in the file%s, the model (%s) expects %s",
                            f->path, s->name, got_s, mx ? " (the MXFP4 weight its blocks hold)" : "", l->cfg.name,
                            want_s);
        }
        uint8_t *dst = (uint8_t *)buf + t->offset * esz;
        model_st_tensor part;
        if (t->hf_fused[0] && !mx) { /* its run of the fused tensor's elements, read as a tensor */
            part = *s;
            part.begin = s->begin + t->hf_fused_at * s->elem_size;
            part.end = part.begin + t->numel * s->elem_size;
            part.ndim = 1;
            part.shape[0] = (int64_t)t->numel;
            if (t->hf_transposed) { /* (a matrix stored [in, out]: gpt-oss's experts) */
                part.ndim = 2;
                part.shape[0] = t->shape[1];
                part.shape[1] = t->shape[0];
            }
            part.numel = t->numel;
            s = &part;
        }
        /* (an MXFP4 weight's run of elements: read_mxfp4) */
        zo_status st = mx ? read_mxfp4(c, l, e, t, dst, dt) : read_weight(c, l, e, t, s, dst, dt);
        if (st) return st;
        /* inf or nan in a weight makes every loss nan: refused, named (before
         * query_key_value's rows are reordered: bad is then the file's row) */
        size_t bad = first_nonfinite(dst, dt, t->numel);
        if (bad < t->numel) {
            /* the element as the file numbers it ([in, out] for a Conv1D weight) */
            size_t in = (size_t)t->shape[1], at = t->hf_transposed ? (bad % in) * (size_t)t->shape[0] + bad / in : bad;
            at += t->hf_fused_at;
            return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\" element %zu is %g: weights must be finite",
                            f->path, s->name, at, (double)zo_load_f32(dst, dt, bad));
        }
        if (t->hf_head_rows && (st = head_rows_from_file(t, dst, esz, f->path)) != ZO_OK) return st;
        if (t->hf_rope_rows && (st = rope_rows_from_file(t, dst, esz, f->path)) != ZO_OK) return st;
        rep->n_loaded++;
    }
    if (missing && !(flags & MODEL_LOAD_ALLOW_MISSING)) {
        char bname[32];
        return zo_error(ZO_ERR_NOT_FOUND, "%s: %d tensor%s of the %s block missing, first \"%s\"",
                        c->path, missing, missing == 1 ? " is" : "s are",
                        model_layout_block_name(l, block, bname, sizeof bname), first_missing);
    }
    return ZO_OK;
}

/* Before any block: the checkpoint tensors that match nothing, counted
 * (known buffers apart, rep->n_ignored) and an error with MODEL_LOAD_STRICT,
 * so a checkpoint the config does not describe (q/k/v biases under
 * attention_bias false, a layer past num_hidden_layers) is refused before
 * its weights are read, not trained without them. */
static zo_status load_start(const model_ckpt *c, const model_layout *l, unsigned flags,
                            model_load_report *rep)
{
    /* a rank's window of the routed experts (expert parallelism): the
     * others' experts are the model's, read by the ranks holding them
     * (strict loads only: model_lora_load counts them as unexpected) */
    model_layout full;
    int windowed = (flags & MODEL_LOAD_STRICT) && l->cfg.moe.experts > 0 && l->expert_count < l->cfg.moe.experts;
    if (windowed) {
        zo_status st = model_layout_init(&full, &l->cfg);
        if (st != ZO_OK) return st;
    }
    for (int i = 0; i < c->n_entries; i++) {
        int ignored;
        if (model_layout_match_hf(l, c->entries[i].name, &ignored)) continue;
        if (!ignored && windowed && model_layout_match_hf(&full, c->entries[i].name, &ignored)) ignored = 1;
        if (ignored) {
            rep->n_ignored++;
            continue;
        }
        rep->n_unexpected++;
        note_name(rep->first_unexpected, c->entries[i].name, rep->n_unexpected);
    }
    if (windowed) model_layout_free(&full);
    if (rep->n_unexpected && (flags & MODEL_LOAD_STRICT))
        return zo_error(ZO_ERR_FORMAT,
                        "%s: %d tensor%s not in the model %s describes, first \"%s\" "
                        "(a field such as attention_bias, mlp_bias or num_hidden_layers that disagrees "
                        "with the checkpoint, or another model's weights)",
                        c->path, rep->n_unexpected, rep->n_unexpected == 1 ? " is" : "s are", l->cfg.name,
                        rep->first_unexpected);
    return ZO_OK;
}

/* After every block: missing tensors (an error unless allowed). */
static zo_status load_finish(const model_ckpt *c, const model_layout *l, unsigned flags,
                             const model_load_report *rep)
{
    if (rep->n_missing && !(flags & MODEL_LOAD_ALLOW_MISSING))
        return zo_error(ZO_ERR_NOT_FOUND,
                        "%s: %d of the %d tensors of %s are missing, first \"%s\"", c->path,
                        rep->n_missing, l->n_tensors, l->cfg.name, rep->first_missing);
    return ZO_OK;
}

zo_status model_load(const model_ckpt *c, const model_layout *l, void *const *blocks,
                     zo_dtype dt, unsigned flags, model_load_report *rep)
{
    model_load_report local;
    if (!rep) rep = &local;
    memset(rep, 0, sizeof *rep);
    zo_status st0 = load_start(c, l, flags, rep);
    if (st0) return st0;
    for (int b = 0; b < l->n_blocks; b++) {
        zo_status st = model_load_block(c, l, b, blocks[b], dt, flags | MODEL_LOAD_ALLOW_MISSING, rep);
        if (st) return st;
    }
    return load_finish(c, l, flags, rep);
}

zo_status model_load_streamed(const model_ckpt *c, const model_layout *l, void *buf, zo_dtype dt,
                              unsigned flags, model_load_report *rep, model_block_sink sink,
                              void *ctx)
{
    model_load_report local;
    if (!rep) rep = &local;
    memset(rep, 0, sizeof *rep);
    size_t esz = zo_dtype_size(dt);
    zo_status st = load_start(c, l, flags, rep);
    if (st) return st;
    for (int b = 0; b < l->n_blocks; b++) {
        memset(buf, 0, l->block_numel[b] * esz);
        if ((st = model_load_block(c, l, b, buf, dt, flags | MODEL_LOAD_ALLOW_MISSING, rep)) != ZO_OK)
            return st;
        /* a block with tensors missing is not handed on when that is an error */
        if (rep->n_missing && !(flags & MODEL_LOAD_ALLOW_MISSING)) break;
        if ((st = sink(ctx, b, buf)) != ZO_OK) return st;
    }
    return load_finish(c, l, flags, rep);
}

zo_status model_load_path(const char *path, const model_layout *l, void *const *blocks,
                          zo_dtype dt, unsigned flags, model_load_report *rep)
{
    model_ckpt c;
    zo_status st = model_ckpt_open(&c, path);
    if (st) return st;
    st = model_load(&c, l, blocks, dt, flags, rep);
    model_ckpt_close(&c);
    return st;
}

/* ---- saving --------------------------------------------------------------------- */

typedef struct stream_ctx stream_ctx;

typedef struct save_ctx {
    const model_layout *l;
    const int *tix;         /* [entries] the layout tensor of each entry (a fused one's first slice) */
    const void *const *blocks;
    zo_dtype buf_dt, file_dt;
    stream_ctx *stream;     /* model_save_streamed: blocks come through it */
} save_ctx;

/* Our element of slice t's k-th element in the file's run (gpt-oss's:
 * a matrix stored [in, out], rows interleaved): the file's (r, c) of
 * [in, out] is our (row_ours(c), r); a bias's element its row's. */
static size_t fused_ours(const model_tensor *t, size_t k)
{
    if (!t->hf_transposed) return row_ours(t, k);
    size_t in = (size_t)t->shape[1], out = (size_t)t->shape[0];
    return row_ours(t, k % out) * in + k / out;
}

/* Elements [first, first + count) of the fused tensor whose first slice is
 * tensor i: its slices' parts in that range (every slice lies in i's block,
 * after it). */
static zo_status fused_fill(const save_ctx *x, int i, uint64_t first, uint64_t count, void *dst)
{
    const model_layout *l = x->l;
    const model_tensor *t0 = &l->tensors[i];
    size_t bsz = zo_dtype_size(x->buf_dt), fsz = zo_dtype_size(x->file_dt);
    for (int j = i; j < l->n_tensors && l->tensors[j].block == t0->block; j++) {
        const model_tensor *t = &l->tensors[j];
        if (strcmp(t->name, t0->name)) continue;
        uint64_t a = t->hf_fused_at > first ? t->hf_fused_at : first;
        uint64_t b = t->hf_fused_at + t->numel < first + count ? t->hf_fused_at + t->numel : first + count;
        if (a >= b) continue;
        const uint8_t *base = (const uint8_t *)x->blocks[t->block] + t->offset * bsz;
        if (t->hf_transposed || t->hf_rope_rows) { /* element by element */
            for (uint64_t e = a; e < b; e++) {
                const uint8_t *s = base + fused_ours(t, (size_t)(e - t->hf_fused_at)) * bsz;
                zo_status st = model_io_convert_rows((uint8_t *)dst + (e - first) * fsz, x->file_dt, s, x->buf_dt, 1,
                                                     1, 0, 0);
                if (st != ZO_OK) return st;
            }
            continue;
        }
        const uint8_t *src = base + (a - t->hf_fused_at) * bsz;
        zo_status st = model_io_convert_rows((uint8_t *)dst + (a - first) * fsz, x->file_dt, src, x->buf_dt, 1,
                                             (size_t)(b - a), 0, 0);
        if (st != ZO_OK) return st;
    }
    return ZO_OK;
}

/* Elements [first, first + count) of tensor `index` in its file layout. */
static zo_status save_fill(void *vctx, int index, uint64_t first, uint64_t count, void *dst)
{
    const save_ctx *x = vctx;
    const model_tensor *t = &x->l->tensors[x->tix[index]];
    if (t->hf_fused[0]) return fused_fill(x, x->tix[index], first, count, dst);
    size_t bsz = zo_dtype_size(x->buf_dt), fsz = zo_dtype_size(x->file_dt);
    const uint8_t *src = (const uint8_t *)x->blocks[t->block] + t->offset * bsz;
    if (t->hf_head_rows || t->hf_rope_rows) {
        /* GPT-NeoX's query_key_value, GPT-J's q_proj and k_proj, DeepSeek-V2's
         * rotary rows: the file's rows from ours, row piece by piece */
        uint64_t cols = t->ndim == 2 && !t->hf_rope_elems ? (uint64_t)t->shape[1] : 1;
        for (uint64_t e = first; e < first + count;) {
            uint64_t r = e / cols, c = e % cols, n = cols - c < first + count - e ? cols - c : first + count - e;
            const uint8_t *s = src + ((uint64_t)row_ours(t, (size_t)r) * cols + c) * bsz;
            zo_status st = model_io_convert_rows((uint8_t *)dst + (e - first) * fsz, x->file_dt, s, x->buf_dt, 1,
                                                 (size_t)n, 0, 0);
            if (st != ZO_OK) return st;
            e += n;
        }
        return ZO_OK;
    }
    if (!t->hf_transposed)
        return model_io_convert_rows(dst, x->file_dt, src + first * bsz, x->buf_dt, 1, count, 0, 0);
    /* file [in, out] from ours [out, in]: file (r, c) is ours (c, r) */
    uint64_t in = (uint64_t)t->shape[1], out = (uint64_t)t->shape[0];
    uint8_t *d = dst;
    for (uint64_t k = 0; k < count; k++) {
        uint64_t e = first + k, r = e / out, c = e % out;
        const uint8_t *s = src + (c * in + r) * bsz;
        if (x->buf_dt == x->file_dt)
            memcpy(d + k * fsz, s, fsz);
        else
            zo_store_f32(dst, x->file_dt, (size_t)k, zo_load_f32(s, x->buf_dt, 0));
    }
    return ZO_OK;
}

/* The block reader behind model_save_streamed: one block cached. */
typedef struct stream_ctx {
    model_block_read_fn read;
    void *ctx;
    float *buf;
    int block;
} stream_ctx;

/* Entries of the layout's tensors [first, first + n) in its (block) order,
 * *count of them: a fused tensor's slices are one entry, at its first
 * (*tix: each entry's tensor). A fused tensor must be whole in the range
 * and the layout (no expert window). */
static zo_status save_entries(const char *path, const model_layout *l, int first, int n, zo_dtype file_dt,
                              model_st_entry **out, int **tix, int *count)
{
    model_st_entry *e = calloc(n ? (size_t)n : 1, sizeof *e);
    *out = NULL;
    *tix = calloc(n ? (size_t)n : 1, sizeof **tix);
    if (!e || !*tix) {
        free(e);
        free(*tix);
        *tix = NULL;
        return zo_error(ZO_ERR_NOMEM, "%s: cannot allocate %d entries", path, n);
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        const model_tensor *t = &l->tensors[first + i];
        if (t->hf_fused[0]) {
            /* the slices in the range (its block's, around i) cover it whole */
            uint64_t got = 0, whole = model_tensor_fused_numel(t);
            int head = 0, j0 = i, j1 = i;
            while (j0 > 0 && l->tensors[first + j0 - 1].block == t->block) j0--;
            while (j1 + 1 < n && l->tensors[first + j1 + 1].block == t->block) j1++;
            for (int j = j0; j <= j1; j++) {
                const model_tensor *u = &l->tensors[first + j];
                if (strcmp(u->name, t->name)) continue;
                got += u->numel;
                head |= !model_tensor_fused_rest(u);
            }
            if (got != whole || !head) {
                free(e);
                free(*tix);
                *tix = NULL;
                return zo_error(ZO_ERR_INVALID, "%s: tensor \"%s\" is written whole only (every expert's "
                                "slice, in one file)", path, t->name);
            }
            if (model_tensor_fused_rest(t)) continue;
            e[k].ndim = model_tensor_fused_ndim(t);
            memcpy(e[k].shape, t->hf_fused, sizeof t->hf_fused);
        } else {
            e[k].ndim = t->ndim;
            e[k].shape[0] = t->hf_transposed ? t->shape[1] : t->shape[0];
            e[k].shape[1] = t->hf_transposed ? t->shape[0] : t->shape[1];
        }
        e[k].name = t->name;
        e[k].dtype = file_dt;
        (*tix)[k++] = first + i;
    }
    *count = k;
    *out = e;
    return ZO_OK;
}

zo_status model_save(const char *path, const model_layout *l, const void *const *blocks,
                     zo_dtype buf_dt, zo_dtype file_dt)
{
    if ((unsigned)buf_dt >= ZO_DTYPE_COUNT || (unsigned)file_dt >= ZO_DTYPE_COUNT)
        return zo_error(ZO_ERR_INVALID, "%s: bad dtype", path);
    for (int b = 0; b < l->n_blocks; b++)
        if (!blocks[b]) return zo_error(ZO_ERR_INVALID, "%s: block %d has no buffer", path, b);
    model_st_entry *e;
    int *tix, n;
    zo_status st = save_entries(path, l, 0, l->n_tensors, file_dt, &e, &tix, &n);
    if (st != ZO_OK) return st;
    size_t bsz = zo_dtype_size(buf_dt);
    for (int i = 0; i < n; i++) {
        const model_tensor *t = &l->tensors[tix[i]];
        if (!t->hf_transposed && !t->hf_head_rows && !t->hf_rope_rows && !t->hf_fused[0] && buf_dt == file_dt)
            e[i].data = (const uint8_t *)blocks[t->block] + t->offset * bsz;
    }
    save_ctx x = {.l = l, .tix = tix, .blocks = blocks, .buf_dt = buf_dt, .file_dt = file_dt};
    st = model_st_write(path, e, n, save_fill, &x);
    free(e);
    free(tix);
    return st;
}

static zo_status stream_fill(void *vctx, int index, uint64_t first, uint64_t count, void *dst)
{
    save_ctx *x = vctx;
    stream_ctx *sc = x->stream;
    int b = x->l->tensors[x->tix[index]].block;
    if (sc->block != b) {
        zo_status st = sc->read(sc->ctx, b, sc->buf);
        sc->block = st == ZO_OK ? b : -1;
        if (st != ZO_OK) return st;
    }
    return save_fill(vctx, index, first, count, dst);
}

zo_status model_save_streamed(const char *path, const model_layout *l, model_block_read_fn read,
                              void *ctx, zo_dtype file_dt)
{
    return model_save_streamed_range(path, l, 0, l->n_tensors, read, ctx, file_dt);
}

zo_status model_save_streamed_range(const char *path, const model_layout *l, int first, int n,
                                    model_block_read_fn read, void *ctx, zo_dtype file_dt)
{
    return model_save_streamed_extra(path, l, first, n, read, ctx, file_dt, NULL, 0);
}

zo_status model_save_streamed_extra(const char *path, const model_layout *l, int first, int n,
                                    model_block_read_fn read, void *ctx, zo_dtype file_dt,
                                    const model_st_entry *extra, int n_extra)
{
    if ((unsigned)file_dt >= ZO_DTYPE_COUNT) return zo_error(ZO_ERR_INVALID, "%s: bad dtype", path);
    if (first < 0 || n < 1 || first + n > l->n_tensors)
        return zo_error(ZO_ERR_INVALID, "%s: tensors %d..%d of %d", path, first, first + n - 1, l->n_tensors);
    size_t largest = 1;
    for (int b = 0; b < l->n_blocks; b++)
        if (l->block_numel[b] > largest) largest = l->block_numel[b];
    stream_ctx sc = {.read = read, .ctx = ctx, .buf = malloc(largest * sizeof(float)), .block = -1};
    /* every block is read into the one buffer: save_fill finds it there */
    const void **blocks = calloc((size_t)l->n_blocks, sizeof *blocks);
    model_st_entry *e = NULL;
    int *tix = NULL, count = 0;
    zo_status st = save_entries(path, l, first, n, file_dt, &e, &tix, &count);
    if (st != ZO_OK) goto out_free;
    model_st_entry *all = n_extra > 0 ? realloc(e, (size_t)(count + n_extra) * sizeof *e) : e;
    if (!all) {
        st = zo_error(ZO_ERR_NOMEM, "%s: cannot allocate %d entries", path, count + n_extra);
        goto out_free;
    }
    e = all;
    for (int i = 0; i < n_extra; i++) e[count + i] = extra[i]; /* (data given: fill never sees them) */
    count += n_extra > 0 ? n_extra : 0;
    if (!sc.buf || !blocks) {
        st = zo_error(ZO_ERR_NOMEM, "%s: cannot allocate a block of %zu floats", path, largest);
        goto out_free;
    }
    for (int b = 0; b < l->n_blocks; b++) blocks[b] = sc.buf;
    save_ctx x = {.l = l, .tix = tix, .blocks = blocks, .buf_dt = ZO_DTYPE_F32, .file_dt = file_dt, .stream = &sc};
    st = model_st_write(path, e, count, stream_fill, &x);
out_free:
    free(e);
    free(tix);
    free(blocks);
    free(sc.buf);
    return st;
}
