/* What train reads first (inputs.h): the config, the tokenizer, the data, the LoRA choice. */
#include "examples/train/inputs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/lora.h"   /* defines: zo_lora_targets_effective */
#include "common/units.h"  /* defines: zo_format_bytes */
#include "model/corpus.h"  /* defines: model_corpus_read, model_corpus_tokenize */
#include "model/data.h"    /* defines: model_tokens_check_seq */
#include "model/lora.h"    /* defines: model_lora_read_config */

zo_status inputs_load_config(const char *arg, zo_model_config *cfg)
{
    struct stat sb;
    if (stat(arg, &sb) == 0) return zo_model_config_load(arg, cfg);
    if (strchr(arg, '/') || strstr(arg, ".json"))
        return zo_error(ZO_ERR_NOT_FOUND, "--model %s: %s", arg, strerror(errno));
    zo_status st = zo_model_preset_find(arg, cfg);
    if (st != ZO_OK) return zo_error_wrap(st, "--model");
    return ZO_OK;
}

zo_status inputs_tokenizer(const train_args *a, int vocab, model_tokenizer **tok, int32_t *eot)
{
    *tok = NULL;
    *eot = -1;
    if (!a->tokenizer) return ZO_OK;
    zo_status st = model_tokenizer_load(a->tokenizer, tok);
    if (st != ZO_OK) return st;
    *eot = model_tokenizer_eot(*tok);
    if (model_tokenizer_vocab(*tok) > vocab)
        return zo_error(ZO_ERR_INVALID, "--tokenizer %s has %d ids, more than the model's vocabulary of %d",
                        a->tokenizer, model_tokenizer_vocab(*tok), vocab);
    if (a->eot && !strcmp(a->eot, "none"))
        *eot = -1;
    else if (a->eot && (*eot = model_tokenizer_token_id(*tok, a->eot)) < 0)
        return zo_error(ZO_ERR_INVALID, "--eot %s: no such token in %s", a->eot, a->tokenizer);
    printf("# tokenizer %s: %s, %d ids, end-of-text %d\n", a->tokenizer, model_tokenizer_kind(*tok),
           model_tokenizer_vocab(*tok), *eot);
    return ZO_OK;
}

/* A token file, as its side file says when it has one. */
static zo_status open_token_file(const train_args *a, const char *path, int vocab, model_tokens *out)
{
    model_tokens_info info;
    int found;
    model_token_width w = a->width;
    zo_status st = model_tokens_info_read(path, &info, &found);
    if (st != ZO_OK) return st;
    if (found) {
        if (a->set_width && a->width != info.width)
            return zo_error(ZO_ERR_INVALID, "%s: %s.json says its tokens are uint%d: leave out %s", path, path,
                            (int)info.width * 8, a->width == MODEL_TOKENS_BYTES ? "--text" : "--tokens-u32");
        if (info.vocab > vocab)
            return zo_error(ZO_ERR_INVALID, "%s: made with a vocabulary of %d ids (%s), more than the "
                            "model's %d", path, info.vocab, info.tokenizer, vocab);
        w = info.width;
    }
    if ((st = model_tokens_open(out, path, w, vocab)) != ZO_OK) return st;
    uint64_t cut = 0; /* data too short for --seq, or training on nothing: before step 0 */
    if ((st = model_tokens_check_seq(out, (int)a->seq, &cut)) != ZO_OK) {
        model_tokens_close(out);
        return st;
    }
    if (found)
        printf("# data %s: %llu tokens, uint%d, %llu documents (tokenizer %s)\n", path,
               (unsigned long long)out->n, (int)w * 8, (unsigned long long)info.documents, info.tokenizer);
    return ZO_OK;
}

/* Text tokenized now: documents, or prompt/completion pairs. */
static zo_status open_text(const train_args *a, const char *path, const model_tokenizer *tok, int32_t eot,
                           int vocab, model_tokens *out)
{
    model_corpus c;
    zo_status st = model_corpus_read(path, &c);
    if (st != ZO_OK) return st;
    int pairs = c.kind == MODEL_CORPUS_PAIRS;
    model_corpus_options o = {.add_special = 1, .eot = eot, .n_threads = (int)a->threads,
                              .packing = a->set_packing ? a->packing : pairs ? MODEL_PACK_PAD : MODEL_PACK_STREAM,
                              .seq = (int)a->seq}; /* refuses data that would train on nothing */
    st = model_corpus_tokenize(&c, tok, &o, vocab, out);
    size_t records = c.n, bytes = 0;
    for (size_t i = 0; i < c.n; i++) bytes += c.len[i] + (pairs ? c.clen[i] : 0);
    model_corpus_free(&c);
    if (st != ZO_OK) return st;
    char b[32];
    printf("# data %s: %zu %s, %s of text -> %llu tokens", path, records,
           pairs ? "prompt/completion pairs" : "documents", zo_format_bytes(bytes, b, sizeof b),
           (unsigned long long)out->n);
    if (out->mask) {
        uint64_t counted = 0;
        for (uint64_t i = 0; i < out->n; i++) counted += out->mask[i];
        printf(", %.1f%% of them completion targets", 100.0 * (double)counted / (double)out->n);
    }
    if (out->rows) {
        uint64_t cut = 0;
        for (uint64_t r = 0; r < out->n_rows; r++) cut += out->rows[r + 1] - out->rows[r] > (uint64_t)a->seq + 1;
        printf("; one record per row, %llu of them cut to --seq %ld", (unsigned long long)cut, a->seq);
    }
    printf("\n");
    return ZO_OK;
}

zo_status inputs_open_data(const train_args *a, const char *path, const model_tokenizer *tok, int32_t eot,
                           int vocab, model_tokens *out)
{
    return tok ? open_text(a, path, tok, eot, vocab, out) : open_token_file(a, path, vocab, out);
}

zo_status inputs_lora_choice(train_args *a, const zo_model_config *cfg)
{
    /* a plan for LoRA or QLoRA, unless the flags choose */
    const zo_plan_training *pt = &a->p.file.training;
    if (a->plan && pt->method != ZO_PLAN_FULL && !a->lora.r && !a->adapter) {
        a->lora = pt->lora;
        a->qlora = pt->method == ZO_PLAN_QLORA;
    }
    if (a->adapter) {
        zo_lora_config lc;
        zo_status st = model_lora_read_config(a->adapter, cfg, &lc, NULL, 0);
        if (st != ZO_OK) return st;
        /* targets as they resolve for this model: "all-linear" and its list are one set */
        if ((a->lora.r && a->lora.r != lc.r) ||
            (a->lora.targets &&
             zo_lora_targets_effective(cfg, a->lora.targets) != zo_lora_targets_effective(cfg, lc.targets)))
            return zo_error(ZO_ERR_INVALID, "--adapter %s has r %d on other targets than --lora/--lora-targets say",
                            a->adapter, lc.r);
        a->lora = lc;
    }
    if (!a->lora.r) return ZO_OK;
    if (!a->lora.targets) a->lora.targets = ZO_LORA_Q | ZO_LORA_V;
    return zo_lora_check(cfg, &a->lora);
}
