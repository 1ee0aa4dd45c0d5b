/* bench_comm: the communicator's collectives (gpu/comm.h), nccl-tests style.
 *
 * For each backend (mpi; nccl where built and a GPU per rank is present),
 * each collective and each size (bytes of the whole buffer, as nccl-tests
 * counts them: the all-reduce's buffer, the reduce-scatter's input, the
 * all-gather's output), a row with the time of one call (the slowest rank,
 * best of the repetitions), the algorithm bandwidth (size / time), the bus
 * bandwidth (algbw times 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter,
 * all-gather and all-to-all, 1 for broadcast: comparable with the link's
 * peak whatever the collective), the count of wrong elements (the inputs
 * are small integers, so every sum is exact), and the in-run baseline: the
 * MPI library's own MPI_Allreduce of the same bytes on host buffers (for
 * all-to-all, whose bytes a reduction does not move alike, MPI_Alltoall of
 * the same bytes; for all_to_all_v, MPI_Alltoallv of the same blocks),
 * called from this thread, timed alternately with ours.
 *
 * all_to_all_v sends uneven blocks, as expert parallelism's token exchange
 * does: rank r sends rank q block c[(q - r) mod n] of a fixed pattern (half
 * a block, one and a half, ... the last taking the rest), so every rank
 * sends and receives the row's whole size; its bus bandwidth counts the
 * bytes that leave the rank (all but c[0]).
 * The ratio (last column) is our bus bandwidth over the baseline's.
 *
 * --split G runs every case on sub-communicators instead: the world split
 * (comm_split) into G groups of consecutive ranks, all groups at once, each
 * row the slowest rank of any group; the baseline is the MPI collective on
 * the same groups (MPI_Comm_split of MPI_COMM_WORLD), so the ratio compares
 * like with like, as expert parallelism's groups would use them.
 *
 * Run: mpirun -np N ./bench_comm [options]; without a launcher it runs as
 * one rank (bus bandwidth 0). */
#include <getopt.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"          /* defines: bench_header, bench_row, bench_result */
#include "common/units.h"         /* defines: zo_parse_size, zo_parse_int */
#include "gpu/comm.h"             /* defines: comm_init, comm_all_reduce, ... */
#include "gpu/device.h"           /* defines: gpu_device_open, gpu_cuda_device_count */

typedef struct opts {
    uint64_t min_bytes, max_bytes;
    long factor;
    zo_dtype dtype;
    double seconds; /* per contender and size */
    int ops_mask;
    const char *backends; /* "mpi", "nccl" or "all" */
    long split;           /* groups of ranks (--split); 1: the world */
} opts;

enum {
    OP_ALL_REDUCE,
    OP_REDUCE_SCATTER,
    OP_ALL_GATHER,
    OP_BROADCAST,
    OP_ALL_TO_ALL,
    OP_ALL_TO_ALL_V,
    OP_COUNT
};
static const char *const op_names[OP_COUNT] = {"all_reduce", "reduce_scatter", "all_gather",
                                               "broadcast",  "all_to_all",     "all_to_all_v"};

static int R, N;   /* the rank and size of the communicator benchmarked */
static int Wr, Wn; /* in the world */
static MPI_Comm Base; /* the baseline's communicator: the world or this rank's group */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: mpirun -np N bench_comm [--min 1KiB] [--max 256MiB] [--factor 4]\n"
            "                  [--dtype fp32|fp16|bf16] [--seconds 0.2] [--backend mpi|nccl|all]\n"
            "                  [--split G]\n"
            "                  [--op all_reduce|reduce_scatter|all_gather|broadcast|all_to_all|\n"
            "                        all_to_all_v]...\n");
}

static int parse_opts(int argc, char **argv, opts *o)
{
    *o = (opts){.min_bytes = ZO_KIB, .max_bytes = 256 * ZO_MIB, .factor = 4,
                .dtype = ZO_DTYPE_F32, .seconds = 0.2, .backends = "all", .split = 1};
    static const struct option lo[] = {
        {"min", required_argument, 0, 'm'},     {"max", required_argument, 0, 'M'},
        {"factor", required_argument, 0, 'f'},  {"dtype", required_argument, 0, 'd'},
        {"seconds", required_argument, 0, 's'}, {"backend", required_argument, 0, 'b'},
        {"op", required_argument, 0, 'o'},      {"help", no_argument, 0, 'h'},
        {"split", required_argument, 0, 'g'},
        {0, 0, 0, 0},
    };
    int c;
    zo_status st = ZO_OK;
    while (st == ZO_OK && (c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'm': st = zo_parse_size(optarg, "--min", 0, &o->min_bytes); break;
        case 'M': st = zo_parse_size(optarg, "--max", 0, &o->max_bytes); break;
        case 'f': st = zo_parse_int(optarg, "--factor", 2, 1024, &o->factor); break;
        case 'd': st = zo_dtype_parse(optarg, &o->dtype); break;
        case 's': st = zo_parse_double(optarg, "--seconds", 0.0, 3600.0, &o->seconds); break;
        case 'b':
            if (strcmp(optarg, "mpi") && strcmp(optarg, "nccl") && strcmp(optarg, "all"))
                st = zo_error(ZO_ERR_INVALID, "--backend: '%s' is not mpi, nccl or all", optarg);
            o->backends = optarg;
            break;
        case 'o': {
            int k = 0;
            while (k < OP_COUNT && strcmp(optarg, op_names[k])) k++;
            if (k == OP_COUNT)
                st = zo_error(ZO_ERR_INVALID, "--op: unknown collective '%s'", optarg);
            else
                o->ops_mask |= 1 << k;
            break;
        }
        case 'g': st = zo_parse_int(optarg, "--split", 1, 1 << 20, &o->split); break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
    }
    if (st == ZO_OK && (optind < argc || o->min_bytes == 0 || o->min_bytes > o->max_bytes))
        st = zo_error(ZO_ERR_INVALID, "need 0 < --min <= --max and no other arguments");
    if (st != ZO_OK) {
        fprintf(stderr, "bench_comm: %s\n", zo_last_error());
        usage(stderr);
        return 2;
    }
    if (!o->ops_mask) o->ops_mask = (1 << OP_COUNT) - 1;
    return 0;
}

/* ---- buffers: host, or device with a host mirror for NCCL --------------------------------- */

typedef struct bufs {
    gpu_device_t dev; /* NULL: host buffers */
    gpu_stream_t copy;
    char *send, *recv;     /* what the collectives use */
    char *hsend, *hrecv;   /* host: inputs and results, and the baseline's buffers */
    size_t bytes;
} bufs;

static int bufs_alloc(bufs *b, gpu_device_t dev, size_t bytes)
{
    memset(b, 0, sizeof *b);
    b->dev = dev;
    b->bytes = bytes;
    b->hsend = malloc(bytes);
    b->hrecv = malloc(bytes);
    if (!b->hsend || !b->hrecv) return -1;
    memset(b->hrecv, 0, bytes);
    b->send = b->hsend;
    b->recv = b->hrecv;
    if (!dev) return 0;
    if (gpu_stream_create(dev, &b->copy) != ZO_OK ||
        gpu_mem_alloc(dev, bytes, (void **)&b->send) != ZO_OK ||
        gpu_mem_alloc(dev, bytes, (void **)&b->recv) != ZO_OK)
        return -1;
    return 0;
}

static void bufs_free(bufs *b)
{
    if (b->dev) {
        gpu_mem_free(b->dev, b->send);
        gpu_mem_free(b->dev, b->recv);
        gpu_stream_destroy(b->copy);
    }
    free(b->hsend);
    free(b->hrecv);
}

static void bufs_move(bufs *b, int to_device)
{
    if (!b->dev) return;
    if (to_device)
        gpu_memcpy_async(b->copy, b->send, b->hsend, b->bytes, GPU_COPY_HOST_TO_DEVICE);
    else
        gpu_memcpy_async(b->copy, b->hrecv, b->recv, b->bytes, GPU_COPY_DEVICE_TO_HOST);
    gpu_stream_synchronize(b->copy);
}

/* Small integers: every sum of up to a few thousand ranks is exact, in bf16 too. */
static float input(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 3) % 5) - 2); }

/* ---- one row ---------------------------------------------------------------------------------- */

/* all_to_all_v's pattern for a row of `elems` elements per rank: vc[k]
 * elements from rank r to rank (r + k) mod N; the send and receive counts
 * of this rank (elements and, for MPI_Alltoallv, bytes) and its offsets. */
static size_t *vc, *v_send, *v_recv;
static int *v_mpi; /* send counts, displacements, receive counts, displacements (bytes) */

static int v_alloc(void)
{
    vc = calloc((size_t)N, sizeof *vc);
    v_send = calloc((size_t)N, sizeof *v_send);
    v_recv = calloc((size_t)N, sizeof *v_recv);
    v_mpi = calloc((size_t)N * 4, sizeof *v_mpi);
    return vc && v_send && v_recv && v_mpi ? 0 : -1;
}

static void v_free(void)
{
    free(vc);
    free(v_send);
    free(v_recv);
    free(v_mpi);
}

static void v_pattern(size_t elems, size_t es)
{
    size_t block = elems / (size_t)N, used = 0;
    for (int k = 0; k < N - 1; k++) used += vc[k] = k % 2 ? block + block / 2 : block / 2;
    vc[N - 1] = elems - used;
    for (int q = 0, s = 0, r = 0; q < N; q++) {
        v_send[q] = vc[(q - R + N) % N];
        v_recv[q] = vc[(R - q + N) % N];
        v_mpi[q] = (int)(v_send[q] * es);
        v_mpi[N + q] = s;
        v_mpi[2 * N + q] = (int)(v_recv[q] * es);
        v_mpi[3 * N + q] = r;
        s += v_mpi[q];
        r += v_mpi[2 * N + q];
    }
}

/* Where rank p's block for rank q starts in p's send, in elements. */
static size_t v_send_offset(int p, int q)
{
    size_t at = 0;
    for (int k = 0; k < q; k++) at += vc[(k - p + N) % N];
    return at;
}

typedef struct shape {
    size_t count;        /* elements passed to the call */
    size_t in_elems;     /* elements of send read */
    double bus_factor;
} shape;

static shape shape_of(int op, size_t elems)
{
    double n = N;
    switch (op) {
    case OP_ALL_REDUCE: return (shape){elems, elems, 2.0 * (n - 1) / n};
    case OP_REDUCE_SCATTER: return (shape){elems / (size_t)N, elems, (n - 1) / n};
    case OP_ALL_GATHER: return (shape){elems / (size_t)N, elems / (size_t)N, (n - 1) / n};
    case OP_ALL_TO_ALL: return (shape){elems / (size_t)N, elems, (n - 1) / n};
    case OP_ALL_TO_ALL_V: return (shape){elems, elems, N > 1 ? 1.0 - (double)vc[0] / (double)elems : 0.0};
    default: return (shape){elems, elems, 1.0};
    }
}

static zo_status run_op(comm_t c, int op, bufs *b, size_t count, zo_dtype t)
{
    switch (op) {
    case OP_ALL_REDUCE: return comm_all_reduce(c, b->send, b->recv, count, t, NULL, NULL);
    case OP_REDUCE_SCATTER: return comm_reduce_scatter(c, b->send, b->recv, count, t, NULL, NULL);
    case OP_ALL_GATHER: return comm_all_gather(c, b->send, b->recv, count, t, NULL, NULL);
    case OP_ALL_TO_ALL: return comm_all_to_all(c, b->send, b->recv, count, t, NULL, NULL);
    case OP_ALL_TO_ALL_V: return comm_all_to_all_v(c, b->send, v_send, b->recv, v_recv, t, NULL, NULL);
    default: return comm_broadcast(c, b->send, b->recv, count, t, 0, NULL, NULL);
    }
}

/* Elements of the result that differ from the exact reference. */
static long count_wrong(int op, const bufs *b, size_t count, zo_dtype t)
{
    long wrong = 0;
    size_t n = op == OP_ALL_GATHER || op == OP_ALL_TO_ALL ? count * (size_t)N : count;
    if (op == OP_ALL_TO_ALL_V) { /* from rank p, packed in rank order: its block for R */
        for (int p = 0, i = 0; p < N; p++)
            for (size_t j = 0, from = v_send_offset(p, R); j < v_recv[p]; j++, i++)
                wrong += zo_load_f32(b->hrecv, t, (size_t)i) != input(p, from + j);
        return wrong;
    }
    for (size_t i = 0; i < n; i++) {
        double ref = 0.0;
        if (op == OP_ALL_REDUCE || op == OP_REDUCE_SCATTER) {
            size_t g = op == OP_REDUCE_SCATTER ? (size_t)R * count + i : i;
            for (int r = 0; r < N; r++) ref += input(r, g);
        } else if (op == OP_ALL_GATHER) {
            ref = input((int)(i / count), i % count);
        } else if (op == OP_ALL_TO_ALL) { /* block r: rank r's block R */
            ref = input((int)(i / count), (size_t)R * count + i % count);
        } else {
            ref = input(0, i);
        }
        wrong += zo_load_f32(b->hrecv, t, i) != (float)ref;
    }
    return wrong;
}

/* The slowest rank's time of each repetition; the best repetition. */
static double slowest_best(double *t, int reps)
{
    MPI_Allreduce(MPI_IN_PLACE, t, reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double best = t[0];
    for (int i = 1; i < reps; i++) best = t[i] < best ? t[i] : best;
    return best;
}

typedef struct row_result {
    double ours, mpi; /* seconds per call */
    double busbw, mpi_busbw;
    long wrong;
} row_result;

/* The baseline of a row: MPI_Alltoall for all-to-all, MPI_Alltoallv of
 * the same bytes for all_to_all_v, MPI_Allreduce for the rest, on the host
 * buffers, fp32, `count` floats in all. */
static void baseline(int op, bufs *b, size_t count)
{
    if (op == OP_ALL_TO_ALL_V)
        MPI_Alltoallv(b->hsend, v_mpi, v_mpi + N, MPI_BYTE, b->hrecv, v_mpi + 2 * N, v_mpi + 3 * N,
                      MPI_BYTE, Base);
    else if (op == OP_ALL_TO_ALL)
        MPI_Alltoall(b->hsend, (int)(count / (size_t)N), MPI_FLOAT, b->hrecv, (int)(count / (size_t)N),
                     MPI_FLOAT, Base);
    else
        MPI_Allreduce(b->hsend, b->hrecv, (int)count, MPI_FLOAT, MPI_SUM, Base);
}

static int bench_row_op(comm_t c, int op, bufs *b, size_t bytes, const opts *o, row_result *out)
{
    zo_dtype t = o->dtype;
    size_t es = zo_dtype_size(t), elems = bytes / es;
    v_pattern(elems, es);
    shape s = shape_of(op, elems);
    for (size_t i = 0; i < s.in_elems; i++) zo_store_f32(b->hsend, t, i, input(R, i));
    bufs_move(b, 1);
    size_t mpi_count = bytes / sizeof(float);
    /* one untimed call of each, then as many repetitions as fit the time */
    double t0 = zo_now();
    if (run_op(c, op, b, s.count, t) != ZO_OK) return -1;
    double first = zo_now() - t0;
    baseline(op, b, mpi_count);
    MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int reps = (int)(o->seconds / (first > 1e-9 ? first : 1e-9));
    reps = reps < 3 ? 3 : reps > 200 ? 200 : reps;
    double *tours = calloc((size_t)reps, sizeof *tours), *tmpi = calloc((size_t)reps, sizeof *tmpi);
    if (!tours || !tmpi) return -1;
    for (int i = 0; i < reps; i++) {
        if (comm_barrier(c, NULL, NULL) != ZO_OK) return -1;
        t0 = zo_now();
        if (run_op(c, op, b, s.count, t) != ZO_OK) return -1;
        tours[i] = zo_now() - t0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = zo_now();
        baseline(op, b, mpi_count);
        tmpi[i] = zo_now() - t0;
    }
    out->ours = slowest_best(tours, reps);
    out->mpi = slowest_best(tmpi, reps);
    free(tours);
    free(tmpi);
    /* the check: one more call, its result read back */
    if (run_op(c, op, b, s.count, t) != ZO_OK) return -1;
    bufs_move(b, 0);
    long wrong = count_wrong(op, b, s.count, t);
    MPI_Allreduce(&wrong, &out->wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    double algbw = (double)bytes / out->ours / 1e9;
    out->busbw = algbw * s.bus_factor;
    /* the same bus factor as ours: all-to-all's bytes that leave the rank,
     * else MPI_Allreduce's 2(n-1)/n */
    out->mpi_busbw = (double)bytes / out->mpi / 1e9 *
                     (op == OP_ALL_TO_ALL || op == OP_ALL_TO_ALL_V ? s.bus_factor : 2.0 * (N - 1) / N);
    if (Wr == 0)
        bench_row("%12zu %11zu %6s %15s %11.1f %8.3f %8.3f %7ld %11.1f %8.3f %7.3f", bytes, s.count,
                  zo_dtype_name(t), op_names[op], out->ours * 1e6, algbw, out->busbw, out->wrong,
                  out->mpi * 1e6, out->mpi_busbw,
                  out->mpi_busbw > 0 ? out->busbw / out->mpi_busbw : 0.0);
    return 0;
}

/* All rows of one backend; geo_ratio[0] the all-reduce ratio, [1] the
 * all-to-all's, [2] the all_to_all_v's, geometric means over the sizes
 * >= 1 MiB (0 when none). */
static int bench_backend(comm_backend be, gpu_device_t dev, const opts *o, double geo_ratio[3])
{
    comm_options co = {.backend = be, .device = dev};
    comm_t c;
    if (comm_init(&co, &c) != ZO_OK) {
        fprintf(stderr, "bench_comm: %s\n", zo_last_error());
        return 1;
    }
    if (o->split > 1) { /* this rank's group; the world communicator is not needed */
        comm_t world = c;
        zo_status st = comm_split(world, Wr / (Wn / (int)o->split), Wr, &c);
        comm_free(world);
        if (st != ZO_OK) {
            fprintf(stderr, "bench_comm: --split: %s\n", zo_last_error());
            return 1;
        }
    }
    R = comm_rank(c);
    N = comm_size(c);
    size_t unit = (size_t)N * zo_dtype_size(o->dtype) * sizeof(float); /* every shape divides */
    size_t max = (size_t)o->max_bytes / unit * unit;
    bufs b;
    if (bufs_alloc(&b, dev, max ? max : unit) != 0) {
        fprintf(stderr, "bench_comm: cannot allocate 2 x %zu bytes\n", max);
        return 1;
    }
    if (Wr == 0) {
        if (o->split > 1)
            printf("# backend %s, %d ranks split into %ld groups of %d\n", comm_backend_name(be), Wn,
                   o->split, N);
        else
            printf("# backend %s, %d ranks\n", comm_backend_name(be), N);
        bench_row("# %10s %11s %6s %15s %11s %8s %8s %7s %11s %8s %7s", "size(B)", "count", "type",
                  "collective", "time(us)", "algbw", "busbw", "#wrong", "mpi(us)", "mpi_bus",
                  "ratio");
    }
    double log_sum[3] = {0.0, 0.0, 0.0};
    int n_log[3] = {0, 0, 0};
    for (int op = 0; op < OP_COUNT; op++) {
        if (!(o->ops_mask & (1 << op))) continue;
        for (uint64_t sz = o->min_bytes; sz <= o->max_bytes; sz *= (uint64_t)o->factor) {
            size_t bytes = (size_t)sz / unit * unit;
            if (!bytes) continue;
            row_result rr;
            if (bench_row_op(c, op, &b, bytes, o, &rr) != 0) {
                fprintf(stderr, "bench_comm: %s\n", zo_last_error());
                return 1;
            }
            int k = op == OP_ALL_REDUCE ? 0 : op == OP_ALL_TO_ALL ? 1 : op == OP_ALL_TO_ALL_V ? 2 : -1;
            if (k >= 0 && bytes >= ZO_MIB && rr.mpi_busbw > 0) {
                log_sum[k] += log(rr.busbw / rr.mpi_busbw);
                n_log[k]++;
            }
        }
    }
    for (int k = 0; k < 3; k++) geo_ratio[k] = n_log[k] ? exp(log_sum[k] / n_log[k]) : 0.0;
    bufs_free(&b);
    comm_free(c);
    return 0;
}

/* NCCL needs one GPU per rank of the node; every rank of a node decides alike. */
static gpu_device_t open_gpu(void)
{
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK"), *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int local_rank = lr ? atoi(lr) : 0, local_size = ls ? atoi(ls) : 1;
    if (!comm_backend_built(COMM_BACKEND_NCCL) || gpu_cuda_device_count() < local_size) return NULL;
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", local_rank);
    gpu_device_t dev = NULL;
    if (gpu_device_open(name, 0, &dev) != ZO_OK) return NULL;
    return dev;
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    /* the MPI backend first: it initializes MPI (MPI_THREAD_MULTIPLE, so
     * this thread may call MPI_Allreduce beside the communicator's thread) */
    comm_options co = {.backend = COMM_BACKEND_MPI};
    comm_t world;
    if (comm_init(&co, &world) != ZO_OK) {
        fprintf(stderr, "bench_comm: %s\n", zo_last_error());
        return 1;
    }
    R = Wr = comm_rank(world);
    N = Wn = comm_size(world);
    Base = MPI_COMM_WORLD;
    if (Wn % o.split) {
        if (Wr == 0)
            fprintf(stderr, "bench_comm: --split %ld does not divide the %d ranks into equal groups\n",
                    o.split, Wn);
        comm_free(world);
        return 2;
    }
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "bench_comm: this MPI gives no MPI_THREAD_MULTIPLE: no baseline\n");
        return 1;
    }
    /* the baseline's groups: the same as comm_split makes below */
    if (o.split > 1 && MPI_Comm_split(MPI_COMM_WORLD, Wr / (Wn / (int)o.split), Wr, &Base) != MPI_SUCCESS) {
        fprintf(stderr, "bench_comm: --split: MPI_Comm_split failed\n");
        return 1;
    }
    char lo[32], hi[32];
    if (Wr == 0)
        bench_header("bench_comm", "%d ranks%s, %s, %s..%s x%ld, >= %.2f s per case; "
                     "baseline MPI_Allreduce, all_to_all's MPI_Alltoall, all_to_all_v's "
                     "MPI_Alltoallv (fp32, host buffers%s)", Wn,
                     o.split > 1 ? " split into groups (--split)" : "",
                     zo_dtype_name(o.dtype),
                     zo_format_bytes(o.min_bytes, lo, sizeof lo),
                     zo_format_bytes(o.max_bytes, hi, sizeof hi), o.factor, o.seconds,
                     o.split > 1 ? ", on the same groups" : "");
    if (v_alloc() != 0) {
        fprintf(stderr, "bench_comm: out of host memory\n");
        return 1;
    }
    double ratio_mpi[3] = {0.0, 0.0, 0.0}, ratio_nccl[3] = {0.0, 0.0, 0.0};
    if (strcmp(o.backends, "nccl") && (rc = bench_backend(COMM_BACKEND_MPI, NULL, &o, ratio_mpi)))
        return rc;
    if (strcmp(o.backends, "mpi")) {
        gpu_device_t dev = open_gpu();
        int have = dev != NULL, all = 0;
        MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
        if (all) {
            if ((rc = bench_backend(COMM_BACKEND_NCCL, dev, &o, ratio_nccl))) return rc;
        } else if (Wr == 0) {
            printf("# backend nccl: skipped (%s)\n", comm_backend_built(COMM_BACKEND_NCCL)
                                                          ? "no GPU for every rank"
                                                          : "not in this build");
        }
        if (dev) gpu_device_free(dev);
    }
    if (Wr == 0) {
        /* NCCL's ratios (all-reduce, all-to-all, all-to-all-v), then MPI's in
         * the reverse order: its all-reduce's last, printed even when 0 */
        static const char *const what[3] = {"all_reduce busbw / MPI_Allreduce busbw",
                                            "all_to_all busbw / MPI_Alltoall busbw",
                                            "all_to_all_v busbw / MPI_Alltoallv busbw"};
        char line[160];
        for (int i = 0; i < 6; i++) {
            int nccl = i < 3, k = nccl ? i : 5 - i;
            double v = nccl ? ratio_nccl[k] : ratio_mpi[k];
            if (v <= 0 && i < 5) continue;
            snprintf(line, sizeof line, "%s %s (geometric mean, >= 1 MiB)", nccl ? "nccl" : "mpi",
                     what[k]);
            bench_result(line, v);
        }
    }
    v_free();
    if (Base != MPI_COMM_WORLD) MPI_Comm_free(&Base);
    comm_free(world);
    return 0;
}
