/* bench_nvme: sequential throughput of the io_uring engine against fio with
 * the same file, block size, depth and io_uring engine, then the pipelined
 * optimizer step against the larger of its disk time and its compute time.
 *
 *   bench_nvme --file PATH --size SIZE --bs SIZE --qd N --rw read|write
 *              [--reps N] [--no-fio] [--pipe-elems COUNT] [--pipe-group COUNT]
 *              [--pipe-steps N] [--pipe-slots N] [--no-pipeline] [--threads N]
 *
 * Rows: each engine and fio pass; "fio ratio" (engine / fio, best of each);
 * the step's time, its update time, the compute baseline (the same update
 * over in-memory state), the disk time (state bytes at the engine's measured
 * read and write rates) and "overlap efficiency" = max(disk, compute) / step.
 * Last line: "MB/s: X", the engine's throughput for --rw (1 MB = 1e6 B).
 *
 * The compute baseline is cpu_adam's adam_update when the build has it, else
 * the plain Adam below. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench/bench.h"          // defines: bench_header, bench_row, bench_result
#include "common/units.h"         // defines: zo_parse_size, zo_parse_count, zo_format_bytes
#include "nvme/nvme_pipeline.h"   // defines: nvme_pipeline_*, nvme_store_*, nvme_engine_*
#ifdef ZO_BENCH_CPU_ADAM
#include "cpu_adam/cpu_adam.h"    // defines: adam_update, adam_hparams
#endif

typedef struct opts {
    const char *file;
    uint64_t size, bs;
    long qd, reps, steps, threads, slots;
    int write;
    int fio, pipeline;
    uint64_t pipe_elems, pipe_group;
} opts;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bench_nvme --file PATH [--size 1GiB] [--bs 1MiB] [--qd 32] [--rw read|write]\n"
            "                  [--reps 3] [--no-fio] [--pipe-elems 32M] [--pipe-group 4M]\n"
            "                  [--pipe-steps 3] [--pipe-slots 3] [--no-pipeline] [--threads 0]\n");
}

static int parse_opts(int argc, char **argv, opts *o)
{
    *o = (opts){.file = NULL, .size = ZO_GIB, .bs = ZO_MIB, .qd = 32, .reps = 3, .steps = 3,
                .fio = 1, .pipeline = 1, .pipe_elems = 32000000, .pipe_group = 4000000, .slots = 3};
    static const struct option lo[] = {
        {"file", required_argument, 0, 'f'},       {"size", required_argument, 0, 's'},
        {"bs", required_argument, 0, 'b'},         {"qd", required_argument, 0, 'q'},
        {"rw", required_argument, 0, 'r'},         {"reps", required_argument, 0, 'n'},
        {"no-fio", no_argument, 0, 'F'},           {"pipe-elems", required_argument, 0, 'e'},
        {"pipe-group", required_argument, 0, 'g'}, {"pipe-steps", required_argument, 0, 'S'},
        {"no-pipeline", no_argument, 0, 'P'},      {"threads", required_argument, 0, 't'},
        {"pipe-slots", required_argument, 0, 'L'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    zo_status st = ZO_OK;
    while (st == ZO_OK && (c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'f': o->file = optarg; break;
        case 's': st = zo_parse_size(optarg, "--size", 0, &o->size); break;
        case 'b': st = zo_parse_size(optarg, "--bs", 0, &o->bs); break;
        case 'q': st = zo_parse_int(optarg, "--qd", 1, 4096, &o->qd); break;
        case 'n': st = zo_parse_int(optarg, "--reps", 1, 100, &o->reps); break;
        case 'S': st = zo_parse_int(optarg, "--pipe-steps", 1, 100, &o->steps); break;
        case 't': st = zo_parse_int(optarg, "--threads", 0, 1024, &o->threads); break;
        case 'e': st = zo_parse_count(optarg, "--pipe-elems", &o->pipe_elems); break;
        case 'g': st = zo_parse_count(optarg, "--pipe-group", &o->pipe_group); break;
        case 'L': st = zo_parse_int(optarg, "--pipe-slots", 2, 16, &o->slots); break;
        case 'F': o->fio = 0; break;
        case 'P': o->pipeline = 0; break;
        case 'r':
            if (!strcmp(optarg, "read")) o->write = 0;
            else if (!strcmp(optarg, "write")) o->write = 1;
            else st = zo_error(ZO_ERR_INVALID, "--rw: expected read or write, got %s", optarg);
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
    }
    if (st != ZO_OK) {
        fprintf(stderr, "bench_nvme: %s\n", zo_last_error());
        return 2;
    }
    if (!o->file) {
        fprintf(stderr, "bench_nvme: --file is required\n");
        usage(stderr);
        return 2;
    }
    if (o->bs % NVME_ALIGN || o->size % o->bs) {
        fprintf(stderr, "bench_nvme: --bs must be a multiple of %u and divide --size\n",
                NVME_ALIGN);
        return 2;
    }
    return 0;
}

/* ---- sequential throughput ------------------------------------------------------- */

/* One pass over [0, size) of the file: transfers of `chunk` bytes, all queued
 * at once (all into the same buffer: the data is not looked at), the engine
 * keeping qd requests of bs bytes in flight. With `both`, every chunk is also
 * written from buf2 in the same pass (reads and writes interleaved), which is
 * what the pipelined step asks of the disk. Returns seconds or < 0. */
static double engine_pass2(nvme_engine_t *e, int fid, void *buf, void *buf2, uint64_t size,
                           size_t chunk, nvme_op_kind op, int both)
{
    size_t n = (size_t)((size + chunk - 1) / chunk), nio = both ? 2 * n : n;
    nvme_io *io = calloc(nio, sizeof *io);
    if (!io) return -1;
    double t0 = zo_now();
    for (size_t i = 0; i < nio; i++) {
        size_t c = both ? i / 2 : i;
        uint64_t off = (uint64_t)c * chunk;
        int second = both && (i % 2);
        io[i] = (nvme_io){.fid = fid, .op = second ? NVME_OP_WRITE : op,
                          .buf = second ? buf2 : buf, .offset = off,
                          .len = size - off < chunk ? (size_t)(size - off) : chunk};
        if (nvme_io_submit(e, &io[i]) != ZO_OK) goto out_fail;
    }
    for (size_t i = 0; i < nio; i++)
        if (nvme_io_wait(e, &io[i]) != ZO_OK) goto out_fail;
    double dt = zo_now() - t0;
    free(io);
    return dt;

out_fail:
    fprintf(stderr, "bench_nvme: %s\n", zo_last_error());
    for (size_t i = 0; i < nio; i++) nvme_io_wait(e, &io[i]);
    free(io);
    return -1;
}

static double engine_pass(nvme_engine_t *e, int fid, void *buf, uint64_t size, size_t chunk,
                          nvme_op_kind op)
{
    return engine_pass2(e, fid, buf, NULL, size, chunk, op, 0);
}

/* fio with the same settings; returns MB/s (1e6) or < 0. */
static double fio_pass(const opts *o, int write, int direct)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "fio --name=zo --filename='%s' --size=%llu --bs=%llu --iodepth=%ld --rw=%s "
             "--ioengine=io_uring --direct=%d%s --output-format=json 2>/dev/null",
             o->file, (unsigned long long)o->size, (unsigned long long)o->bs, o->qd,
             write ? "write" : "read", direct, direct ? "" : " --end_fsync=1");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    size_t got;
    while (out && (got = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (len + 1 == cap) out = realloc(out, cap *= 2);
    }
    int rc = pclose(p);
    if (!out || rc != 0) {
        free(out);
        return -1;
    }
    out[len] = '\0';
    /* fio may print notes before the JSON. */
    char *json = strchr(out, '{');
    double mbs = -1;
    cJSON *root = json ? cJSON_Parse(json) : NULL;
    cJSON *jobs = root ? cJSON_GetObjectItem(root, "jobs") : NULL;
    cJSON *job = jobs ? cJSON_GetArrayItem(jobs, 0) : NULL;
    cJSON *dir = job ? cJSON_GetObjectItem(job, write ? "write" : "read") : NULL;
    cJSON *bw = dir ? cJSON_GetObjectItem(dir, "bw_bytes") : NULL;
    if (cJSON_IsNumber(bw)) mbs = bw->valuedouble / 1e6;
    cJSON_Delete(root);
    free(out);
    return mbs;
}

/* Median of n values (sorts them). */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int have_fio(void) { return system("fio --version >/dev/null 2>&1") == 0; }

/* ---- the pipelined step ---------------------------------------------------------- */

typedef struct adam_ctx {
    const float *grad; /* (n_elems,) */
    long step;
    int threads;
} adam_ctx;

#ifdef ZO_BENCH_CPU_ADAM
static zo_status adam_cb(void *user, size_t group, size_t first, size_t n, float *w, float *m,
                         float *v)
{
    (void)group;
    adam_ctx *a = user;
    adam_hparams hp = adam_hparams_default();
    hp.step = a->step;
    return adam_update(&hp, n, w, a->grad + first, ZO_DTYPE_F32, m, v, NULL, ZO_DTYPE_F32,
                       a->threads);
}
static const char *adam_name = "cpu_adam adam_update";
#else
/* AdamW, the bench's own until cpu_adam is in the build. */
static zo_status adam_cb(void *user, size_t group, size_t first, size_t n, float *w, float *m,
                         float *v)
{
    (void)group;
    adam_ctx *a = user;
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
    const float bc1 = 1.0f - powf(b1, (float)a->step), bc2 = 1.0f - powf(b2, (float)a->step);
    const float *g = a->grad + first;
#pragma omp parallel for schedule(static) num_threads(a->threads > 0 ? a->threads : omp_get_max_threads())
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        w[i] -= lr * ((m[i] / bc1) / (sqrtf(v[i] / bc2) + eps) + wd * w[i]);
    }
    return ZO_OK;
}
static const char *adam_name = "bench AdamW (OpenMP)";
#endif

/* Rounds of: the disk baseline (the engine writing, reading, then reading
 * and writing at once a scratch file as large as the state, in the same
 * directory), the compute baseline (the update over in-memory state), and
 * one pipelined step; each figure is the best of its rounds, so all three see
 * the same shared-machine weather. */
static int run_pipeline(const opts *o, nvme_engine_t *e, void *buf, size_t chunk)
{
    int rc = 1, sfid = -1;
    char *dirbuf = strdup(o->file);
    const char *dirs[1] = {dirname(dirbuf)};
    char scratch[4096];
    snprintf(scratch, sizeof scratch, "%s/zo-nvme-bench-scratch", dirs[0]);
    nvme_store_config scfg = {.dirs = dirs, .ndirs = 1, .prefix = "zo-nvme-bench-pipe"};
    nvme_store_t *s = NULL;
    nvme_pipeline_t *p = NULL;
    float *w = NULL, *m = NULL, *v = NULL, *g = NULL;
    void *buf2 = NULL;
    size_t n = (size_t)o->pipe_elems;
    if (nvme_store_init(&s, e, &scfg) != ZO_OK) goto out_report;
    nvme_pipeline_config pcfg = {.n_elems = n, .group_elems = (size_t)o->pipe_group,
                                 .nslots = (int)o->slots};
    if (nvme_pipeline_init(&p, s, &pcfg) != ZO_OK) goto out_report;
    size_t K = nvme_pipeline_groups(p);
    uint64_t foot = nvme_store_footprint(s);
    if (nvme_file_open(e, scratch, NVME_FILE_CREATE | NVME_FILE_TRUNC, &sfid) != ZO_OK)
        goto out_report;
    if (nvme_file_allocate(e, sfid, foot) != ZO_OK) goto out_report;
    if (nvme_buf_alloc(e, chunk, &buf2) != ZO_OK) goto out_report;
    /* In-memory state (n,) x 3 and the gradient; the same state goes to disk. */
    w = malloc(n * 4);
    m = malloc(n * 4);
    v = malloc(n * 4);
    g = malloc(n * 4);
    if (!w || !m || !v || !g) {
        zo_error(ZO_ERR_NOMEM, "pipeline: %zu elements of state", n);
        goto out_report;
    }
    for (size_t i = 0; i < n; i++) {
        w[i] = (float)((i * 2654435761u) % 1000) * 1e-3f;
        m[i] = 0.0f;
        v[i] = 0.0f;
        g[i] = (float)((i * 40503u) % 997) * 1e-4f - 0.05f;
    }
    for (size_t k = 0; k < K; k++) {
        size_t first, len;
        nvme_pipeline_group_range(p, k, &first, &len);
        if (nvme_pipeline_store_group(p, k, w + first, m + first, v + first) != ZO_OK)
            goto out_report;
    }
    if (engine_pass(e, sfid, buf, foot, chunk, NVME_OP_WRITE) < 0) goto out_report; /* lay out */
    adam_ctx a = {.grad = g, .step = 1, .threads = (int)o->threads};
    double t_w = 1e300, t_r = 1e300, t_rw = 1e300, t_compute = 1e300, t_step = 1e300;
    nvme_step_stats best = {0};
    for (long r = 0; r < o->steps; r++) {
        double dw = engine_pass(e, sfid, buf, foot, chunk, NVME_OP_WRITE);
        double dr = engine_pass(e, sfid, buf, foot, chunk, NVME_OP_READ);
        double drw = engine_pass2(e, sfid, buf, buf2, foot, chunk, NVME_OP_READ, 1);
        if (dw < 0 || dr < 0 || drw < 0) goto out_report;
        t_w = dw < t_w ? dw : t_w;
        t_r = dr < t_r ? dr : t_r;
        t_rw = drw < t_rw ? drw : t_rw;
        double t0 = zo_now();
        for (size_t k = 0; k < K; k++) {
            size_t first, len;
            nvme_pipeline_group_range(p, k, &first, &len);
            if (adam_cb(&a, k, first, len, w + first, m + first, v + first) != ZO_OK)
                goto out_report;
        }
        double dc = zo_now() - t0;
        t_compute = dc < t_compute ? dc : t_compute;
        nvme_step_stats st;
        if (nvme_pipeline_step(p, adam_cb, &a, &st) != ZO_OK) goto out_report;
        a.step++;
        bench_row("round %ld: disk write %.3f s, read %.3f s, both at once %.3f s; compute %.3f "
                  "s; pipelined step %.3f s (update %.3f s, waiting for reads %.3f s)", r + 1,
                  dw, dr, drw, dc, st.seconds, st.update_seconds, st.wait_seconds);
        if (st.seconds < t_step) {
            t_step = st.seconds;
            best = st;
        }
    }
    double state = 12.0 * (double)n;
    double t_disk = t_w + t_r;
    double lower = t_disk > t_compute ? t_disk : t_compute;
    char b1[32];
    bench_row("pipeline: %zu elements (%s of fp32 master/m/v) in %zu sub-groups of %llu, %ld "
              "slots; best of %ld rounds:", n, zo_format_bytes((uint64_t)state, b1, sizeof b1), K,
              (unsigned long long)o->pipe_group, o->slots, o->steps);
    bench_row("  compute baseline (%s, in memory): %.3f s", adam_name, t_compute);
    bench_row("  disk baseline (engine: write %.3f s + read %.3f s of the state's size): %.3f s",
              t_w, t_r, t_disk);
    bench_row("  disk, reads and writes at once: %.3f s", t_rw);
    bench_row("  pipelined step: %.3f s, update inside it %.3f s, waiting for reads %.3f s",
              t_step, best.update_seconds, best.wait_seconds);
    bench_row("overlap efficiency against reads and writes at once: %.3f",
              (t_rw > t_compute ? t_rw : t_compute) / t_step);
    bench_row("overlap efficiency: %.3f", lower / t_step);
    rc = 0;

out_report:
    if (rc) fprintf(stderr, "bench_nvme: pipeline: %s\n", zo_last_error());
    if (buf2) nvme_buf_free(e, buf2);
    if (sfid >= 0) {
        nvme_file_close(e, sfid);
        unlink(scratch);
    }
    free(w);
    free(m);
    free(v);
    free(g);
    nvme_pipeline_free(p);
    nvme_store_free(s);
    free(dirbuf);
    return rc;
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    char sz[32], bsz[32];
    bench_header("bench_nvme", "file %s, size %s, bs %s, qd %ld, rw %s, reps %ld", o.file,
                 zo_format_bytes(o.size, sz, sizeof sz), zo_format_bytes(o.bs, bsz, sizeof bsz),
                 o.qd, o.write ? "write" : "read", o.reps);
    nvme_engine_t *e = NULL;
    nvme_engine_config cfg = {.queue_depth = (unsigned)o.qd, .block_size = (size_t)o.bs};
    void *buf = NULL;
    int fid = -1;
    double *eng = NULL, *fi = NULL, best = 0; /* MB/s per pass; the engine's best */
    rc = 1;
    if (nvme_engine_init(&e, &cfg) != ZO_OK) goto out_report;
    if (nvme_file_open(e, o.file, NVME_FILE_CREATE, &fid) != ZO_OK) goto out_report;
    if (nvme_file_allocate(e, fid, o.size) != ZO_OK) goto out_report;
    /* One buffer of qd blocks (as fio has), reused by every transfer of a
     * pass: the requests in flight at any time land in distinct memory
     * (reading into the same pages from concurrent requests is much slower on
     * a virtual disk). At most 1 GiB, the limit of a registered buffer. */
    uint64_t want = (uint64_t)o.qd * o.bs;
    if (want > ZO_GIB) want = ZO_GIB;
    if (want > o.size) want = o.size;
    size_t chunk = (size_t)(want - want % o.bs);
    if (nvme_buf_alloc(e, chunk, &buf) != ZO_OK) goto out_report;
    for (size_t i = 0; i < chunk; i++) ((unsigned char *)buf)[i] = (unsigned char)(i * 131 + 7);
    if (nvme_engine_notes(e)[0]) printf("# note: %s\n", nvme_engine_notes(e));
    int direct = nvme_file_is_direct(e, fid);
    /* Lay the file out once so that reads read data, not holes. */
    if (engine_pass(e, fid, buf, o.size, chunk, NVME_OP_WRITE) < 0) goto out_report;

    int fio = o.fio && have_fio();
    if (o.fio && !fio) printf("# fio not found: no fio comparison\n");
    /* Engine and fio passes alternate, so both see the same disk weather. */
    eng = calloc((size_t)o.reps, sizeof *eng);
    fi = calloc((size_t)o.reps, sizeof *fi);
    if (!eng || !fi) goto out_report;
    for (long r = 0; r < o.reps; r++) {
        double dt = engine_pass(e, fid, buf, o.size, chunk, o.write ? NVME_OP_WRITE : NVME_OP_READ);
        if (dt < 0) goto out_report;
        eng[r] = (double)o.size / dt / 1e6;
        if (eng[r] > best) best = eng[r];
        bench_row("engine %-5s pass %ld: %8.1f MB/s", o.write ? "write" : "read", r + 1, eng[r]);
        if (fio) {
            fi[r] = fio_pass(&o, o.write, direct);
            if (fi[r] < 0) {
                printf("# fio failed: no fio comparison\n");
                fio = 0;
            } else {
                bench_row("fio    %-5s pass %ld: %8.1f MB/s", o.write ? "write" : "read", r + 1,
                          fi[r]);
            }
        }
    }
    if (fio) {
        double em = median(eng, (size_t)o.reps), fm = median(fi, (size_t)o.reps);
        double fb = 0;
        for (long r = 0; r < o.reps; r++) fb = fi[r] > fb ? fi[r] : fb;
        bench_row("fio ratio (medians of %ld): %.3f (engine %.1f MB/s / fio %.1f MB/s)", o.reps,
                  em / fm, em, fm);
        bench_row("fio ratio (best of %ld): %.3f (engine %.1f MB/s / fio %.1f MB/s)", o.reps,
                  best / fb, best, fb);
    }

    if (o.pipeline && run_pipeline(&o, e, buf, chunk) != 0) goto out_free;
    bench_result("MB/s", best);
    rc = 0;
    goto out_free;

out_report:
    fprintf(stderr, "bench_nvme: %s\n", zo_last_error());
out_free:
    free(eng);
    free(fi);
    if (buf) nvme_buf_free(e, buf);
    if (fid >= 0) nvme_file_close(e, fid);
    nvme_engine_free(e);
    return rc;
}
