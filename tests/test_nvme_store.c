/* Tests of the swap store and the pipelined step: round trips over striped
 * files, checksums, capacity, real faults (a tiny file system that fills up,
 * a file-size limit, a file truncated or a byte flipped behind the store's
 * back), injected ones, and the pipelined step against the same step over
 * in-memory state, bit for bit. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "nvme/nvme_pipeline.h"
#include "nvme/nvme_store.h"

/* ---- fixture: a directory with three sub-directories ("drives") and an
 * engine whose completions pass through a controllable fault hook ---------- */

typedef struct fault_ctl {
    int mode;          /* 0 none, 1 error `err` at `offset` of op, 2 short+EAGAIN everywhere */
    nvme_op_kind op;
    int err;
    int fid;           /* -1: any file */
    uint64_t offset;
    unsigned calls, hits;
} fault_ctl;

typedef struct fixture {
    char dir[512];
    char sub[3][600];
    char mnt[600];     /* tiny tmpfs mount point, "" when not mounted */
    fault_ctl fault;
    nvme_engine_t *e;
} fixture;

static int fault_hook(void *user, const nvme_fault_info *info, int res)
{
    fault_ctl *c = user;
    c->calls++;
    if (res < 0 || c->mode == 0) return res;
    if (c->mode == 2) { /* benign: every completion short or -EAGAIN once */
        if (c->calls % 3 == 0) {
            c->hits++;
            return -EAGAIN;
        }
        if (res >= 2 && (size_t)res == info->len && info->op != NVME_OP_FSYNC) {
            c->hits++;
            return res / 2;
        }
        return res;
    }
    if (info->op == c->op && (c->fid < 0 || info->fid == c->fid) && info->offset <= c->offset &&
        c->offset < info->offset + info->len) {
        c->hits++;
        return -c->err;
    }
    return res;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s/nvme-store-XXXXXX", ZO_BUILD_DIR);
    if (!mkdtemp(f->dir)) return -1;
    for (int i = 0; i < 3; i++) {
        snprintf(f->sub[i], sizeof f->sub[i], "%s/drive%d", f->dir, i);
        if (mkdir(f->sub[i], 0700) != 0) return -1;
    }
    f->fault.fid = -1;
    nvme_engine_config cfg = {.block_size = 256 * 1024, .queue_depth = 16, .fault = fault_hook,
                              .fault_user = &f->fault};
    zo_status st = nvme_engine_init(&f->e, &cfg);
    if (st == ZO_ERR_UNSUPPORTED) {
        fprintf(stderr, "skipped: %s\n", zo_last_error());
        exit(77);
    }
    if (st != ZO_OK) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    nvme_engine_free(f->e);
    if (f->mnt[0]) {
        umount2(f->mnt, MNT_DETACH);
        rmdir(f->mnt);
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    if (system(cmd) != 0) return -1;
    free(f);
    return 0;
}

static void fill_bytes(unsigned char *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)x;
    }
}

static nvme_store_t *store_on(fixture *f, int ndirs, size_t stripe, size_t cblock)
{
    const char *dirs[3] = {f->sub[0], f->sub[1], f->sub[2]};
    nvme_store_config cfg = {.dirs = dirs, .ndirs = ndirs, .stripe_size = stripe,
                             .checksum_block = cblock};
    nvme_store_t *s = NULL;
    assert_int_equal(nvme_store_init(&s, f->e, &cfg), ZO_OK);
    return s;
}

static int add1(nvme_store_t *s, const char *name, size_t n)
{
    int id = -1;
    const char *names[1] = {name};
    assert_int_equal(nvme_store_add(s, 1, names, &n, &id), ZO_OK);
    return id;
}

static const char *store_path(nvme_store_t *s, int k)
{
    return nvme_file_path(nvme_store_engine(s), nvme_store_file_id(s, k));
}

/* ---- store ------------------------------------------------------------------------ */

static void test_store_round_trip_striped(void **state)
{
    fixture *f = *state;
    nvme_store_t *s = store_on(f, 3, 64 * 1024, 16 * 1024);
    static const size_t sizes[] = {1, 4095, 4096, 65537, 5 * 65536 + 333, 3 << 20};
    enum { NT = sizeof sizes / sizeof sizes[0] };
    const char *names[NT] = {"a", "b", "c", "d", "e", "f"};
    int ids[NT];
    assert_int_equal(nvme_store_add(s, NT, names, sizes, ids), ZO_OK);
    unsigned char *src[NT], *dst[NT];
    for (int i = 0; i < NT; i++) {
        src[i] = malloc(sizes[i]);
        dst[i] = malloc(sizes[i]);
        fill_bytes(src[i], sizes[i], 40 + (uint32_t)i);
        assert_int_equal(nvme_store_write(s, ids[i], src[i]), ZO_OK);
    }
    for (int i = NT - 1; i >= 0; i--) {
        memset(dst[i], 0, sizes[i]);
        assert_int_equal(nvme_store_read(s, ids[i], dst[i]), ZO_OK);
        assert_memory_equal(dst[i], src[i], sizes[i]);
    }
    /* Striping: every file holds part of tensor f, where locate says. */
    for (int k = 0; k < 3; k++) {
        struct stat sb;
        assert_int_equal(stat(store_path(s, k), &sb), 0);
        assert_true(sb.st_size >= (3 << 20) / 3 - 65536);
    }
    for (size_t byte = 0; byte < sizes[5]; byte += 65536 + 4097) {
        int k;
        uint64_t off;
        nvme_store_locate(s, ids[5], byte, &k, &off);
        int fd = open(store_path(s, k), O_RDONLY);
        unsigned char c;
        assert_int_equal(pread(fd, &c, 1, (off_t)off), 1);
        close(fd);
        assert_int_equal(c, src[5][byte]);
    }
    int found;
    assert_int_equal(nvme_store_find(s, "e", &found), ZO_OK);
    assert_int_equal(found, ids[4]);
    assert_int_equal(nvme_store_find(s, "zz", &found), ZO_ERR_NOT_FOUND);
    size_t one = 10;
    assert_int_equal(nvme_store_add(s, 1, names, &one, &found), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "already exists"));
    for (int i = 0; i < NT; i++) {
        free(src[i]);
        free(dst[i]);
    }
    nvme_store_free(s);
}

static void test_store_unwritten_tensor(void **state)
{
    fixture *f = *state;
    nvme_store_t *s = store_on(f, 1, 0, 0);
    int id = add1(s, "never", 1000);
    char buf[1000];
    assert_int_equal(nvme_store_read(s, id, buf), ZO_ERR_NOT_FOUND);
    assert_non_null(strstr(zo_last_error(), "never"));
    nvme_store_free(s);
}

/* Flip bits `mask` of byte `byte` of tensor id in its file, behind the
 * store's back; *file_k: the file it is in. */
static void flip_byte(nvme_store_t *s, int id, size_t byte, unsigned char mask, int *file_k)
{
    uint64_t off;
    nvme_store_locate(s, id, byte, file_k, &off);
    int fd = open(store_path(s, *file_k), O_RDWR);
    unsigned char c;
    assert_int_equal(pread(fd, &c, 1, (off_t)off), 1);
    c ^= mask;
    assert_int_equal(pwrite(fd, &c, 1, (off_t)off), 1);
    close(fd);
}

/* Tensor id written again from src heals it: read back into dst whole. */
static void rewrite_heals(nvme_store_t *s, int id, const unsigned char *src, unsigned char *dst, size_t n)
{
    assert_int_equal(nvme_store_write(s, id, src), ZO_OK);
    assert_int_equal(nvme_store_read(s, id, dst), ZO_OK);
    assert_memory_equal(dst, src, n);
}

/* A byte flipped in a file behind the store's back: ZO_ERR_CHECKSUM naming
 * the tensor and block; other tensors read fine; a rewrite heals it. */
static void test_store_byte_flipped(void **state)
{
    fixture *f = *state;
    nvme_store_t *s = store_on(f, 2, 64 * 1024, 32 * 1024);
    size_t n = 200000;
    int a = add1(s, "layer0.m", n), b = add1(s, "layer1.m", n);
    unsigned char *src = malloc(n), *dst = malloc(n);
    fill_bytes(src, n, 77);
    assert_int_equal(nvme_store_write(s, a, src), ZO_OK);
    assert_int_equal(nvme_store_write(s, b, src), ZO_OK);
    int k;
    flip_byte(s, a, 2 * 32 * 1024 + 123, 0x10, &k);
    assert_int_equal(nvme_store_read(s, a, dst), ZO_ERR_CHECKSUM);
    assert_non_null(strstr(zo_last_error(), "tensor layer0.m block 2 "));
    assert_non_null(strstr(zo_last_error(), store_path(s, k)));
    assert_int_equal(nvme_store_read(s, b, dst), ZO_OK);
    assert_memory_equal(dst, src, n);
    rewrite_heals(s, a, src, dst, n);
    free(src);
    free(dst);
    nvme_store_free(s);
}

/* A read in many pieces (129 checksum blocks: NVME_STORE_READ_PIECES pieces
 * of 3 blocks, the last one short), its blocks checked as the pieces
 * arrive: the bytes come back whole, and a byte flipped in a late block, then
 * in the first, is reported as that block either way. */
static void test_store_read_in_pieces(void **state)
{
    fixture *f = *state;
    size_t cb = 16 * 1024, n = 128 * cb + 5000;
    nvme_store_t *s = store_on(f, 1, 0, cb);
    int a = add1(s, "wte", n);
    unsigned char *src = malloc(n), *dst = malloc(n);
    fill_bytes(src, n, 91);
    assert_int_equal(nvme_store_write(s, a, src), ZO_OK);
    assert_int_equal(nvme_store_read(s, a, dst), ZO_OK);
    assert_memory_equal(dst, src, n);
    static const size_t bad[] = {100, 0};
    for (int i = 0; i < 2; i++) {
        int k;
        flip_byte(s, a, bad[i] * cb + 77, 0x01, &k);
        char want[64];
        snprintf(want, sizeof want, "tensor wte block %zu ", bad[i]);
        assert_int_equal(nvme_store_read(s, a, dst), ZO_ERR_CHECKSUM);
        assert_non_null(strstr(zo_last_error(), want));
    }
    rewrite_heals(s, a, src, dst, n);
    free(src);
    free(dst);
    nvme_store_free(s);
}

/* A swap file truncated behind the store's back: an end-of-file error naming
 * the tensor, the file and the offset; a rewrite heals it. */
static void test_store_file_truncated(void **state)
{
    fixture *f = *state;
    nvme_store_t *s = store_on(f, 1, 0, 0);
    size_t n = (3 << 20) + 5;
    int id = add1(s, "big", n);
    unsigned char *src = malloc(n), *dst = malloc(n);
    fill_bytes(src, n, 5);
    assert_int_equal(nvme_store_write(s, id, src), ZO_OK);
    assert_int_equal(truncate(store_path(s, 0), 3 << 19), 0);
    assert_int_equal(nvme_store_read(s, id, dst), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "tensor big"));
    assert_non_null(strstr(zo_last_error(), "unexpected end of file"));
    assert_non_null(strstr(zo_last_error(), "offset 1572864"));
    assert_int_equal(nvme_store_write(s, id, src), ZO_OK);
    assert_int_equal(nvme_store_read(s, id, dst), ZO_OK);
    assert_memory_equal(dst, src, n);
    free(src);
    free(dst);
    nvme_store_free(s);
}

/* Injected ENOSPC on a write: the error names the tensor and errno, the
 * tensor reads as missing, the others are intact, and a retry succeeds. */
static void test_store_injected_write_error(void **state)
{
    fixture *f = *state;
    nvme_store_t *s = store_on(f, 3, 64 * 1024, 0);
    size_t n = 500000;
    int a = add1(s, "a", n), b = add1(s, "b", n);
    unsigned char *src = malloc(n), *dst = malloc(n);
    fill_bytes(src, n, 8);
    assert_int_equal(nvme_store_write(s, a, src), ZO_OK);
    int k;
    uint64_t off;
    nvme_store_locate(s, b, 300000, &k, &off);
    f->fault = (fault_ctl){.mode = 1, .op = NVME_OP_WRITE, .err = ENOSPC,
                           .fid = nvme_store_file_id(s, k), .offset = off};
    assert_int_equal(nvme_store_write(s, b, src), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "tensor b:"));
    assert_non_null(strstr(zo_last_error(), "errno 28"));
    assert_int_equal(f->fault.hits, 1);
    f->fault.mode = 0;
    assert_int_equal(nvme_store_read(s, b, dst), ZO_ERR_NOT_FOUND);
    assert_int_equal(nvme_store_read(s, a, dst), ZO_OK);
    assert_memory_equal(dst, src, n);
    assert_int_equal(nvme_store_write(s, b, src), ZO_OK);
    assert_int_equal(nvme_store_read(s, b, dst), ZO_OK);
    assert_memory_equal(dst, src, n);
    assert_int_equal(nvme_engine_busy(f->e), 0);
    free(src);
    free(dst);
    nvme_store_free(s);
}

/* Mount a tmpfs of `size` bytes (root only); 0 when it cannot be done. */
static int mount_tiny(fixture *f, const char *size)
{
    if (geteuid() != 0) return 0;
    snprintf(f->mnt, sizeof f->mnt, "%s/tiny", f->dir);
    if (mkdir(f->mnt, 0700) != 0) return 0;
    char opts[64];
    snprintf(opts, sizeof opts, "size=%s", size);
    if (mount("zo-tiny", f->mnt, "tmpfs", 0, opts) != 0) {
        rmdir(f->mnt);
        f->mnt[0] = '\0';
        return 0;
    }
    return 1;
}

/* A real file system that fills up: capacity is refused up front with a
 * clear message; a write that meets a full disk fails with ENOSPC, and once
 * space is freed the same write succeeds. */
static void test_store_tiny_filesystem(void **state)
{
    fixture *f = *state;
    if (!mount_tiny(f, "2m")) skip(); /* needs root; the RLIMIT_FSIZE test covers the rest */
    const char *dirs[1] = {f->mnt};
    nvme_store_config cfg = {.dirs = dirs, .ndirs = 1};
    nvme_store_t *s;
    assert_int_equal(nvme_store_init(&s, f->e, &cfg), ZO_OK);
    int id;
    const char *huge_name[1] = {"huge"};
    size_t huge = 8 << 20;
    assert_int_equal(nvme_store_add(s, 1, huge_name, &huge, &id), ZO_ERR_CAPACITY);
    assert_non_null(strstr(zo_last_error(), f->mnt));
    assert_non_null(strstr(zo_last_error(), "free"));
    size_t n = 512 * 1024;
    int t = add1(s, "t", n), u = add1(s, "u", n);
    unsigned char *src = malloc(n), *dst = malloc(n);
    fill_bytes(src, n, 21);
    assert_int_equal(nvme_store_write(s, t, src), ZO_OK);
    /* Fill the rest of the file system behind the store's back. */
    char filler[700];
    snprintf(filler, sizeof filler, "%s/filler", f->mnt);
    int fd = open(filler, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    char chunk[4096];
    memset(chunk, 1, sizeof chunk);
    while (write(fd, chunk, sizeof chunk) > 0) {
    }
    close(fd);
    assert_int_equal(nvme_store_write(s, u, src), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "tensor u"));
    assert_non_null(strstr(zo_last_error(), "errno 28"));
    assert_int_equal(nvme_store_read(s, t, dst), ZO_OK); /* untouched */
    assert_memory_equal(dst, src, n);
    assert_int_equal(unlink(filler), 0);
    assert_int_equal(nvme_store_write(s, u, src), ZO_OK);
    assert_int_equal(nvme_store_read(s, u, dst), ZO_OK);
    assert_memory_equal(dst, src, n);
    nvme_store_free(s);
    free(src);
    free(dst);
}

/* A real short write / EFBIG without privileges: the file-size limit. */
static void test_store_file_size_limit(void **state)
{
    fixture *f = *state;
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    if (old.rlim_max != RLIM_INFINITY && old.rlim_max < (8u << 20)) skip();
    signal(SIGXFSZ, SIG_IGN);
    nvme_store_t *s = store_on(f, 1, 0, 0);
    size_t n = 1 << 20;
    int a = add1(s, "a", 256 * 1024), b = add1(s, "b", n);
    unsigned char *src = malloc(n), *dst = malloc(n);
    fill_bytes(src, n, 31);
    assert_int_equal(nvme_store_write(s, a, src), ZO_OK);
    struct rlimit lim = {512 * 1024, old.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    /* Capacity is refused up front ... */
    int c;
    const char *cname[1] = {"c"};
    size_t csize = 4 << 20;
    assert_int_equal(nvme_store_add(s, 1, cname, &csize, &c), ZO_ERR_CAPACITY);
    assert_non_null(strstr(zo_last_error(), "file-size limit"));
    /* ... and a write that crosses the limit fails with EFBIG. */
    zo_status st = nvme_store_write(s, b, src);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    assert_int_equal(st, ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "tensor b"));
    assert_non_null(strstr(zo_last_error(), "errno 27"));
    assert_int_equal(nvme_store_read(s, a, dst), ZO_OK);
    assert_memory_equal(dst, src, 256 * 1024);
    assert_int_equal(nvme_store_write(s, b, src), ZO_OK);
    assert_int_equal(nvme_store_read(s, b, dst), ZO_OK);
    assert_memory_equal(dst, src, n);
    nvme_store_free(s);
    free(src);
    free(dst);
}

static void test_store_capacity_message(void **state)
{
    fixture *f = *state;
    nvme_store_t *s = store_on(f, 2, 0, 0);
    const char *names[2] = {"x", "y"};
    size_t sizes[2] = {1ull << 60, 1ull << 60}; /* no disk has an exbibyte free */
    int ids[2];
    assert_int_equal(nvme_store_add(s, 2, names, sizes, ids), ZO_ERR_CAPACITY);
    const char *msg = zo_last_error();
    assert_non_null(strstr(msg, f->sub[0]));
    assert_non_null(strstr(msg, "free"));
    assert_int_equal(nvme_store_footprint(s), 0); /* nothing added */
    assert_int_equal(nvme_store_find(s, "x", ids), ZO_ERR_NOT_FOUND);
    nvme_store_free(s);
}

/* Sizes whose sum (with alignment) passes 2^64 are refused, not wrapped to a
 * small footprint whose tensors would overlap. */
static void test_store_size_overflow(void **state)
{
    fixture *f = *state;
    nvme_store_t *s = store_on(f, 2, 0, 0);
    int first = add1(s, "first", 5000);
    uint64_t footprint = nvme_store_footprint(s);
    static const size_t one[1] = {SIZE_MAX - 100};
    static const size_t two[2] = {(size_t)1 << 63, (size_t)1 << 63};
    const char *names[2] = {"x", "y"};
    int ids[2] = {-1, -1};
    assert_int_equal(nvme_store_add(s, 1, names, one, ids), ZO_ERR_CAPACITY);
    assert_int_equal(nvme_store_add(s, 2, names, two, ids), ZO_ERR_CAPACITY);
    assert_int_equal(nvme_store_footprint(s), footprint); /* nothing added */
    assert_int_equal(nvme_store_find(s, "x", ids), ZO_ERR_NOT_FOUND);
    /* the store still works: a later tensor lands after the first one */
    int later = add1(s, "x", 100);
    assert_true(nvme_store_footprint(s) > footprint);
    unsigned char a[5000], b[100], back[5000];
    fill_bytes(a, sizeof a, 1);
    fill_bytes(b, sizeof b, 2);
    assert_int_equal(nvme_store_write(s, first, a), ZO_OK);
    assert_int_equal(nvme_store_write(s, later, b), ZO_OK);
    assert_int_equal(nvme_store_read(s, first, back), ZO_OK);
    assert_memory_equal(back, a, sizeof a);
    nvme_store_free(s);
}

/* ---- the pipelined step ------------------------------------------------------------------ */

/* A plain Adam(W) step: the test's own update, used on both paths. */
typedef struct adam_ref {
    const float *grad;         /* (n_elems,) */
    float lr, beta1, beta2, eps, wd;
    long step;
    size_t calls[64];
    size_t ncalls;
    long fail_group;           /* return an error at this sub-group; -1 never */
} adam_ref;

static zo_status adam_cb(void *user, size_t group, size_t first, size_t n, float *w, float *m,
                         float *v)
{
    adam_ref *a = user;
    if (a->ncalls < 64) a->calls[a->ncalls++] = group;
    if ((long)group == a->fail_group) return zo_error(ZO_ERR_INVALID, "injected update failure");
    float bc1 = 1.0f - powf(a->beta1, (float)a->step);
    float bc2 = 1.0f - powf(a->beta2, (float)a->step);
    for (size_t i = 0; i < n; i++) {
        float g = a->grad[first + i];
        m[i] = a->beta1 * m[i] + (1.0f - a->beta1) * g;
        v[i] = a->beta2 * v[i] + (1.0f - a->beta2) * g * g;
        float upd = (m[i] / bc1) / (sqrtf(v[i] / bc2) + a->eps);
        w[i] -= a->lr * (upd + a->wd * w[i]);
    }
    return ZO_OK;
}

static void random_floats(float *p, size_t n, uint32_t seed, float scale)
{
    uint32_t x = seed * 747796405u + 2891336453u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = scale * ((float)(x >> 8) / 16777216.0f - 0.5f);
    }
}

typedef struct pipe_case {
    size_t n, ge;
    int nslots, ndirs;
    int faults;   /* benign short/EAGAIN faults on every request */
} pipe_case;

static void run_pipe_case(fixture *f, const pipe_case *pc)
{
    nvme_store_t *s = store_on(f, pc->ndirs, 64 * 1024, 0);
    nvme_pipeline_t *p;
    nvme_pipeline_config cfg = {.n_elems = pc->n, .group_elems = pc->ge, .nslots = pc->nslots};
    assert_int_equal(nvme_pipeline_init(&p, s, &cfg), ZO_OK);
    size_t K = nvme_pipeline_groups(p), n = pc->n;
    assert_int_equal(K, (n + pc->ge - 1) / pc->ge);
    /* In-memory reference state (n,) x 3, and a gradient per step. */
    float *w = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4), *g = malloc(n * 4);
    random_floats(w, n, 1, 2.0f);
    random_floats(m, n, 2, 0.01f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(m[i]) * 0.1f;
    for (size_t gi = 0; gi < K; gi++) {
        size_t first, len;
        nvme_pipeline_group_range(p, gi, &first, &len);
        assert_int_equal(nvme_pipeline_store_group(p, gi, w + first, m + first, v + first), ZO_OK);
    }
    f->fault.mode = pc->faults ? 2 : 0;
    adam_ref a = {.grad = g, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                  .wd = 0.01f, .fail_group = -1};
    for (long step = 1; step <= 3; step++) {
        random_floats(g, n, 100 + (uint32_t)step, 1.0f);
        a.step = step;
        a.ncalls = 0;
        nvme_step_stats st;
        assert_int_equal(nvme_pipeline_step(p, adam_cb, &a, &st), ZO_OK);
        assert_int_equal(a.ncalls, K < 64 ? K : 64);
        for (size_t i = 0; i < a.ncalls; i++) assert_int_equal(a.calls[i], i); /* in order */
        assert_int_equal(st.bytes_read, 12ull * n);
        assert_true(st.seconds >= st.update_seconds);
        /* The same update over the in-memory state. */
        for (size_t gi = 0; gi < K; gi++) {
            size_t first, len;
            nvme_pipeline_group_range(p, gi, &first, &len);
            assert_int_equal(adam_cb(&a, gi, first, len, w + first, m + first, v + first), ZO_OK);
        }
    }
    f->fault.mode = 0;
    if (pc->faults) assert_true(f->fault.hits > 0);
    /* Bit-identical: compare the raw bytes of every sub-group. */
    float *dw = malloc(pc->ge * 4), *dm = malloc(pc->ge * 4), *dv = malloc(pc->ge * 4);
    for (size_t gi = 0; gi < K; gi++) {
        size_t first, len;
        nvme_pipeline_group_range(p, gi, &first, &len);
        assert_int_equal(nvme_pipeline_load_group(p, gi, dw, dm, dv), ZO_OK);
        assert_memory_equal(dw, w + first, len * 4);
        assert_memory_equal(dm, m + first, len * 4);
        assert_memory_equal(dv, v + first, len * 4);
    }
    assert_int_equal(nvme_engine_busy(f->e), 0);
    free(dw);
    free(dm);
    free(dv);
    free(w);
    free(m);
    free(v);
    free(g);
    nvme_pipeline_free(p);
    nvme_store_free(s);
}

static void test_pipeline_equals_in_memory(void **state)
{
    static const pipe_case cases[] = {
        {100003, 8192, 3, 1, 0},  /* 13 sub-groups, a short last one */
        {50000, 4000, 2, 2, 0},   /* two slots, two drives */
        {65536, 4096, 4, 3, 0},   /* exact division, four slots, three drives */
        {7, 1000, 3, 1, 0},       /* one tiny sub-group */
        {40000, 3000, 3, 2, 1},   /* short transfers and -EAGAIN everywhere */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_pipe_case(*state, &cases[i]);
}

/* Errors in a step (I/O, checksum, the callback's) are returned with the
 * sub-group and tensor named; the pipeline works again afterwards. */
static void test_pipeline_errors(void **state)
{
    fixture *f = *state;
    nvme_store_t *s = store_on(f, 1, 0, 0);
    size_t n = 40960, ge = 4096;
    nvme_pipeline_t *p;
    nvme_pipeline_config cfg = {.n_elems = n, .group_elems = ge, .prefix = "st"};
    assert_int_equal(nvme_pipeline_init(&p, s, &cfg), ZO_OK);
    float *w = calloc(ge, 4), *m = calloc(ge, 4), *v = calloc(ge, 4), *g = calloc(n, 4);
    random_floats(g, n, 9, 1.0f);
    for (size_t gi = 0; gi < nvme_pipeline_groups(p); gi++)
        assert_int_equal(nvme_pipeline_store_group(p, gi, w, m, v), ZO_OK);
    adam_ref a = {.grad = g, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                  .step = 1, .fail_group = 4};

    assert_int_equal(nvme_pipeline_step(p, adam_cb, &a, NULL), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "sub-group 4"));
    assert_non_null(strstr(zo_last_error(), "injected update failure"));
    assert_int_equal(nvme_engine_busy(f->e), 0);
    a.fail_group = -1;

    int id, k;
    uint64_t off;
    assert_int_equal(nvme_store_find(s, "st.6.m", &id), ZO_OK);
    nvme_store_locate(s, id, 100, &k, &off);
    f->fault = (fault_ctl){.mode = 1, .op = NVME_OP_READ, .err = EIO, .fid = -1, .offset = off};
    assert_int_equal(nvme_pipeline_step(p, adam_cb, &a, NULL), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "sub-group 6 read"));
    assert_non_null(strstr(zo_last_error(), "tensor st.6.m"));
    assert_non_null(strstr(zo_last_error(), "errno 5"));
    assert_int_equal(nvme_engine_busy(f->e), 0);
    f->fault.mode = 0;
    assert_int_equal(nvme_pipeline_step(p, adam_cb, &a, NULL), ZO_OK);

    /* A byte flipped in sub-group 3's v. */
    assert_int_equal(nvme_store_find(s, "st.3.v", &id), ZO_OK);
    nvme_store_locate(s, id, 4 * 1000, &k, &off);
    int fd = open(store_path(s, k), O_RDWR);
    unsigned char c;
    assert_int_equal(pread(fd, &c, 1, (off_t)off), 1);
    c ^= 1;
    assert_int_equal(pwrite(fd, &c, 1, (off_t)off), 1);
    close(fd);
    assert_int_equal(nvme_pipeline_step(p, adam_cb, &a, NULL), ZO_ERR_CHECKSUM);
    assert_non_null(strstr(zo_last_error(), "tensor st.3.v block 0"));

    /* A write-back that fails: named, that sub-group reads as missing until
     * it is stored again. */
    assert_int_equal(nvme_pipeline_store_group(p, 3, w, m, v), ZO_OK);
    assert_int_equal(nvme_store_find(s, "st.8.master", &id), ZO_OK);
    nvme_store_locate(s, id, 0, &k, &off);
    f->fault = (fault_ctl){.mode = 1, .op = NVME_OP_WRITE, .err = ENOSPC, .fid = -1, .offset = off};
    assert_int_equal(nvme_pipeline_step(p, adam_cb, &a, NULL), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "sub-group 8 write-back"));
    assert_non_null(strstr(zo_last_error(), "errno 28"));
    f->fault.mode = 0;
    assert_int_equal(nvme_pipeline_load_group(p, 8, w, m, v), ZO_ERR_NOT_FOUND);
    memset(w, 0, ge * 4);
    assert_int_equal(nvme_pipeline_store_group(p, 8, w, m, v), ZO_OK);
    assert_int_equal(nvme_pipeline_step(p, adam_cb, &a, NULL), ZO_OK);
    free(w);
    free(m);
    free(v);
    free(g);
    nvme_pipeline_free(p);
    nvme_store_free(s);
}

static void test_pipeline_capacity(void **state)
{
    fixture *f = *state;
    nvme_store_t *s = store_on(f, 1, 0, 0);
    nvme_pipeline_t *p;
    nvme_pipeline_config cfg = {.n_elems = 1ull << 58, .group_elems = 1ull << 50};
    assert_int_equal(nvme_pipeline_init(&p, s, &cfg), ZO_ERR_CAPACITY);
    assert_non_null(strstr(zo_last_error(), "optimizer state"));
    assert_non_null(strstr(zo_last_error(), "free"));
    nvme_store_free(s);
}

/* ---- swap files: exclusive, unique, locked, stale ones removed -------------------- */

static nvme_store_t *store_prefix(fixture *f, const char *prefix)
{
    const char *dirs[1] = {f->sub[0]};
    nvme_store_config cfg = {.dirs = dirs, .ndirs = 1, .prefix = prefix};
    nvme_store_t *s = NULL;
    assert_int_equal(nvme_store_init(&s, f->e, &cfg), ZO_OK);
    return s;
}

static int count_files(const char *dir, const char *glob)
{
    char cmd[800], out[64];
    snprintf(cmd, sizeof cmd, "ls -A %s | grep -c -E '%s'", dir, glob);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    out[0] = 0;
    assert_non_null(fgets(out, sizeof out, p));
    pclose(p);
    return atoi(out);
}

/* Two stores of one prefix in one directory (two runs, or two containers
 * whose pids are equal) have files of their own: neither truncates the
 * other's (the name was <prefix>.0.swap, opened with O_TRUNC, so the second
 * store emptied the first one's tensors). */
static void test_store_files_unique(void **state)
{
    fixture *f = *state;
    nvme_store_t *a = store_prefix(f, "zo-opt"), *b = store_prefix(f, "zo-opt");
    assert_string_not_equal(store_path(a, 0), store_path(b, 0));
    size_t n = 300000;
    int ia = add1(a, "t", n), ib = add1(b, "t", n);
    unsigned char *src = malloc(n), *src2 = malloc(n), *dst = malloc(n);
    fill_bytes(src, n, 1);
    fill_bytes(src2, n, 2);
    assert_int_equal(nvme_store_write(a, ia, src), ZO_OK);
    assert_int_equal(nvme_store_write(b, ib, src2), ZO_OK);
    assert_int_equal(nvme_store_read(a, ia, dst), ZO_OK);
    assert_memory_equal(dst, src, n);
    /* "<prefix>-<16 hex>.<k>.swap", locked while the store lives */
    const char *base = strrchr(store_path(a, 0), '/') + 1;
    assert_int_equal(strncmp(base, "zo-opt-", 7), 0);
    assert_int_equal(strspn(base + 7, "0123456789abcdef"), 16);
    assert_string_equal(base + 23, ".0.swap");
    int fd = open(store_path(a, 0), O_RDWR);
    assert_true(fd >= 0);
    assert_int_not_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    close(fd);
    char path[700];
    snprintf(path, sizeof path, "%s", store_path(a, 0));
    nvme_store_free(a);
    assert_int_not_equal(access(path, F_OK), 0); /* removed with the store */
    nvme_store_free(b);
    assert_int_equal(count_files(f->sub[0], "swap$"), 0);
    free(src);
    free(src2);
    free(dst);
}

/* A run killed left its swap file (unlocked): the next store of that prefix
 * in the directory removes it. Left alone: a live store's locked file, a
 * link named like a swap file (and what it points to), another prefix's
 * file, names that are not exactly a swap file's. */
static void test_store_stale_files(void **state)
{
    fixture *f = *state;
    const char *d = f->sub[0];
    char path[800], victim[800];
    nvme_store_t *live = store_prefix(f, "zo-par");
    snprintf(path, sizeof path, "%s/zo-par-0123456789abcdef.0.swap", d); /* a dead run's */
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0 && write(fd, "x", 1) == 1);
    close(fd);
    snprintf(victim, sizeof victim, "%s/victim.txt", f->dir);
    fd = open(victim, O_RDWR | O_CREAT, 0600);
    assert_true(fd >= 0 && write(fd, "precious", 8) == 8);
    close(fd);
    snprintf(path, sizeof path, "%s/zo-par-fedcba9876543210.0.swap", d);
    assert_int_equal(symlink(victim, path), 0);
    const char *others[] = {"zo-opt-0123456789abcdef.0.swap", "zo-par-0123456789abcdef.0.swap.bak",
                            "zo-par-0123456789ABCDEF.0.swap", "zo-par-12345.0.swap", "mine.swap"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", d, others[i]);
        fd = open(path, O_RDWR | O_CREAT, 0600);
        assert_true(fd >= 0);
        close(fd);
    }
    assert_int_equal(count_files(d, "^zo-par-"), 6);
    nvme_store_t *next = store_prefix(f, "zo-par");
    assert_int_equal(nvme_store_stale_removed(next), 1);
    snprintf(path, sizeof path, "%s/zo-par-0123456789abcdef.0.swap", d);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(access(store_path(live, 0), F_OK), 0);
    char buf[16] = {0};
    fd = open(victim, O_RDONLY);
    assert_int_equal(read(fd, buf, sizeof buf), 8);
    close(fd);
    assert_string_equal(buf, "precious");
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", d, others[i]);
        assert_int_equal(access(path, F_OK), 0);
    }
    /* the live store still works */
    size_t n = 4096;
    int id = add1(live, "w", n);
    unsigned char src[4096], dst[4096];
    fill_bytes(src, n, 3);
    assert_int_equal(nvme_store_write(live, id, src), ZO_OK);
    assert_int_equal(nvme_store_read(live, id, dst), ZO_OK);
    assert_memory_equal(dst, src, n);
    nvme_store_free(next);
    nvme_store_free(live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_store_round_trip_striped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_unwritten_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_byte_flipped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_read_in_pieces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_file_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_injected_write_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_tiny_filesystem, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_file_size_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_capacity_message, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_size_overflow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipeline_equals_in_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipeline_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipeline_capacity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_files_unique, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_stale_files, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
