/* Tests for gpu/comm.h: every collective on every dtype (fp32, fp16, bf16),
 * in place and out of place, blocking and asynchronous, on odd sizes and
 * sizes the rank count does not divide, against a reference each rank
 * computes locally (the inputs are a deterministic function of rank and
 * index, so every rank knows what all the others sent); ordering by device
 * events with the CPU device; launch variables, shards and argument errors.
 *
 * Run as one plain process (the SELF backend) and under mpiexec with 1, 2
 * and 4 ranks (`test_comm --backend mpi`). With `--split parity` (colors
 * world rank % 2, one key: ranked by world rank) or `--split reverse` (one
 * color, keys reversing the world's order) every test runs on that
 * sub-communicator of the world instead: the inputs are a function of the
 * world rank, so a child whose ranks are not the members the test expects,
 * in the order it expects, or that receives the other child's data, fails.
 * Sub-communicators themselves (ranks, COMM_SPLIT_NONE, a child of a child,
 * either freed first, two children used alternately, their counters) are
 * tested on the world in every mode. Every rank runs the same
 * collectives; a check counts mismatches locally, then the ranks sum their
 * counts so that all of them pass or fail the same assertion (a rank that
 * left a test early would leave the others waiting in a collective). */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/comm.h"              /* defines: comm_init, comm_all_reduce, ... */
#include "gpu/device.h"            /* defines: gpu_device_open, gpu_cuda_device_count */

static comm_t C;
static int R, N; /* rank, size */
static comm_backend backend = COMM_BACKEND_AUTO;
/* --split: the world; the world rank of each rank of C (NULL: C is the world) */
static comm_t World;
static int *Who;
typedef enum split_mode { SPLIT_NONE = 0, SPLIT_PARITY, SPLIT_REVERSE } split_mode;
static split_mode Split;

static const zo_dtype dtypes[] = {ZO_DTYPE_F32, ZO_DTYPE_F16, ZO_DTYPE_BF16};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])
/* odd sizes, primes, sizes no rank count divides, one larger than a page */
static const size_t sizes[] = {1, 3, 7, 64, 1001, 4099, 65537};
#define N_SIZES (sizeof sizes / sizeof sizes[0])

/* One case of a collective's test: a dtype, a size, in place or not. */
typedef struct tcase {
    zo_dtype t;
    size_t n, es;
    int in_place;
} tcase;
#define N_CASES ((int)(N_DTYPES * N_SIZES * 2))

static tcase case_at(int i)
{
    tcase c = {.t = dtypes[(size_t)i / (N_SIZES * 2)], .n = sizes[((size_t)i / 2) % N_SIZES],
               .in_place = i % 2};
    c.es = zo_dtype_size(c.t);
    return c;
}

/* ---- inputs and references --------------------------------------------------------- */

typedef enum input_kind {
    INPUT_INTEGER, /* small integers: every partial sum exact in bf16, any order */
    INPUT_FRACTION /* values in [-2, 2): sums round, checked against a bound */
} input_kind;

static double round_to(double v, zo_dtype t)
{
    uint16_t h[1];
    float f[1];
    void *p = t == ZO_DTYPE_F32 ? (void *)f : (void *)h;
    zo_store_f32(p, t, 0, (float)v);
    return zo_load_f32(p, t, 0);
}

/* What rank r holds at index i, as stored in t. */
static double input(int r, size_t i, input_kind k, zo_dtype t)
{
    if (Who) r = Who[r]; /* a sub-communicator's rank: its world rank's input */
    if (k == INPUT_INTEGER) return (double)((int)((i * 131 + (size_t)r * 17 + 5) % 33) - 16);
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull + (uint64_t)(r + 1) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    return round_to((double)(x >> 11) / 9007199254740992.0 * 4.0 - 2.0, t);
}

static void fill(void *buf, zo_dtype t, size_t n, int r, input_kind k, size_t first)
{
    for (size_t i = 0; i < n; i++) zo_store_f32(buf, t, i, (float)input(r, first + i, k, t));
}

/* The unit roundoff of t: the relative error of one rounding. */
static double unit_roundoff(zo_dtype t)
{
    return t == ZO_DTYPE_F32 ? 0x1p-24 : t == ZO_DTYPE_F16 ? 0x1p-11 : 0x1p-8;
}

/* Check the sum over ranks of input(., first + i): exact for integers; for
 * fractions within N roundings of the sum of magnitudes (each step of the
 * backend's algorithm rounds once, plus the final store). Returns the number
 * of mismatches, printing the first. */
static int check_sum(const void *got, zo_dtype t, size_t n, input_kind k, size_t first,
                     const char *what)
{
    int wrong = 0;
    for (size_t i = 0; i < n; i++) {
        double ref = 0.0, mag = 0.0;
        for (int r = 0; r < N; r++) {
            double v = input(r, first + i, k, t);
            ref += v;
            mag += fabs(v);
        }
        double g = zo_load_f32(got, t, i);
        double tol = k == INPUT_INTEGER ? 0.0 : (double)N * unit_roundoff(t) * mag + 1e-30;
        if (!(fabs(g - ref) <= tol)) {
            if (!wrong)
                fprintf(stderr, "rank %d: %s %s: element %zu = %.9g, expected %.9g (tol %.3g)\n",
                        R, what, zo_dtype_name(t), first + i, g, ref, tol);
            wrong++;
        }
    }
    return wrong;
}

/* Elements equal to rank r's input (a copy: exact). */
static int check_copy(const void *got, zo_dtype t, size_t n, int r, size_t first, const char *what)
{
    int wrong = 0;
    for (size_t i = 0; i < n; i++) {
        double g = zo_load_f32(got, t, i), ref = input(r, first + i, INPUT_FRACTION, t);
        if (g != ref) {
            if (!wrong)
                fprintf(stderr, "rank %d: %s %s: element %zu = %.9g, expected rank %d's %.9g\n",
                        R, what, zo_dtype_name(t), first + i, g, r, ref);
            wrong++;
        }
    }
    return wrong;
}

/* ---- buffers: host memory, or device memory with a host mirror -------------------------
 * The MPI and SELF backends take host buffers (d == h); NCCL takes device
 * memory, filled from and read back into the host mirror. */
static gpu_device_t Dev; /* the CUDA device for NCCL, else NULL */
static gpu_stream_t Copy;

typedef struct buf {
    char *h, *d;
    size_t bytes;
    int owner;
} buf;

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static buf balloc(size_t bytes)
{
    buf b = {.h = xmalloc(bytes), .bytes = bytes, .owner = 1};
    b.d = b.h;
    if (comm_device_buffers(C))
        assert_int_equal(gpu_mem_alloc(Dev, bytes ? bytes : 1, (void **)&b.d), ZO_OK);
    return b;
}

/* bytes [off, off + bytes) of b: an in-place view */
static buf bsub(buf b, size_t off, size_t bytes)
{
    buf v = {.h = b.h + off, .d = b.d + off, .bytes = bytes};
    return v;
}

static void bmove(buf b, int to_device)
{
    if (b.d == b.h || !b.bytes) return;
    if (to_device)
        assert_int_equal(gpu_memcpy_async(Copy, b.d, b.h, b.bytes, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    else
        assert_int_equal(gpu_memcpy_async(Copy, b.h, b.d, b.bytes, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(Copy), ZO_OK);
}
static void bpush(buf b) { bmove(b, 1); }
static void bpull(buf b) { bmove(b, 0); }

static void bfree(buf b)
{
    if (!b.owner) return;
    if (b.d != b.h) gpu_mem_free(Dev, b.d);
    free(b.h);
}

/* Every rank's v (a mismatch count), summed over the ranks of c (through
 * the communicator itself, on fp32 integers: exact). */
static int sum_over(comm_t c, int v)
{
    buf w = balloc(sizeof(float));
    *(float *)w.h = (float)v;
    bpush(w);
    assert_int_equal(comm_all_reduce(c, w.d, w.d, 1, ZO_DTYPE_F32, NULL, NULL), ZO_OK);
    bpull(w);
    int total = (int)*(float *)w.h;
    bfree(w);
    return total;
}
static int agree(int wrong) { return sum_over(C, wrong); }

static zo_status open_comm(const comm_options *o, comm_t *out);

/* ---- launch, shards, names ---------------------------------------------------------- */

static const char *const launch_vars[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                          "PMI_RANK", "PMI_SIZE"};
#define N_LAUNCH_VARS 4

static void test_launch_detect(void **state)
{
    (void)state;
    char *saved[N_LAUNCH_VARS];
    for (int v = 0; v < N_LAUNCH_VARS; v++) {
        const char *s = getenv(launch_vars[v]);
        saved[v] = s ? strdup(s) : NULL;
        unsetenv(launch_vars[v]);
    }
    comm_launch l;
    assert_int_equal(comm_launch_detect(&l), ZO_OK);
    assert_int_equal(l.found, 0);
    assert_int_equal(l.rank, 0);
    assert_int_equal(l.size, 1);

    setenv("PMI_RANK", "2", 1);
    setenv("PMI_SIZE", "4", 1);
    assert_int_equal(comm_launch_detect(&l), ZO_OK);
    assert_int_equal(l.found, 1);
    assert_int_equal(l.rank, 2);
    assert_int_equal(l.size, 4);
    assert_string_equal(l.size_var, "PMI_SIZE");

    /* Open MPI's variables come first */
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    assert_int_equal(comm_launch_detect(&l), ZO_OK);
    assert_int_equal(l.rank, 0);
    assert_int_equal(l.size, 3);
    assert_string_equal(l.rank_var, "OMPI_COMM_WORLD_RANK");

    /* malformed, out of range, half set: refused by name */
    setenv("OMPI_COMM_WORLD_RANK", "x1", 1);
    assert_int_equal(comm_launch_detect(&l), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "OMPI_COMM_WORLD_RANK"));
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    assert_int_equal(comm_launch_detect(&l), ZO_ERR_INVALID);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    assert_int_equal(comm_launch_detect(&l), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "OMPI_COMM_WORLD_SIZE"));

#if !(defined(ZO_HAVE_MPI) && ZO_HAVE_MPI)
    /* a launcher's several ranks in a build without MPI: refused, not SELF */
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    comm_t c = NULL;
    assert_int_equal(comm_init(NULL, &c), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "rank 1 of 4"));
    assert_null(c);
#endif

    for (int v = 0; v < N_LAUNCH_VARS; v++) {
        if (saved[v])
            setenv(launch_vars[v], saved[v], 1);
        else
            unsetenv(launch_vars[v]);
        free(saved[v]);
    }
}

static void test_shard(void **state)
{
    (void)state;
    assert_int_equal(comm_padded_count(10, 4), 12);
    assert_int_equal(comm_padded_count(12, 4), 12);
    assert_int_equal(comm_padded_count(0, 4), 0);
    assert_int_equal(comm_padded_count(5, 1), 5);
    for (size_t n = 0; n < 40; n++)
        for (int size = 1; size <= 9; size++) {
            size_t next = 0, block = comm_padded_count(n, size) / (size_t)size;
            for (int r = 0; r < size; r++) {
                size_t off, cnt;
                comm_shard(n, size, r, &off, &cnt);
                assert_int_equal(off, (size_t)r * block);
                assert_true(cnt <= block);
                if (cnt) assert_int_equal(off, next); /* contiguous, in rank order */
                next += cnt;
            }
            assert_int_equal(next, n); /* every element exactly once */
        }
}

static void test_names(void **state)
{
    (void)state;
    comm_backend b;
    assert_int_equal(comm_backend_parse("MPI", &b), ZO_OK);
    assert_int_equal(b, COMM_BACKEND_MPI);
    assert_int_equal(comm_backend_parse("nccl", &b), ZO_OK);
    assert_int_equal(b, COMM_BACKEND_NCCL);
    assert_int_equal(comm_backend_parse("gloo", &b), ZO_ERR_INVALID);
    assert_string_equal(comm_backend_name(COMM_BACKEND_SELF), "self");
    assert_int_equal(comm_backend_built(COMM_BACKEND_SELF), 1);
    if (backend != COMM_BACKEND_AUTO) assert_int_equal(comm_get_backend(C), backend);
    assert_true(comm_rank(C) >= 0 && comm_rank(C) < comm_size(C));
}

/* Errors in arguments are returned by the call, before any communication. */
static void test_args(void **state)
{
    (void)state;
    float a[8] = {0}, b[8 * 4] = {0};
    comm_request_t req = (comm_request_t)a;
    assert_int_equal(comm_all_reduce(NULL, a, b, 1, ZO_DTYPE_F32, NULL, &req), ZO_ERR_INVALID);
    assert_null(req);
    assert_int_equal(comm_all_reduce(C, a, b, 1, (zo_dtype)7, NULL, NULL), ZO_ERR_INVALID);
    assert_int_equal(comm_all_reduce(C, NULL, b, 1, ZO_DTYPE_F32, NULL, NULL), ZO_ERR_INVALID);
    assert_int_equal(comm_all_reduce(C, a, b, (size_t)INT_MAX + 1, ZO_DTYPE_F32, NULL, NULL),
                     ZO_ERR_INVALID);
    /* overlapping but not the in-place pattern */
    assert_int_equal(comm_all_reduce(C, a, a + 1, 4, ZO_DTYPE_F32, NULL, NULL), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "overlap"));
    assert_int_equal(comm_reduce_scatter(C, b, b + (size_t)R * 2 + 1, 2, ZO_DTYPE_F32, NULL, NULL),
                     ZO_ERR_INVALID);
    assert_int_equal(comm_broadcast(C, a, b, 1, ZO_DTYPE_F32, N, NULL, NULL), ZO_ERR_INVALID);
    assert_int_equal(comm_broadcast(C, a, b, 1, ZO_DTYPE_F32, -1, NULL, NULL), ZO_ERR_INVALID);
    assert_int_equal(comm_wait(NULL), ZO_ERR_INVALID);
    /* all_to_all_v: count arrays present, sums within an int, buffers for them */
    size_t big[4] = {(size_t)INT_MAX / 2 + 1, (size_t)INT_MAX / 2 + 1, 1, 1}, one[4] = {1, 1, 1, 1};
    if (N == 1) big[0] = (size_t)INT_MAX + 1; /* one rank: one count over INT_MAX */
    assert_int_equal(comm_all_to_all_v(C, a, NULL, b, one, ZO_DTYPE_F32, NULL, NULL), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "count array"));
    if (N <= 4) { /* the arrays above hold 4 ranks' counts */
        assert_int_equal(comm_all_to_all_v(C, a, one, b, NULL, ZO_DTYPE_F32, NULL, NULL), ZO_ERR_INVALID);
        assert_int_equal(comm_all_to_all_v(C, a, big, b, one, ZO_DTYPE_F32, NULL, NULL), ZO_ERR_INVALID);
        assert_non_null(strstr(zo_last_error(), "one call"));
        assert_int_equal(comm_all_to_all_v(C, a, one, b, big, ZO_DTYPE_F32, NULL, NULL), ZO_ERR_INVALID);
        assert_non_null(strstr(zo_last_error(), "one call"));
        assert_int_equal(comm_all_to_all_v(C, NULL, one, b, one, ZO_DTYPE_F32, NULL, NULL),
                         ZO_ERR_INVALID);
        assert_non_null(strstr(zo_last_error(), "NULL buffer"));
    }
    /* events without a device to order them on */
    if (!comm_device_buffers(C)) {
        comm_order ord = {.after = (gpu_event_t)a};
        assert_int_equal(comm_all_reduce(C, a, b, 1, ZO_DTYPE_F32, &ord, NULL), ZO_ERR_INVALID);
        assert_non_null(strstr(zo_last_error(), "device"));
    }
    /* options */
    comm_t c = NULL;
    comm_options o = {.backend = COMM_BACKEND_SELF, .timeout_s = -1};
    assert_int_equal(comm_init(&o, &c), ZO_ERR_INVALID);
    o.timeout_s = 0;
    setenv("ZO_COMM_TIMEOUT", "soon", 1);
    assert_int_equal(comm_init(&o, &c), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "ZO_COMM_TIMEOUT"));
    setenv("ZO_COMM_TIMEOUT", "12.5", 1);
    assert_int_equal(comm_init(&o, &c), ZO_OK);
    assert_true(comm_timeout(c) == 12.5);
    assert_int_equal(comm_size(c), 1);
    comm_free(c);
    unsetenv("ZO_COMM_TIMEOUT");
    o.timeout_s = 0;
    assert_int_equal(comm_init(&o, &c), ZO_OK);
    assert_true(comm_timeout(c) == 300.0);
    comm_free(c);
    o.backend = COMM_BACKEND_NCCL;
    assert_int_equal(comm_init(&o, &c), comm_backend_built(COMM_BACKEND_NCCL) ? ZO_ERR_INVALID
                                                                               : ZO_ERR_UNSUPPORTED);
    assert_null(c);
}

/* ---- collectives ----------------------------------------------------------------------- */

static void test_all_reduce(void **state)
{
    (void)state;
    int wrong = 0;
    for (int ci = 0; ci < N_CASES; ci++)
        for (int k = INPUT_INTEGER; k <= INPUT_FRACTION; k++) {
            tcase q = case_at(ci);
            buf send = balloc(q.n * q.es), recv = q.in_place ? send : balloc(q.n * q.es);
            fill(send.h, q.t, q.n, R, (input_kind)k, 0);
            bpush(send);
            /* blocking for the integers, a request for the fractions */
            if (k == INPUT_INTEGER) {
                assert_int_equal(comm_all_reduce(C, send.d, recv.d, q.n, q.t, NULL, NULL), ZO_OK);
            } else {
                comm_request_t req;
                assert_int_equal(comm_all_reduce(C, send.d, recv.d, q.n, q.t, NULL, &req), ZO_OK);
                assert_int_equal(comm_wait(req), ZO_OK);
            }
            bpull(recv);
            wrong += check_sum(recv.h, q.t, q.n, (input_kind)k, 0,
                               q.in_place ? "all_reduce in place" : "all_reduce");
            if (!q.in_place) { /* the input is left alone */
                bpull(send);
                for (size_t i = 0; i < q.n; i++)
                    wrong += zo_load_f32(send.h, q.t, i) != input(R, i, (input_kind)k, q.t);
                bfree(recv);
            }
            bfree(send);
        }
    assert_int_equal(agree(wrong), 0);
}

/* Reduce-scatter of n elements padded to a multiple of the ranks: each rank
 * gets its shard's sums, the pad sums to zero. */
static void test_reduce_scatter(void **state)
{
    (void)state;
    int wrong = 0;
    for (int ci = 0; ci < N_CASES; ci++) {
        tcase q = case_at(ci);
        size_t padded = comm_padded_count(q.n, N), block = padded / (size_t)N, off, cnt;
        comm_shard(q.n, N, R, &off, &cnt);
        buf send = balloc(padded * q.es);
        memset(send.h, 0, padded * q.es);
        fill(send.h, q.t, q.n, R, INPUT_FRACTION, 0);
        bpush(send);
        buf recv = q.in_place ? bsub(send, (size_t)R * block * q.es, block * q.es)
                              : balloc(block * q.es);
        comm_request_t req;
        assert_int_equal(comm_reduce_scatter(C, send.d, recv.d, block, q.t, NULL, &req), ZO_OK);
        assert_int_equal(comm_wait(req), ZO_OK);
        bpull(recv);
        wrong += check_sum(recv.h, q.t, cnt, INPUT_FRACTION, off,
                           q.in_place ? "reduce_scatter in place" : "reduce_scatter");
        for (size_t i = cnt; i < block; i++) wrong += zo_load_f32(recv.h, q.t, i) != 0.0f;
        bfree(recv);
        bfree(send);
    }
    assert_int_equal(agree(wrong), 0);
}

/* All-gather: rank r sends its shard of a padded buffer; every rank ends
 * with every rank's block. */
static void test_all_gather(void **state)
{
    (void)state;
    int wrong = 0;
    for (int ci = 0; ci < N_CASES; ci++) {
        tcase q = case_at(ci);
        size_t block = comm_padded_count(q.n, N) / (size_t)N;
        buf recv = balloc((size_t)N * block * q.es);
        memset(recv.h, 0xff, recv.bytes); /* nan: stale data shows */
        buf send = q.in_place ? bsub(recv, (size_t)R * block * q.es, block * q.es)
                              : balloc(block * q.es);
        fill(send.h, q.t, block, R, INPUT_FRACTION, (size_t)R * block);
        bpush(recv);
        bpush(send);
        comm_request_t req;
        assert_int_equal(comm_all_gather(C, send.d, recv.d, block, q.t, NULL, &req), ZO_OK);
        assert_int_equal(comm_wait(req), ZO_OK);
        bpull(recv);
        for (int r = 0; r < N; r++)
            wrong += check_copy(recv.h + (size_t)r * block * q.es, q.t, block, r,
                                (size_t)r * block,
                                q.in_place ? "all_gather in place" : "all_gather");
        bfree(send);
        bfree(recv);
    }
    assert_int_equal(agree(wrong), 0);
}

/* All-to-all: block p of rank r's send arrives as block r of rank p's recv;
 * where the case asks for in place, the overlap is refused before any
 * communication (all-to-all has no in-place form). */
static void test_all_to_all(void **state)
{
    (void)state;
    int wrong = 0;
    for (int ci = 0; ci < N_CASES; ci++) {
        tcase q = case_at(ci);
        size_t block = q.n;
        buf send = balloc((size_t)N * block * q.es);
        if (q.in_place) {
            assert_int_equal(comm_all_to_all(C, send.d, send.d, block, q.t, NULL, NULL), ZO_ERR_INVALID);
            assert_non_null(strstr(zo_last_error(), "overlap"));
            bfree(send);
            continue;
        }
        buf recv = balloc((size_t)N * block * q.es);
        memset(recv.h, 0xff, recv.bytes); /* nan: stale data shows */
        fill(send.h, q.t, (size_t)N * block, R, INPUT_FRACTION, 0);
        bpush(recv);
        bpush(send);
        comm_request_t req;
        uint64_t before = comm_all_to_all_bytes(C);
        assert_int_equal(comm_all_to_all(C, send.d, recv.d, block, q.t, NULL, &req), ZO_OK);
        wrong += comm_all_to_all_bytes(C) - before != (size_t)(N - 1) * block * q.es;
        assert_int_equal(comm_wait(req), ZO_OK);
        bpull(recv);
        for (int r = 0; r < N; r++)
            wrong += check_copy(recv.h + (size_t)r * block * q.es, q.t, block, r, (size_t)R * block,
                                "all_to_all");
        bfree(send);
        bfree(recv);
    }
    assert_int_equal(agree(wrong), 0);
}

/* Elements rank p sends rank q in all_to_all_v case ci: up to n, zero for
 * some pairs (a rank that got no tokens for an expert still joins). */
static size_t v_count(int p, int q, size_t n, int ci)
{
    return n * (size_t)((p + 2 * q + ci) % 4) / 3;
}

/* All-to-all of variable sizes: rank p's block for q (its input from index
 * q * n on) arrives in q's recv at p's place in rank order; the bytes after
 * the last block stay untouched. In-place cases check that the overlap is
 * refused, and one rank's counts that disagree with themselves. */
static void test_all_to_all_v(void **state)
{
    (void)state;
    int wrong = 0;
    size_t *sc = xmalloc((size_t)N * sizeof *sc), *rc = xmalloc((size_t)N * sizeof *rc);
    for (int ci = 0; ci < N_CASES; ci++) {
        tcase q = case_at(ci);
        size_t sent = 0, received = 0;
        for (int r = 0; r < N; r++) {
            sent += sc[r] = v_count(R, r, q.n, ci);
            received += rc[r] = v_count(r, R, q.n, ci);
        }
        buf send = balloc(sent * q.es + q.es);
        if (q.in_place) {
            sc[R] = rc[R] = q.n; /* something to send, to oneself */
            assert_int_equal(comm_all_to_all_v(C, send.d, sc, send.d, rc, q.t, NULL, NULL), ZO_ERR_INVALID);
            if (N == 1) {
                rc[0] = q.n + 1;
                assert_int_equal(comm_all_to_all_v(C, send.d, sc, send.d, rc, q.t, NULL, NULL),
                                 ZO_ERR_INVALID);
                assert_non_null(strstr(zo_last_error(), "receives"));
            }
            bfree(send);
            continue;
        }
        buf recv = balloc(received * q.es + q.es);
        memset(recv.h, 0xff, recv.bytes); /* nan: stale data shows */
        for (int r = 0, at = 0; r < N; at += (int)sc[r], r++)
            fill(send.h + (size_t)at * q.es, q.t, sc[r], R, INPUT_FRACTION, (size_t)r * q.n);
        bpush(recv);
        bpush(send);
        comm_request_t req;
        uint64_t before = comm_all_to_all_bytes(C);
        assert_int_equal(comm_all_to_all_v(C, send.d, sc, recv.d, rc, q.t, NULL, &req), ZO_OK);
        wrong += comm_all_to_all_bytes(C) - before != (sent - sc[R]) * q.es;
        assert_int_equal(comm_wait(req), ZO_OK);
        bpull(recv);
        size_t at = 0;
        for (int r = 0; r < N; at += rc[r], r++)
            wrong += check_copy(recv.h + at * q.es, q.t, rc[r], r, (size_t)R * q.n, "all_to_all_v");
        uint16_t tail;
        memcpy(&tail, recv.h + at * q.es, sizeof tail);
        wrong += tail != 0xffff;
        bfree(send);
        bfree(recv);
    }
    /* nothing anywhere: every rank still joins, NULL buffers allowed */
    for (int r = 0; r < N; r++) sc[r] = rc[r] = 0;
    assert_int_equal(comm_all_to_all_v(C, NULL, sc, NULL, rc, ZO_DTYPE_F32, NULL, NULL), ZO_OK);
    free(sc);
    free(rc);
    assert_int_equal(agree(wrong), 0);
}

static void test_broadcast(void **state)
{
    (void)state;
    int wrong = 0;
    int roots[2] = {0, N - 1};
    for (int ci = 0; ci < N_CASES; ci++)
        for (int ri = 0; ri < 2; ri++) {
            tcase q = case_at(ci);
            int root = roots[ri];
            buf recv = balloc(q.n * q.es), send = q.in_place ? recv : balloc(q.n * q.es);
            memset(recv.h, 0xff, q.n * q.es);
            if (R == root)
                fill(send.h, q.t, q.n, root, INPUT_FRACTION, 0);
            else if (!q.in_place)
                memset(send.h, 0x7f, q.n * q.es); /* not the root's: must not be sent */
            bpush(recv);
            bpush(send);
            assert_int_equal(comm_broadcast(C, send.d, recv.d, q.n, q.t, root, NULL, NULL), ZO_OK);
            bpull(recv);
            wrong += check_copy(recv.h, q.t, q.n, root, 0,
                                q.in_place ? "broadcast in place" : "broadcast");
            if (!q.in_place) bfree(send);
            bfree(recv);
        }
    assert_int_equal(agree(wrong), 0);
}

static void test_barrier(void **state)
{
    (void)state;
    assert_int_equal(comm_barrier(C, NULL, NULL), ZO_OK);
    comm_request_t req;
    assert_int_equal(comm_barrier(C, NULL, &req), ZO_OK);
    assert_int_equal(comm_wait(req), ZO_OK);
    /* a count of 0 is a valid (empty) collective */
    assert_int_equal(comm_all_reduce(C, NULL, NULL, 0, ZO_DTYPE_F32, NULL, NULL), ZO_OK);
}

/* Several collectives in flight at once, completed in reverse order. */
static void test_async_many(void **state)
{
    (void)state;
    const size_t n = 3001;
    size_t padded = comm_padded_count(n, N), block = padded / (size_t)N, off, cnt;
    comm_shard(n, N, R, &off, &cnt);
    buf a = balloc(n * 4), ar = balloc(n * 4);
    buf s = balloc(padded * 2), sr = balloc(block * 2), g = balloc(padded * 2);
    buf mine = bsub(g, (size_t)R * block * 2, block * 2);
    memset(s.h, 0, padded * 2);
    fill(a.h, ZO_DTYPE_F32, n, R, INPUT_FRACTION, 0);
    fill(s.h, ZO_DTYPE_BF16, n, R, INPUT_FRACTION, 0);
    fill(mine.h, ZO_DTYPE_F16, block, R, INPUT_FRACTION, (size_t)R * block);
    bpush(a);
    bpush(s);
    bpush(g);
    comm_request_t q[4];
    assert_int_equal(comm_all_reduce(C, a.d, ar.d, n, ZO_DTYPE_F32, NULL, &q[0]), ZO_OK);
    assert_int_equal(comm_reduce_scatter(C, s.d, sr.d, block, ZO_DTYPE_BF16, NULL, &q[1]), ZO_OK);
    assert_int_equal(comm_all_gather(C, mine.d, g.d, block, ZO_DTYPE_F16, NULL, &q[2]), ZO_OK);
    assert_int_equal(comm_barrier(C, NULL, &q[3]), ZO_OK);
    for (int i = 3; i >= 0; i--) assert_int_equal(comm_wait(q[i]), ZO_OK);
    bpull(ar);
    bpull(sr);
    bpull(g);
    int wrong = check_sum(ar.h, ZO_DTYPE_F32, n, INPUT_FRACTION, 0, "async all_reduce");
    wrong += check_sum(sr.h, ZO_DTYPE_BF16, cnt, INPUT_FRACTION, off, "async reduce_scatter");
    for (int r = 0; r < N; r++)
        wrong += check_copy(g.h + (size_t)r * block * 2, ZO_DTYPE_F16, block, r,
                            (size_t)r * block, "async all_gather");
    /* comm_test turns 1 once done, and comm_wait then returns at once */
    comm_request_t t;
    assert_int_equal(comm_all_reduce(C, a.d, ar.d, n, ZO_DTYPE_F32, NULL, &t), ZO_OK);
    while (!comm_test(t)) {}
    assert_int_equal(comm_wait(t), ZO_OK);
    bfree(a);
    bfree(ar);
    bfree(s);
    bfree(sr);
    bfree(g);
    assert_int_equal(agree(wrong), 0);
}

/* Ordering by device events: the input is produced on a device stream
 * behind slow GEMMs, the collective starts after `after`, and a second
 * stream scales the result after `done`. Without the ordering the collective
 * would read the input unscaled, or the scale would run before the result
 * arrived. The CPU device for the host backends (its memory is host memory),
 * the CUDA device for NCCL. */
static void test_events(void **state)
{
    (void)state;
    gpu_cpu_options dopt = {0};
    gpu_device_t dev = Dev;
    if (!dev) assert_int_equal(gpu_device_init_cpu(&dopt, &dev), ZO_OK);
    comm_options o = {.backend = comm_get_backend(C), .device = dev, .timeout_s = 60};
    comm_t c;
    assert_int_equal(open_comm(&o, &c), ZO_OK);
    assert_int_equal(comm_size(c), N);
    assert_int_equal(comm_device_buffers(c), Dev != NULL);
    gpu_stream_t s1, s2;
    gpu_event_t after, done;
    assert_int_equal(gpu_stream_create(dev, &s1), ZO_OK);
    assert_int_equal(gpu_stream_create(dev, &s2), ZO_OK);
    assert_int_equal(gpu_event_create(dev, &after), ZO_OK);
    assert_int_equal(gpu_event_create(dev, &done), ZO_OK);
    const int m = Dev ? 4096 : 384; /* 4 GEMMs: tens of ms */
    const size_t n = 5003, mm = (size_t)m * m;
    float *x, *y, *ga, *gc;
    float *hx = xmalloc(n * 4), *hy = xmalloc(n * 4), *hg = xmalloc(mm * 4);
    assert_int_equal(gpu_mem_alloc(dev, n * 4, (void **)&x), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, n * 4, (void **)&y), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, mm * 4, (void **)&ga), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, mm * 4, (void **)&gc), ZO_OK);
    for (size_t i = 0; i < mm; i++) hg[i] = 1.0f / (float)m;
    assert_int_equal(gpu_memcpy_async(s1, ga, hg, mm * 4, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    fill(hx, ZO_DTYPE_F32, n, R, INPUT_INTEGER, 0);
    int wrong = 0;
    for (int round = 0; round < 3; round++) {
        assert_int_equal(gpu_memcpy_async(s1, x, hx, n * 4, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
        assert_int_equal(gpu_memset_async(s1, y, 0, n * 4), ZO_OK);
        gpu_gemm_desc g = {.m = m, .n = m, .k = m, .alpha = 1.0f, .a = gpu_t(ga, ZO_DTYPE_F32),
                           .b = gpu_t(ga, ZO_DTYPE_F32), .c = gpu_t(gc, ZO_DTYPE_F32),
                           .lda = m, .ldb = m, .ldc = m};
        for (int j = 0; j < 4; j++) assert_int_equal(gpu_gemm(s1, &g), ZO_OK);
        assert_int_equal(gpu_scale(s1, gpu_t(x, ZO_DTYPE_F32), 2.0f, n), ZO_OK);
        assert_int_equal(gpu_event_record(after, s1), ZO_OK);
        comm_order ord = {.after = after, .done = done};
        comm_request_t req;
        assert_int_equal(comm_all_reduce(c, x, y, n, ZO_DTYPE_F32, &ord, &req), ZO_OK);
        assert_int_equal(gpu_stream_wait_event(s2, done), ZO_OK);
        assert_int_equal(gpu_scale(s2, gpu_t(y, ZO_DTYPE_F32), 0.5f, n), ZO_OK);
        assert_int_equal(gpu_memcpy_async(s2, hy, y, n * 4, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
        assert_int_equal(gpu_stream_synchronize(s2), ZO_OK);
        /* y = (sum of 2 x) / 2: the integers' sum exactly */
        wrong += check_sum(hy, ZO_DTYPE_F32, n, INPUT_INTEGER, 0, "all_reduce ordered by events");
        assert_int_equal(comm_wait(req), ZO_OK);
        assert_int_equal(gpu_stream_synchronize(s1), ZO_OK);
    }
    /* blocking call with only `done`: the stream sees the result */
    assert_int_equal(gpu_memcpy_async(s1, x, hx, n * 4, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(s1), ZO_OK);
    comm_order ord = {.done = done};
    assert_int_equal(comm_all_reduce(c, x, x, n, ZO_DTYPE_F32, &ord, NULL), ZO_OK);
    assert_int_equal(gpu_stream_wait_event(s2, done), ZO_OK);
    assert_int_equal(gpu_memcpy_async(s2, hy, x, n * 4, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(s2), ZO_OK);
    wrong += check_sum(hy, ZO_DTYPE_F32, n, INPUT_INTEGER, 0, "all_reduce with done only");
    gpu_mem_free(dev, x);
    gpu_mem_free(dev, y);
    gpu_mem_free(dev, ga);
    gpu_mem_free(dev, gc);
    free(hx);
    free(hy);
    free(hg);
    gpu_event_destroy(after);
    gpu_event_destroy(done);
    gpu_stream_destroy(s1);
    gpu_stream_destroy(s2);
    comm_free(c);
    if (dev != Dev) gpu_device_free(dev);
    assert_int_equal(agree(wrong), 0);
}

/* ---- sub-communicators -------------------------------------------------------------------
 * On the world communicator whatever --split says: children by parity and
 * in reverse, ranks that join none, a child of a child, either freed first,
 * and two children used alternately, against values computed here. */

/* Mode --split: the color and key of world rank wr of wn, and the world
 * ranks of the child's ranks (the test's own account of MPI_Comm_split). */
static int split_color(int wr) { return Split == SPLIT_PARITY ? wr % 2 : 0; }
static int split_key(int wr, int wn) { return Split == SPLIT_PARITY ? 0 : wn - wr; }
static int split_members(int wr, int wn, int *who)
{
    int n = 0;
    if (Split == SPLIT_PARITY)
        for (int w = wr % 2; w < wn; w += 2) who[n++] = w;
    else
        for (int w = wn - 1; w >= 0; w--) who[n++] = w;
    return n;
}

/* comm_init, then in --split mode the child of the new world communicator
 * (the world freed before its child). */
static zo_status open_comm(const comm_options *o, comm_t *out)
{
    zo_status st = comm_init(o, out);
    if (st != ZO_OK || Split == SPLIT_NONE) return st;
    comm_t w = *out;
    st = comm_split(w, split_color(comm_rank(w)), split_key(comm_rank(w), comm_size(w)), out);
    comm_free(w);
    return st;
}

/* An fp32 integer: exact in every sum here. tag: the communicator and op. */
static float sval(int tag, int world_rank, size_t i)
{
    return (float)((int)((i * 7 + (size_t)world_rank * 13 + (size_t)tag * 29) % 41) - 20);
}

/* One all-reduce of world ranks on c: the sum of its members' world ranks. */
static int world_rank_sum(comm_t c) { return sum_over(c, comm_rank(World)); }

static void test_split(void **state)
{
    (void)state;
    int wr = comm_rank(World), wn = comm_size(World), wrong = 0;
    comm_t p, r, e, g;
    /* arguments */
    assert_int_equal(comm_split(NULL, 0, 0, &p), ZO_ERR_INVALID);
    assert_null(p);
    assert_int_equal(comm_split(World, 0, 0, NULL), ZO_ERR_INVALID);
    assert_int_equal(comm_split(World, -2, 0, &p), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "color -2"));
    /* by parity, one key: ranked by world rank */
    assert_int_equal(comm_split(World, wr % 2, 0, &p), ZO_OK);
    assert_int_equal(comm_rank(p), wr / 2);
    assert_int_equal(comm_size(p), (wn - wr % 2 + 1) / 2);
    assert_int_equal(comm_get_backend(p), comm_get_backend(World));
    assert_true(comm_timeout(p) == comm_timeout(World));
    assert_int_equal(comm_device_buffers(p), comm_device_buffers(World));
    int ps = 0;
    for (int w = wr % 2; w < wn; w += 2) ps += w;
    wrong += world_rank_sum(p) != ps;
    /* one color, keys reversing the world's order */
    assert_int_equal(comm_split(World, 7, wn - wr, &r), ZO_OK);
    assert_int_equal(comm_rank(r), wn - 1 - wr);
    assert_int_equal(comm_size(r), wn);
    /* odd ranks join none; the even ones by decreasing world rank */
    assert_int_equal(comm_split(World, wr % 2 ? COMM_SPLIT_NONE : 3, -wr, &e), ZO_OK);
    if (wr % 2) {
        assert_null(e);
    } else {
        assert_int_equal(comm_size(e), (wn + 1) / 2);
        assert_int_equal(comm_rank(e), (wn + 1) / 2 - 1 - wr / 2);
    }
    /* a child of the reversed child, by its rank's parity; the parent freed
     * first, the grandchild still works */
    int rr = wn - 1 - wr;
    assert_int_equal(comm_split(r, rr % 2, rr, &g), ZO_OK);
    comm_free(r);
    assert_int_equal(comm_rank(g), rr / 2);
    assert_int_equal(comm_size(g), (wn - rr % 2 + 1) / 2);
    int gs = 0;
    for (int q = rr % 2; q < wn; q += 2) gs += wn - 1 - q;
    wrong += world_rank_sum(g) != gs;
    comm_free(g);
    /* a child freed before its parent (the world, still in use below) */
    if (e) {
        int es = 0;
        for (int w = 0; w < wn; w += 2) es += w;
        wrong += world_rank_sum(e) != es;
        comm_free(e);
    }
    comm_free(p);
    /* the world's own sequence is unaffected: it still agrees */
    wrong += world_rank_sum(World) != wn * (wn - 1) / 2;
    assert_int_equal(sum_over(World, wrong), 0);
}

/* One communicator of the interleaved test: its members' world ranks. */
typedef struct side {
    comm_t c;
    int rank, size, who[64];
    int tag;
    buf send[6], recv[6];
    size_t sc[64], rc[64];
    comm_request_t req[7];
    uint64_t a2a_before;
} side;

#define SBLK 37 /* elements per block: odd */
static size_t v_elems(int p, int q) { return (size_t)((p * 3 + q) % 4) * 5; }

/* Fill c's inputs and start its op `k` (0 all_reduce, 1 reduce_scatter,
 * 2 all_gather, 3 all_to_all, 4 all_to_all_v, 5 broadcast, 6 barrier). */
static void side_start(side *s, int k)
{
    int n = s->size, me = s->who[s->rank], tag = s->tag + k;
    size_t in = 0, out = 0;
    switch (k) {
    case 0: in = out = SBLK; break;
    case 1: in = (size_t)n * SBLK, out = SBLK; break;
    case 2: in = SBLK, out = (size_t)n * SBLK; break;
    case 3: in = out = (size_t)n * SBLK; break;
    case 4:
        for (int q = 0; q < n; q++) {
            in += s->sc[q] = v_elems(s->rank, q);
            out += s->rc[q] = v_elems(q, s->rank);
        }
        break;
    case 5: in = out = SBLK; break;
    default: break;
    }
    if (k < 6) {
        s->send[k] = balloc(in * 4 + 4);
        s->recv[k] = balloc(out * 4 + 4);
        for (size_t i = 0; i < in; i++) ((float *)s->send[k].h)[i] = sval(tag, me, i);
        bpush(s->send[k]);
    }
    void *x = k < 6 ? s->send[k].d : NULL, *y = k < 6 ? s->recv[k].d : NULL;
    comm_request_t *rq = &s->req[k];
    zo_status st;
    switch (k) {
    case 0: st = comm_all_reduce(s->c, x, y, SBLK, ZO_DTYPE_F32, NULL, rq); break;
    case 1: st = comm_reduce_scatter(s->c, x, y, SBLK, ZO_DTYPE_F32, NULL, rq); break;
    case 2: st = comm_all_gather(s->c, x, y, SBLK, ZO_DTYPE_F32, NULL, rq); break;
    case 3: st = comm_all_to_all(s->c, x, y, SBLK, ZO_DTYPE_F32, NULL, rq); break;
    case 4: st = comm_all_to_all_v(s->c, x, s->sc, y, s->rc, ZO_DTYPE_F32, NULL, rq); break;
    case 5: st = comm_broadcast(s->c, x, y, SBLK, ZO_DTYPE_F32, n - 1, NULL, rq); break;
    default: st = comm_barrier(s->c, NULL, rq); break;
    }
    assert_int_equal(st, ZO_OK);
}

/* Check c's op k against sums and copies of its members' inputs. */
static int side_check(side *s, int k)
{
    if (k == 6) return 0;
    int n = s->size, me = s->rank, tag = s->tag + k, wrong = 0;
    bpull(s->recv[k]);
    const float *got = (const float *)s->recv[k].h;
    size_t at = 0;
    for (int r = 0; r < n; r++) {
        size_t m = k == 0 || k == 1 ? (r ? 0 : SBLK) : k == 4 ? s->rc[r] : k == 5 ? (r ? 0 : SBLK) : SBLK;
        for (size_t i = 0; i < m; i++, at++) {
            double ref = 0.0;
            if (k == 0 || k == 1)
                for (int q = 0; q < n; q++) ref += sval(tag, s->who[q], (k == 1 ? (size_t)me * SBLK : 0) + i);
            else if (k == 2)
                ref = sval(tag, s->who[r], i);
            else if (k == 3)
                ref = sval(tag, s->who[r], (size_t)me * SBLK + i);
            else if (k == 4) { /* rank r's block for me starts after its blocks for ranks < me */
                size_t off = 0;
                for (int q = 0; q < me; q++) off += v_elems(r, q);
                ref = sval(tag, s->who[r], off + i);
            } else
                ref = sval(tag, s->who[n - 1], i);
            if ((double)got[at] != ref) {
                if (!wrong)
                    fprintf(stderr, "world rank %d: interleaved %s op %d: element %zu = %g, expected %g\n",
                            comm_rank(World), s->tag == 100 ? "parity" : "reverse", k, at,
                            (double)got[at], ref);
                wrong++;
            }
        }
    }
    bfree(s->send[k]);
    bfree(s->recv[k]);
    return wrong;
}

/* Two children, every collective on each, issued alternately and all in
 * flight at once, completed in reverse order: each result is its own
 * members' (no cross-talk), and each counts its own all-to-all bytes. */
static void test_split_interleaved(void **state)
{
    (void)state;
    int wr = comm_rank(World), wn = comm_size(World), wrong = 0;
    if (wn > 64) skip();
    static side sd[2];
    memset(sd, 0, sizeof sd);
    assert_int_equal(comm_split(World, wr % 2, 0, &sd[0].c), ZO_OK);
    assert_int_equal(comm_split(World, 0, wn - wr, &sd[1].c), ZO_OK);
    sd[0].tag = 100;
    sd[1].tag = 200;
    for (int w = wr % 2; w < wn; w += 2) sd[0].who[sd[0].size++] = w;
    for (int w = wn - 1; w >= 0; w--) sd[1].who[sd[1].size++] = w;
    sd[0].rank = wr / 2;
    sd[1].rank = wn - 1 - wr;
    uint64_t world_before = comm_all_to_all_bytes(World);
    for (int j = 0; j < 2; j++) {
        wrong += comm_rank(sd[j].c) != sd[j].rank || comm_size(sd[j].c) != sd[j].size;
        sd[j].a2a_before = comm_all_to_all_bytes(sd[j].c);
    }
    for (int k = 0; k < 7; k++)
        for (int j = 0; j < 2; j++) side_start(&sd[j], k);
    for (int k = 6; k >= 0; k--)
        for (int j = 1; j >= 0; j--) {
            assert_int_equal(comm_wait(sd[j].req[k]), ZO_OK);
            wrong += side_check(&sd[j], k);
        }
    for (int j = 0; j < 2; j++) {
        /* all_to_all: a block to each other rank; all_to_all_v: its blocks for them */
        uint64_t expect = (uint64_t)(sd[j].size - 1) * SBLK * 4;
        for (int q = 0; q < sd[j].size; q++)
            if (q != sd[j].rank) expect += v_elems(sd[j].rank, q) * 4;
        uint64_t got = comm_all_to_all_bytes(sd[j].c) - sd[j].a2a_before;
        if (got != expect) {
            fprintf(stderr, "world rank %d: child %d counted %llu all-to-all bytes, expected %llu\n",
                    wr, j, (unsigned long long)got, (unsigned long long)expect);
            wrong++;
        }
        comm_free(sd[j].c);
    }
    wrong += comm_all_to_all_bytes(World) != world_before; /* the children's are not the world's */
    assert_int_equal(sum_over(World, wrong), 0);
}

/* The SELF backend: a one-rank parent's child is one rank. */
static void test_split_self(void **state)
{
    (void)state;
    comm_options o = {.backend = COMM_BACKEND_SELF, .timeout_s = 5};
    comm_t s, a, b, none;
    assert_int_equal(comm_init(&o, &s), ZO_OK);
    assert_int_equal(comm_split(s, COMM_SPLIT_NONE, 0, &none), ZO_OK);
    assert_null(none);
    assert_int_equal(comm_split(s, 5, 9, &a), ZO_OK);
    assert_int_equal(comm_get_backend(a), COMM_BACKEND_SELF);
    assert_int_equal(comm_rank(a), 0);
    assert_int_equal(comm_size(a), 1);
    assert_true(comm_timeout(a) == 5.0);
    comm_free(s); /* the parent first */
    assert_int_equal(comm_split(a, 0, 0, &b), ZO_OK);
    float x[3] = {1, 2, 3}, y[3] = {0}, z[3] = {0};
    assert_int_equal(comm_all_reduce(b, x, y, 3, ZO_DTYPE_F32, NULL, NULL), ZO_OK);
    assert_int_equal(comm_all_to_all(b, x, z, 3, ZO_DTYPE_F32, NULL, NULL), ZO_OK);
    for (int i = 0; i < 3; i++) {
        assert_true(y[i] == x[i]);
        assert_true(z[i] == x[i]);
    }
    assert_int_equal(comm_all_to_all_bytes(b), 0); /* nothing leaves one rank */
    comm_free(b); /* the child first */
    comm_free(a);
}

/* NCCL: one GPU per rank on a node (NCCL refuses two ranks on one GPU).
 * Every rank of a node decides alike, so they skip together. */
static int open_cuda_device(void)
{
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK"), *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!lr) lr = getenv("MPI_LOCALRANKID");
    if (!ls) ls = getenv("MPI_LOCALNRANKS");
    int local_rank = lr ? atoi(lr) : 0, local_size = ls ? atoi(ls) : 1;
    int count = gpu_cuda_device_count();
    if (count < local_size) {
        printf("skipped: %d ranks on this node, %d CUDA devices\n", local_size, count);
        return 1;
    }
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", local_rank);
    if (gpu_device_open(name, 0, &Dev) != ZO_OK || gpu_stream_create(Dev, &Copy) != ZO_OK) {
        printf("skipped: %s: %s\n", name, zo_last_error());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            if (comm_backend_parse(argv[++i], &backend) != ZO_OK) {
                fprintf(stderr, "test_comm: %s\n", zo_last_error());
                return 2;
            }
        } else if (!strcmp(argv[i], "--split") && i + 1 < argc) {
            i++;
            Split = !strcmp(argv[i], "parity") ? SPLIT_PARITY
                    : !strcmp(argv[i], "reverse") ? SPLIT_REVERSE : SPLIT_NONE;
            if (Split == SPLIT_NONE) {
                fprintf(stderr, "test_comm: --split: '%s' is not parity or reverse\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: test_comm [--backend auto|self|mpi|nccl] [--split parity|reverse]\n");
            return 2;
        }
    }
    if (!comm_backend_built(backend)) {
        printf("skipped: the %s backend is not in this build\n", comm_backend_name(backend));
        return 77;
    }
    if (backend == COMM_BACKEND_NCCL && open_cuda_device() != 0) return 77;
    comm_options o = {.backend = backend, .device = Dev, .timeout_s = 60};
    if (comm_init(&o, &World) != ZO_OK) {
        fprintf(stderr, "test_comm: %s\n", zo_last_error());
        return 1;
    }
    C = World;
    if (Split != SPLIT_NONE) {
        int wr = comm_rank(World), wn = comm_size(World);
        if (comm_split(World, split_color(wr), split_key(wr, wn), &C) != ZO_OK ||
            !(Who = malloc((size_t)wn * sizeof *Who))) {
            fprintf(stderr, "test_comm: --split: %s\n", zo_last_error());
            return 1;
        }
        int n = split_members(wr, wn, Who);
        if (comm_size(C) != n || Who[comm_rank(C)] != wr) {
            fprintf(stderr, "test_comm: world rank %d: split gave rank %d of %d, expected %d members "
                    "with this rank among them\n", wr, comm_rank(C), comm_size(C), n);
            return 1;
        }
    }
    R = comm_rank(C);
    N = comm_size(C);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launch_detect), cmocka_unit_test(test_shard),
        cmocka_unit_test(test_names),         cmocka_unit_test(test_args),
        cmocka_unit_test(test_all_reduce),    cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_all_gather),    cmocka_unit_test(test_all_to_all),
        cmocka_unit_test(test_all_to_all_v),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_barrier),       cmocka_unit_test(test_async_many),
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_split),         cmocka_unit_test(test_split_interleaved),
        cmocka_unit_test(test_split_self),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (C != World) comm_free(C);
    comm_free(World);
    free(Who);
    if (Dev) {
        gpu_stream_destroy(Copy);
        gpu_device_free(Dev);
    }
    return failed ? 1 : 0;
}
