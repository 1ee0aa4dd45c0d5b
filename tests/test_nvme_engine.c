/* Tests of the io_uring engine: round trips of odd ranges, queue depths
 * 1..64, buffered fallback, registered buffers, and every completion path
 * reached through the fault seam (short reads/writes, -EAGAIN, EIO, ENOSPC,
 * a failed fdatasync, end of file). Files live under the build directory:
 * /tmp may be a tmpfs. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "nvme/nvme_engine.h"

typedef struct fixture {
    char dir[512];
    char path[600];
} fixture;

/* Deterministic bytes that differ with seed and position. */
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

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s/nvme-engine-XXXXXX", ZO_BUILD_DIR);
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/data.bin", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    unlink(f->path);
    rmdir(f->dir);
    free(f);
    return 0;
}

/* Engine init, or skip the whole binary where io_uring is unavailable. */
static nvme_engine_t *engine_or_skip(const nvme_engine_config *cfg)
{
    nvme_engine_t *e = NULL;
    zo_status st = nvme_engine_init(&e, cfg);
    if (st == ZO_ERR_UNSUPPORTED) {
        fprintf(stderr, "skipped: %s\n", zo_last_error());
        exit(77);
    }
    assert_int_equal(st, ZO_OK);
    return e;
}

/* Compare with what an independent pread sees in the file. */
static void assert_file_holds(const char *path, uint64_t off, const unsigned char *want, size_t n)
{
    unsigned char *got = malloc(n);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, got, n, (off_t)off), (ssize_t)n);
    close(fd);
    assert_memory_equal(got, want, n);
    free(got);
}

static void test_round_trip_odd_ranges(void **state)
{
    fixture *f = *state;
    nvme_engine_config cfg = {.block_size = 64 * 1024, .queue_depth = 8};
    nvme_engine_t *e = engine_or_skip(&cfg);
    int fid;
    assert_int_equal(nvme_file_open(e, f->path, NVME_FILE_CREATE | NVME_FILE_TRUNC, &fid), ZO_OK);
    /* (offset, length) pairs: aligned, unaligned start/end/both, across blocks. */
    static const struct { uint64_t off; size_t len; } r[] = {
        {0, 1},         {1, 4095},        {4095, 4097},      {12345, (1 << 20) + 17},
        {4096, 196608}, {65536 - 100, 300}, {3 << 20, 65536 * 5}, {(5 << 20) + 7, 1},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        /* An aligned engine buffer for even cases, plain malloc+1 for odd ones. */
        unsigned char *src, *dst, *raw = NULL;
        void *abuf = NULL;
        if (i % 2 == 0) {
            assert_int_equal(nvme_buf_alloc(e, r[i].len, &abuf), ZO_OK);
            src = abuf;
        } else {
            raw = malloc(r[i].len + 1);
            src = raw + 1;
        }
        dst = malloc(r[i].len);
        fill_bytes(src, r[i].len, (uint32_t)i + 1);
        assert_int_equal(nvme_write(e, fid, src, r[i].len, r[i].off), ZO_OK);
        assert_int_equal(nvme_read(e, fid, dst, r[i].len, r[i].off), ZO_OK);
        assert_memory_equal(dst, src, r[i].len);
        assert_file_holds(f->path, r[i].off, src, r[i].len);
        free(dst);
        free(raw);
        nvme_buf_free(e, abuf);
    }
    assert_true(nvme_file_is_direct(e, fid)); /* the build directory is a real disk */
    nvme_engine_stats s;
    nvme_engine_get_stats(e, &s);
    assert_true(s.buffered_requests > 0); /* the unaligned pieces */
    assert_true(s.requests > s.buffered_requests);
    nvme_engine_free(e);
}

static void test_queue_depths(void **state)
{
    fixture *f = *state;
    static const unsigned qds[] = {1, 2, 3, 7, 16, 32, 64};
    size_t len = (3 << 20) + 4096 * 3; /* 3 MiB + 3 pages: a partial last block */
    for (size_t q = 0; q < sizeof qds / sizeof qds[0]; q++) {
        nvme_engine_config cfg = {.block_size = 32 * 1024, .queue_depth = qds[q]};
        nvme_engine_t *e = engine_or_skip(&cfg);
        assert_int_equal(nvme_engine_queue_depth(e), qds[q]);
        int fid;
        assert_int_equal(nvme_file_open(e, f->path, NVME_FILE_CREATE | NVME_FILE_TRUNC, &fid),
                         ZO_OK);
        void *src, *dst;
        assert_int_equal(nvme_buf_alloc(e, len, &src), ZO_OK);
        assert_int_equal(nvme_buf_alloc(e, len, &dst), ZO_OK);
        fill_bytes(src, len, 100 + (uint32_t)q);
        assert_int_equal(nvme_write(e, fid, src, len, 8192), ZO_OK);
        assert_int_equal(nvme_read(e, fid, dst, len, 8192), ZO_OK);
        assert_memory_equal(dst, src, len);
        nvme_engine_stats s;
        nvme_engine_get_stats(e, &s);
        /* Every block went out as its own request, all aligned and direct. */
        assert_int_equal(s.requests, 2 * ((len + 32767) / 32768));
        assert_int_equal(s.buffered_requests, 0);
        if (qds[q] > 1) assert_true(s.submits < s.requests); /* batched */
        nvme_buf_free(e, src);
        nvme_buf_free(e, dst);
        nvme_engine_free(e);
    }
}

static void test_many_transfers_at_once(void **state)
{
    fixture *f = *state;
    nvme_engine_config cfg = {.block_size = 16 * 1024, .queue_depth = 16};
    nvme_engine_t *e = engine_or_skip(&cfg);
    int fid;
    assert_int_equal(nvme_file_open(e, f->path, NVME_FILE_CREATE | NVME_FILE_TRUNC, &fid), ZO_OK);
    enum { N = 24, LEN = 100000 };
    unsigned char *src = malloc((size_t)N * LEN), *dst = malloc((size_t)N * LEN);
    fill_bytes(src, (size_t)N * LEN, 7);
    nvme_io io[N];
    memset(io, 0, sizeof io);
    for (int i = 0; i < N; i++) {
        io[i] = (nvme_io){.fid = fid, .op = NVME_OP_WRITE, .buf = src + (size_t)i * LEN,
                          .len = LEN, .offset = (uint64_t)i * LEN};
        assert_int_equal(nvme_io_submit(e, &io[i]), ZO_OK);
    }
    assert_int_equal(nvme_engine_busy(e), N);
    for (int i = N - 1; i >= 0; i--) assert_int_equal(nvme_io_wait(e, &io[i]), ZO_OK);
    assert_int_equal(nvme_engine_busy(e), 0);
    for (int i = 0; i < N; i++) {
        io[i] = (nvme_io){.fid = fid, .op = NVME_OP_READ, .buf = dst + (size_t)i * LEN,
                          .len = LEN, .offset = (uint64_t)i * LEN};
        assert_int_equal(nvme_io_submit(e, &io[i]), ZO_OK);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(nvme_io_wait(e, &io[i]), ZO_OK);
        assert_int_equal(io[i].bytes_done, LEN);
    }
    assert_memory_equal(dst, src, (size_t)N * LEN);
    free(src);
    free(dst);
    nvme_engine_free(e);
}

static void test_buffered_fallback(void **state)
{
    fixture *f = *state;
    nvme_engine_config cfg = {.buffered = 1, .block_size = 64 * 1024};
    nvme_engine_t *e = engine_or_skip(&cfg);
    int fid;
    assert_int_equal(nvme_file_open(e, f->path, NVME_FILE_CREATE | NVME_FILE_TRUNC, &fid), ZO_OK);
    assert_false(nvme_file_is_direct(e, fid));
    size_t len = 300000;
    void *src, *dst;
    assert_int_equal(nvme_buf_alloc(e, len, &src), ZO_OK);
    assert_int_equal(nvme_buf_alloc(e, len, &dst), ZO_OK);
    fill_bytes(src, len, 9);
    assert_int_equal(nvme_write(e, fid, src, len, 4096), ZO_OK);
    assert_int_equal(nvme_read(e, fid, dst, len, 4096), ZO_OK);
    assert_memory_equal(dst, src, len);
    nvme_engine_stats s;
    nvme_engine_get_stats(e, &s);
    assert_int_equal(s.buffered_requests, s.requests - 1); /* all but the fdatasync */
    nvme_buf_free(e, src);
    nvme_buf_free(e, dst);
    nvme_engine_free(e);
}

static void test_registered_buffers_used(void **state)
{
    fixture *f = *state;
    nvme_engine_t *e = engine_or_skip(NULL);
    if (strstr(nvme_engine_notes(e), "registered")) {
        nvme_engine_free(e);
        skip(); /* the kernel refused registration; plain requests are tested elsewhere */
    }
    int fid;
    assert_int_equal(nvme_file_open(e, f->path, NVME_FILE_CREATE | NVME_FILE_TRUNC, &fid), ZO_OK);
    void *b;
    size_t len = 3 << 20;
    assert_int_equal(nvme_buf_alloc(e, len, &b), ZO_OK);
    fill_bytes(b, len, 3);
    assert_int_equal(nvme_write(e, fid, b, len, 0), ZO_OK);
    nvme_engine_stats s;
    nvme_engine_get_stats(e, &s);
    assert_int_equal(s.fixed_requests, 3);
    /* A heap buffer is not registered: plain requests, same result. */
    unsigned char *h = aligned_alloc(4096, len);
    assert_int_equal(nvme_read(e, fid, h, len, 0), ZO_OK);
    assert_memory_equal(h, b, len);
    nvme_engine_get_stats(e, &s);
    assert_int_equal(s.fixed_requests, 3);
    free(h);
    nvme_buf_free(e, b);
    nvme_engine_free(e);
}

/* ---- the fault seam ------------------------------------------------------------- */

typedef enum fault_mode {
    FAULT_NONE = 0,
    FAULT_SHORT,      /* every first attempt of a piece transfers half */
    FAULT_EAGAIN,     /* every other completion is -EAGAIN */
    FAULT_EINTR,
    FAULT_ERROR_AT,   /* `err` for the piece at `offset` */
    FAULT_FSYNC_ERROR,
} fault_mode;

typedef struct fault_ctl {
    fault_mode mode;
    nvme_op_kind op;  /* which kind of request is hit */
    int err;
    uint64_t offset;
    unsigned calls, hits;
} fault_ctl;

static int fault_hook(void *user, const nvme_fault_info *info, int res)
{
    fault_ctl *c = user;
    c->calls++;
    if (c->mode == FAULT_NONE || res < 0) return res;
    if (c->mode == FAULT_FSYNC_ERROR) {
        if (info->op != NVME_OP_FSYNC) return res;
        c->hits++;
        return -c->err;
    }
    if (info->op != c->op) return res;
    switch (c->mode) {
    case FAULT_SHORT:
        if (res >= 2 && (size_t)res == info->len) {
            c->hits++;
            return res / 2;
        }
        return res;
    case FAULT_EAGAIN:
    case FAULT_EINTR:
        if (c->calls % 2) {
            c->hits++;
            return c->mode == FAULT_EAGAIN ? -EAGAIN : -EINTR;
        }
        return res;
    case FAULT_ERROR_AT:
        if (info->offset <= c->offset && c->offset < info->offset + info->len) {
            c->hits++;
            return -c->err;
        }
        return res;
    default:
        return res;
    }
}

static nvme_engine_t *fault_engine(fault_ctl *c, int buffered)
{
    nvme_engine_config cfg = {.block_size = 64 * 1024, .queue_depth = 8, .fault = fault_hook,
                              .fault_user = c, .buffered = buffered};
    return engine_or_skip(&cfg);
}

/* Write then read [off, off+len) with faults on `op`; the data must survive. */
static void round_trip_with(fixture *f, fault_ctl *c, size_t len, uint64_t off,
                            nvme_engine_stats *s)
{
    nvme_engine_t *e = fault_engine(c, 0);
    int fid;
    assert_int_equal(nvme_file_open(e, f->path, NVME_FILE_CREATE | NVME_FILE_TRUNC, &fid), ZO_OK);
    void *src, *dst;
    assert_int_equal(nvme_buf_alloc(e, len, &src), ZO_OK);
    assert_int_equal(nvme_buf_alloc(e, len, &dst), ZO_OK);
    fill_bytes(src, len, 11);
    assert_int_equal(nvme_write(e, fid, src, len, off), ZO_OK);
    assert_int_equal(nvme_read(e, fid, dst, len, off), ZO_OK);
    assert_memory_equal(dst, src, len);
    assert_file_holds(f->path, off, src, len);
    nvme_engine_get_stats(e, s);
    nvme_buf_free(e, src);
    nvme_buf_free(e, dst);
    nvme_engine_free(e);
}

static void test_fault_short_reads(void **state)
{
    fault_ctl c = {.mode = FAULT_SHORT, .op = NVME_OP_READ};
    nvme_engine_stats s;
    round_trip_with(*state, &c, (1 << 20) + 12288, 4096, &s);
    assert_true(c.hits >= 17);
    assert_true(s.short_requeues >= c.hits);
}

static void test_fault_short_writes(void **state)
{
    fault_ctl c = {.mode = FAULT_SHORT, .op = NVME_OP_WRITE};
    nvme_engine_stats s;
    round_trip_with(*state, &c, 777777, 12345, &s); /* odd: halves land unaligned */
    assert_true(c.hits >= 12);
    assert_true(s.short_requeues >= c.hits);
}

static void test_fault_eagain_eintr(void **state)
{
    nvme_engine_stats s;
    fault_ctl c = {.mode = FAULT_EAGAIN, .op = NVME_OP_READ};
    round_trip_with(*state, &c, 1 << 20, 0, &s);
    assert_true(c.hits >= 8);
    assert_int_equal(s.retries, c.hits);
    fault_ctl d = {.mode = FAULT_EINTR, .op = NVME_OP_WRITE};
    round_trip_with(*state, &d, 1 << 20, 0, &s);
    assert_true(d.hits >= 8);
    assert_int_equal(s.retries, d.hits);
}

/* An error on one piece fails the transfer with errno, file and offset; the
 * engine keeps working once the fault is gone. */
static void error_then_recover(fixture *f, nvme_op_kind op, int err, const char *errtext)
{
    fault_ctl c = {.mode = FAULT_ERROR_AT, .op = op, .err = err, .offset = 3 * 65536 + 5};
    nvme_engine_t *e = fault_engine(&c, 0);
    int fid;
    assert_int_equal(nvme_file_open(e, f->path, NVME_FILE_CREATE | NVME_FILE_TRUNC, &fid), ZO_OK);
    size_t len = 8 * 65536;
    void *src, *dst;
    assert_int_equal(nvme_buf_alloc(e, len, &src), ZO_OK);
    assert_int_equal(nvme_buf_alloc(e, len, &dst), ZO_OK);
    fill_bytes(src, len, 12);
    if (op == NVME_OP_READ) {
        c.mode = FAULT_NONE;
        assert_int_equal(nvme_write(e, fid, src, len, 0), ZO_OK);
        c.mode = FAULT_ERROR_AT;
    }
    zo_status st = op == NVME_OP_READ ? nvme_read(e, fid, dst, len, 0)
                                      : nvme_write(e, fid, src, len, 0);
    assert_int_equal(st, ZO_ERR_IO);
    const char *msg = zo_last_error();
    char want[64];
    snprintf(want, sizeof want, "errno %d", err);
    assert_non_null(strstr(msg, want));
    assert_non_null(strstr(msg, errtext));
    assert_non_null(strstr(msg, f->path));
    assert_non_null(strstr(msg, "offset 196608"));
    assert_non_null(strstr(msg, op == NVME_OP_READ ? "read" : "write"));
    assert_int_equal(nvme_engine_busy(e), 0);
    /* Usable afterwards: the same transfer succeeds without the fault. */
    c.mode = FAULT_NONE;
    assert_int_equal(nvme_write(e, fid, src, len, 0), ZO_OK);
    assert_int_equal(nvme_read(e, fid, dst, len, 0), ZO_OK);
    assert_memory_equal(dst, src, len);
    nvme_buf_free(e, src);
    nvme_buf_free(e, dst);
    nvme_engine_free(e);
}

static void test_fault_eio_read(void **state)
{
    error_then_recover(*state, NVME_OP_READ, EIO, strerror(EIO));
}

static void test_fault_enospc_write(void **state)
{
    error_then_recover(*state, NVME_OP_WRITE, ENOSPC, strerror(ENOSPC));
}

static void test_fault_eio_write(void **state)
{
    error_then_recover(*state, NVME_OP_WRITE, EIO, strerror(EIO));
}

/* Buffered writes are only done once fdatasync says so. */
static void test_fault_fsync_error(void **state)
{
    fixture *f = *state;
    fault_ctl c = {.mode = FAULT_FSYNC_ERROR, .err = EIO};
    nvme_engine_t *e = fault_engine(&c, 1);
    int fid;
    assert_int_equal(nvme_file_open(e, f->path, NVME_FILE_CREATE | NVME_FILE_TRUNC, &fid), ZO_OK);
    unsigned char buf[10000];
    fill_bytes(buf, sizeof buf, 5);
    assert_int_equal(nvme_write(e, fid, buf, sizeof buf, 0), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "fdatasync"));
    assert_non_null(strstr(zo_last_error(), "errno 5"));
    assert_int_equal(c.hits, 1);
    c.mode = FAULT_NONE;
    assert_int_equal(nvme_write(e, fid, buf, sizeof buf, 0), ZO_OK);
    nvme_engine_free(e);
}

static void test_read_past_end(void **state)
{
    fixture *f = *state;
    nvme_engine_t *e = engine_or_skip(NULL);
    int fid;
    assert_int_equal(nvme_file_open(e, f->path, NVME_FILE_CREATE | NVME_FILE_TRUNC, &fid), ZO_OK);
    void *b;
    assert_int_equal(nvme_buf_alloc(e, 1 << 20, &b), ZO_OK);
    assert_int_equal(nvme_write(e, fid, b, 8192, 0), ZO_OK);
    assert_int_equal(nvme_read(e, fid, b, 1 << 20, 0), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "unexpected end of file"));
    assert_non_null(strstr(zo_last_error(), "offset 8192"));
    assert_int_equal(nvme_read(e, fid, b, 8192, 0), ZO_OK);
    nvme_buf_free(e, b);
    nvme_engine_free(e);
}

static void *wake_thread(void *arg)
{
    nvme_engine_wakeup(arg);
    return NULL;
}

/* A wait with nothing in flight ends when another thread calls wakeup
 * (before or after the wait began: the eventfd keeps the wakeup). */
static void test_wakeup_from_another_thread(void **state)
{
    (void)state;
    nvme_engine_t *e = engine_or_skip(NULL);
    for (int i = 0; i < 3; i++) {
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, wake_thread, e), 0);
        assert_int_equal(nvme_engine_progress(e, 1), ZO_OK);
        pthread_join(t, NULL);
    }
    nvme_engine_free(e);
}

static void test_invalid_arguments(void **state)
{
    fixture *f = *state;
    nvme_engine_t *e = NULL;
    nvme_engine_config bad = {.block_size = 1000};
    assert_int_equal(nvme_engine_init(&e, &bad), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "block_size"));
    e = engine_or_skip(NULL);
    char buf[16];
    assert_int_equal(nvme_read(e, 5, buf, sizeof buf, 0), ZO_ERR_INVALID);
    int fid;
    char missing[700];
    snprintf(missing, sizeof missing, "%s/no/such/file", f->dir);
    assert_int_equal(nvme_file_open(e, missing, 0, &fid), ZO_ERR_NOT_FOUND);
    assert_non_null(strstr(zo_last_error(), missing));
    nvme_engine_free(e);
}

/* NVME_FILE_EXCL: a file of the engine's own or nothing; a link planted
 * under the name is not followed (its target keeps its bytes), nor is an
 * existing file truncated. A descriptor handed over (nvme_file_open_fd)
 * gets its O_DIRECT twin on the same file even after the name moved. */
static void test_exclusive_create(void **state)
{
    fixture *f = *state;
    nvme_engine_t *e = engine_or_skip(NULL);
    char victim[700], moved[700];
    snprintf(victim, sizeof victim, "%s/victim", f->dir);
    int fd = open(victim, O_RDWR | O_CREAT, 0600);
    assert_true(fd >= 0 && write(fd, "precious", 8) == 8);
    close(fd);
    assert_int_equal(symlink(victim, f->path), 0);
    int fid;
    assert_int_equal(nvme_file_open(e, f->path, NVME_FILE_EXCL, &fid), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "File exists"));
    assert_int_equal(unlink(f->path), 0);
    assert_int_equal(nvme_file_open(e, victim, NVME_FILE_EXCL, &fid), ZO_ERR_IO);
    struct stat sb;
    assert_int_equal(stat(victim, &sb), 0);
    assert_int_equal(sb.st_size, 8);
    assert_int_equal(nvme_file_open(e, f->path, NVME_FILE_EXCL, &fid), ZO_OK);
    assert_int_equal(nvme_file_close(e, fid), ZO_OK);
    /* a descriptor handed over, its name moved before the engine opens it */
    fd = open(f->path, O_RDWR);
    assert_true(fd >= 0);
    snprintf(moved, sizeof moved, "%s/moved", f->dir);
    assert_int_equal(rename(f->path, moved), 0);
    assert_int_equal(symlink(victim, f->path), 0);
    assert_int_equal(nvme_file_open_fd(e, fd, f->path, &fid), ZO_OK);
    close(fd);
    unsigned char *buf;
    assert_int_equal(nvme_buf_alloc(e, 4096, (void **)&buf), ZO_OK);
    fill_bytes(buf, 4096, 9);
    assert_int_equal(nvme_write(e, fid, buf, 4096, 0), ZO_OK);
    assert_int_equal(nvme_file_close(e, fid), ZO_OK);
    assert_file_holds(moved, 0, buf, 4096);
    assert_int_equal(stat(victim, &sb), 0);
    assert_int_equal(sb.st_size, 8);
    nvme_buf_free(e, buf);
    nvme_engine_free(e);
    unlink(moved);
    unlink(victim);
}

/* A transfer whose end passes the largest file offset (off_t) is refused
 * whole: split into pieces, its first piece would fail (a negative offset)
 * while a later one, its offset wrapped past 2^64, wrote over the start of
 * the file. */
static void test_offset_overflow_refused(void **state)
{
    fixture *f = *state;
    nvme_engine_t *e = engine_or_skip(&(nvme_engine_config){.block_size = 4096});
    int fid;
    assert_int_equal(nvme_file_open(e, f->path, NVME_FILE_CREATE | NVME_FILE_TRUNC, &fid), ZO_OK);
    void *buf;
    assert_int_equal(nvme_buf_alloc(e, 3 * 4096, &buf), ZO_OK);
    unsigned char *want = malloc(3 * 4096);
    fill_bytes(want, 3 * 4096, 7);
    memcpy(buf, want, 3 * 4096);
    assert_int_equal(nvme_write(e, fid, buf, 3 * 4096, 0), ZO_OK);
    memset(buf, 0xab, 3 * 4096);
    static const uint64_t offs[] = {UINT64_MAX - 4095, UINT64_MAX - 8191, (uint64_t)INT64_MAX - 4095};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        assert_int_equal(nvme_write(e, fid, buf, 3 * 4096, offs[i]), ZO_ERR_INVALID);
        assert_non_null(strstr(zo_last_error(), "offset"));
        assert_int_equal(nvme_read(e, fid, buf, 3 * 4096, offs[i]), ZO_ERR_INVALID);
        assert_int_equal(nvme_engine_busy(e), 0);
    }
    assert_file_holds(f->path, 0, want, 3 * 4096);
    free(want);
    nvme_buf_free(e, buf);
    nvme_engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_odd_ranges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_depths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_transfers_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_buffered_fallback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registered_buffers_used, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_short_reads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_short_writes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_eagain_eintr, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_eio_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_enospc_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_eio_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_fsync_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_past_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wakeup_from_another_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_offset_overflow_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exclusive_create, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
