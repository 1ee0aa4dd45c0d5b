/* tokenize: encode text with a Hugging Face tokenizer.json into a nanoGPT
 * token file (and its side file), or (--decode) ids back into text. See
 * --help. */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/fileio.h"    /* defines: zo_file_read_all */
#include "common/units.h"     /* defines: zo_parse_int, zo_format_bytes */
#include "common/version.h"   /* defines: zo_version_print */
#include "model/corpus.h"     /* defines: model_corpus_read */
#include "model/data.h"       /* defines: model_tokens_writer */
#include "model/tokenizer.h"  /* defines: model_tokenizer_load, model_tokenizer_encode_many */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: tokenize --tokenizer tokenizer.json --out FILE.bin [options] INPUT...\n"
        "       tokenize --tokenizer tokenizer.json --decode [--skip-special] [INPUT...]\n"
        "\n"
        "Encode UTF-8 text with a Hugging Face tokenizer.json (byte-level BPE: GPT-2,\n"
        "LLaMA-3, Qwen2; SentencePiece BPE: LLaMA-2, Mistral) into a nanoGPT token file:\n"
        "little-endian uint16 ids, uint32 when the vocabulary has more than 65536, no\n"
        "header. Every document is followed by the end-of-text token. FILE.bin.json\n"
        "beside it says how to read it (dtype, vocab, eot); train reads both.\n"
        "\n"
        "Inputs: a .jsonl file holds one {\"text\": ...} document per line; any other file\n"
        "is one document. Invalid UTF-8 is refused with its byte offset.\n"
        "\n"
        "options:\n"
        "  --tokenizer FILE   the model's tokenizer.json\n"
        "  --out FILE         the token file to write (written under a temporary name, then renamed)\n"
        "  --eot TOKEN|none   the separator after each document (default: the tokenizer's\n"
        "                     <|endoftext|>, <|end_of_text|>, </s>, <eos> or <|im_end|>)\n"
        "  --no-special       leave out the post-processor's special tokens (e.g. LLaMA-2's <s>\n"
        "                     before each document; Hugging Face's add_special_tokens=False)\n"
        "  --threads N        threads; documents are encoded in parallel (default: all)\n"
        "  --print            print each document's ids as a JSON array, one per line, and\n"
        "                     write nothing (--out not needed)\n"
        "  --decode           ids back into text, through the tokenizer's decoder, to stdout:\n"
        "                     a token file (one with the FILE.json side file tokenize writes)\n"
        "                     decoded whole; any other input (stdin when none) read as lines of\n"
        "                     ids (1 2 3, 1,2,3 or --print's [1,2,3]; generate --print-ids's\n"
        "                     lines), each decoded to one line\n"
        "  --skip-special     with --decode: leave special tokens out (skip_special_tokens=True)\n"
        "  --version          the version\n"
        "  -h, --help         this text\n");
}

enum { OPT_TOKENIZER = 256, OPT_OUT, OPT_EOT, OPT_NO_SPECIAL, OPT_THREADS, OPT_PRINT, OPT_DECODE, OPT_SKIP_SPECIAL };

static const struct option long_opts[] = {
    {"tokenizer", required_argument, 0, OPT_TOKENIZER},
    {"out", required_argument, 0, OPT_OUT},
    {"eot", required_argument, 0, OPT_EOT},
    {"no-special", no_argument, 0, OPT_NO_SPECIAL},
    {"threads", required_argument, 0, OPT_THREADS},
    {"print", no_argument, 0, OPT_PRINT},
    {"decode", no_argument, 0, OPT_DECODE},
    {"skip-special", no_argument, 0, OPT_SKIP_SPECIAL},
    {"help", no_argument, 0, 'h'},
    {"version", no_argument, 0, 'V'},
    {0, 0, 0, 0},
};

/* ---- --decode ------------------------------------------------------------------------ */

/* ids through the tokenizer's decoder, to stdout. */
static zo_status decode_ids(const model_tokenizer *t, const int32_t *ids, size_t n, int flags)
{
    char *text = NULL;
    size_t len = 0;
    zo_status st = model_tokenizer_decode(t, ids, n, flags, &text, &len);
    if (st == ZO_OK) fwrite(text, 1, len, stdout);
    free(text);
    return st;
}

/* A token file tokenize wrote (its side file says the width), decoded whole. */
static zo_status decode_token_file(const model_tokenizer *t, const char *path, const model_tokens_info *info,
                                   int flags)
{
    char *raw = NULL;
    size_t len = 0;
    zo_status st = zo_file_read_all(path, (size_t)1 << 40, "--decode's token file", &raw, &len);
    if (st != ZO_OK) return st;
    size_t w = info->width == MODEL_TOKENS_U32 ? 4 : 2, n = len / w;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) st = zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
    for (size_t i = 0; st == ZO_OK && i < n; i++) {
        const unsigned char *p = (const unsigned char *)raw + i * w;
        ids[i] = w == 4 ? (int32_t)(p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24) : (int32_t)(p[0] | p[1] << 8);
    }
    if (st == ZO_OK && len % w) st = zo_error(ZO_ERR_FORMAT, "%s: %zu bytes is not a whole number of uint%zu ids", path, len, 8 * w);
    if (st == ZO_OK) st = decode_ids(t, ids, n, flags);
    free(ids);
    free(raw);
    return st;
}

/* Lines of ids (separated by spaces, commas or brackets), each decoded to a line. */
static zo_status decode_lines(const model_tokenizer *t, FILE *in, const char *name, int flags)
{
    char *line = NULL;
    size_t cap = 0;
    long no = 0;
    model_ids ids = {0};
    zo_status st = ZO_OK;
    while (st == ZO_OK && getline(&line, &cap, in) >= 0) {
        no++;
        ids.n = 0;
        for (char *p = line; *p && st == ZO_OK;) {
            if (strchr(" \t\r\n,[]", *p)) {
                p++;
                continue;
            }
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v > INT32_MAX)
                st = zo_error(ZO_ERR_INVALID, "'%.*s' is not a token id", (int)strcspn(p, " ,]\n"), p);
            else
                st = model_ids_push(&ids, (int32_t)v), p = end;
        }
        if (st == ZO_OK) st = decode_ids(t, ids.v, ids.n, flags);
        if (st == ZO_OK) fputc('\n', stdout);
        else st = zo_error_wrap(st, "%s:%ld", name, no);
    }
    free(line);
    model_ids_free(&ids);
    return st;
}

static int decode_main(const model_tokenizer *t, char **inputs, int n, int flags)
{
    zo_status st = ZO_OK;
    if (!n) st = decode_lines(t, stdin, "stdin", flags);
    for (int i = 0; i < n && st == ZO_OK; i++) {
        model_tokens_info info;
        int found = 0;
        if ((st = model_tokens_info_read(inputs[i], &info, &found)) != ZO_OK) break;
        if (found) {
            st = decode_token_file(t, inputs[i], &info, flags);
            continue;
        }
        FILE *f = fopen(inputs[i], "r");
        if (!f) {
            st = zo_error(ZO_ERR_IO, "%s: %s", inputs[i], strerror(errno));
            break;
        }
        st = decode_lines(t, f, inputs[i], flags);
        fclose(f);
    }
    fflush(stdout);
    if (st == ZO_OK) return 0;
    fprintf(stderr, "tokenize: --decode: %s\n", zo_last_error());
    return st == ZO_ERR_NOMEM ? 1 : 2;
}

/* What the command line asks for. */
typedef struct tok_opts {
    const char *tok_path, *out_path, *eot_name;
    int special, print, decode, skip_special;
    long threads;
} tok_opts;

/* Parses the options into o; returns -1 to go on, or the exit code. */
static int parse_args(int argc, char **argv, tok_opts *o)
{
    int c;
    *o = (tok_opts){.special = 1};
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        switch (c) {
        case OPT_TOKENIZER: o->tok_path = optarg; break;
        case OPT_OUT: o->out_path = optarg; break;
        case OPT_EOT: o->eot_name = optarg; break;
        case OPT_NO_SPECIAL: o->special = 0; break;
        case OPT_PRINT: o->print = 1; break;
        case OPT_DECODE: o->decode = 1; break;
        case OPT_SKIP_SPECIAL: o->skip_special = 1; break;
        case OPT_THREADS:
            if (zo_parse_int(optarg, "--threads", 1, 1024, &o->threads) != ZO_OK) {
                fprintf(stderr, "tokenize: %s\n", zo_last_error());
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        case 'V': zo_version_print(stdout, "tokenize"); return 0;
        default:
            if (optopt) fprintf(stderr, "tokenize: option %s needs a value\n", argv[optind - 1]);
            else fprintf(stderr, "tokenize: unknown option %s\n", argv[optind - 1]);
            fprintf(stderr, "run 'tokenize --help' for the options\n");
            return 2;
        }
    }
    return -1;
}

/* The end-of-text id appended to each document (-1: none), from --eot or the
 * tokenizer's own; -2 after printing why there is none. */
static int32_t resolve_eot(const model_tokenizer *t, const tok_opts *o)
{
    int32_t eot = model_tokenizer_eot(t);
    if (o->eot_name && !strcmp(o->eot_name, "none")) return -1;
    if (o->eot_name && (eot = model_tokenizer_token_id(t, o->eot_name)) < 0) {
        fprintf(stderr, "tokenize: --eot %s: no such token in %s\n", o->eot_name, o->tok_path);
        return -2;
    }
    if (!o->eot_name && eot < 0) {
        fprintf(stderr, "tokenize: %s has none of the usual end-of-text tokens: name one with --eot "
                        "TOKEN (or --eot none)\n", o->tok_path);
        return -2;
    }
    return eot;
}

/* Totals over the input files. */
typedef struct tok_totals {
    uint64_t docs, bytes;
    double t_encode;
} tok_totals;

/* Encodes one input file's documents: printed as lists of ids with --print,
 * else appended to w. */
static zo_status encode_file(const model_tokenizer *t, const tok_opts *o, int32_t eot,
                             const char *path, model_tokens_writer *w, tok_totals *tot)
{
    model_corpus corp;
    zo_status st = model_corpus_read(path, &corp);
    if (st != ZO_OK) return st;
    if (corp.kind == MODEL_CORPUS_PAIRS) {
        st = zo_error(ZO_ERR_INVALID, "%s: prompt/completion records keep a loss mask that a token "
                      "file has no room for; train reads them itself (train --tokenizer %s --data %s)",
                      path, o->tok_path, path);
        model_corpus_free(&corp);
        return st;
    }
    model_ids *ids = calloc(corp.n, sizeof *ids);
    if (!ids) {
        st = zo_error(ZO_ERR_NOMEM, "%s: out of memory", path);
        model_corpus_free(&corp);
        return st;
    }
    double te = zo_now();
    st = model_tokenizer_encode_many(t, (const char *const *)corp.text, corp.len, corp.n,
                                     o->special ? MODEL_TOK_ADD_SPECIAL : 0, eot, (int)o->threads, ids);
    tot->t_encode += zo_now() - te;
    if (st != ZO_OK) st = zo_error_wrap(st, "%s", path);
    for (size_t d = 0; d < corp.n; d++) {
        if (st == ZO_OK && o->print) {
            putchar('[');
            for (size_t k = 0; k < ids[d].n; k++) printf("%s%d", k ? "," : "", ids[d].v[k]);
            printf("]\n");
        } else if (st == ZO_OK) {
            st = model_tokens_writer_append(w, ids[d].v, ids[d].n);
        }
        tot->bytes += corp.len[d];
        model_ids_free(&ids[d]);
    }
    tot->docs += corp.n;
    free(ids);
    model_corpus_free(&corp);
    return st;
}

/* Encodes inputs[0..n) into --out (or prints them); returns the exit code. */
static int encode_main(const model_tokenizer *t, const tok_opts *o, char **inputs, int n)
{
    int32_t eot = resolve_eot(t, o);
    if (eot == -2) return 2;
    int vocab = model_tokenizer_vocab(t);
    model_tokens_writer w = {0};
    zo_status st;
    if (!o->print &&
        (st = model_tokens_writer_open(&w, o->out_path, model_tokens_width_for(vocab), vocab)) != ZO_OK) {
        fprintf(stderr, "tokenize: %s\n", zo_last_error());
        return 1;
    }
    tok_totals tot = {0};
    double t0 = zo_now();
    for (int i = 0; i < n; i++)
        if ((st = encode_file(t, o, eot, inputs[i], &w, &tot)) != ZO_OK) {
            fprintf(stderr, "tokenize: %s\n", zo_last_error());
            if (!o->print) model_tokens_writer_abort(&w);
            return st == ZO_ERR_NOMEM || st == ZO_ERR_IO ? 1 : 2;
        }
    if (o->print) return 0;
    uint64_t n_tokens = w.n;
    int width = (int)w.width;
    model_tokens_info info = {.eot = eot, .documents = tot.docs};
    snprintf(info.tokenizer, sizeof info.tokenizer, "%s", o->tok_path);
    if ((st = model_tokens_writer_commit(&w, &info)) != ZO_OK) {
        fprintf(stderr, "tokenize: %s\n", zo_last_error());
        return 1;
    }
    char b1[32];
    printf("# tokenize: %llu documents, %s of text -> %llu tokens (uint%d, vocab %d, %s), "
           "%.1f MB/s encoding, %.2fs in all\n",
           (unsigned long long)tot.docs, zo_format_bytes(tot.bytes, b1, sizeof b1),
           (unsigned long long)n_tokens, width * 8, vocab, model_tokenizer_kind(t),
           tot.t_encode > 0 ? (double)tot.bytes / tot.t_encode / 1e6 : 0.0, zo_now() - t0);
    printf("# wrote %s and %s.json\n", o->out_path, o->out_path);
    return 0;
}

int main(int argc, char **argv)
{
    tok_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    if (o.tok_path && o.decode) {
        model_tokenizer *t = NULL;
        if (model_tokenizer_load(o.tok_path, &t) != ZO_OK) {
            fprintf(stderr, "tokenize: %s\n", zo_last_error());
            return 2;
        }
        rc = decode_main(t, argv + optind, argc - optind, o.skip_special ? MODEL_TOK_SKIP_SPECIAL : 0);
        model_tokenizer_free(t);
        return rc;
    }
    if (!o.tok_path || (!o.out_path && !o.print) || optind >= argc) {
        fprintf(stderr, "tokenize: %s (see --help)\n",
                !o.tok_path ? "--tokenizer is required" : optind >= argc ? "no input files" : "--out is required");
        return 2;
    }
    model_tokenizer *t = NULL;
    if (model_tokenizer_load(o.tok_path, &t) != ZO_OK) {
        fprintf(stderr, "tokenize: %s\n", zo_last_error());
        return 2;
    }
    rc = encode_main(t, &o, argv + optind, argc - optind);
    model_tokenizer_free(t);
    return rc;
}
