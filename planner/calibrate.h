/* `memplan calibrate`: measure this machine and describe it as a hardware
 * profile (docs/plan-format.md, "Hardware profiles") that --hw FILE reads.
 *
 * Not part of the pure planner core (zo_planner): it allocates, times and
 * calls cpu_adam, so it is its own library linked into memplan only. */
#ifndef ZO_PLANNER_CALIBRATE_H
#define ZO_PLANNER_CALIBRATE_H

#include <stddef.h>
#include <stdint.h>

#include "planner/hardware.h"

typedef struct plan_calibrate_opts {
    const char *base;      /* preset giving what cannot be measured here (the GPU) */
    size_t adam_params;    /* elements per AdamW timing (0: sized past the last-level cache,
                              plan_calibrate_sizes) */
    size_t stream_bytes;   /* bytes per array of the memory-bandwidth triad (0: the same) */
    double seconds;        /* time spent per measurement (best of several) */
    int threads;           /* 0: OpenMP's default */
    const char *nvme_dir;  /* NVMe capacity (statvfs) and read/write rates measured here; NULL: none */
    size_t nvme_bytes;     /* bytes written and read back for the NVMe rates */
    size_t nvme_tensor_bytes; /* bytes per store read, as the runtime reads a block's
                                 weights (0: 64 MiB) */
    int nvme_reads;        /* passes over the file read back, the rate their total bytes over
                              their total time (0, 1: one); more for what reads the same data
                              again and again, as generation does each token */
} plan_calibrate_opts;

/* Defaults: base h100-80gb, the AdamW and triad sizes left to
 * plan_calibrate_sizes, 0.5 s, 512 MiB of NVMe traffic. */
void plan_calibrate_defaults(plan_calibrate_opts *o);

/* The working set of each timing that is not set (0), from the size of the
 * last-level cache `llc` (bytes; 0: unknown): every array of the triad and
 * the AdamW state (fp32 master, m, v and gradient, bf16 weights: 18 bytes
 * a parameter, sized at 16) PLAN_CALIBRATE_LLC_TIMES times the cache, and at least 64 MiB
 * a triad array and 16M parameters. A runtime's step moves gigabytes that
 * no cache holds: a timing whose arrays stay in a cache of hundreds of MiB
 * (a Xeon's L3) measures the cache, up to 5x the memory's rate. */
#define PLAN_CALIBRATE_LLC_TIMES 4
void plan_calibrate_sizes(plan_calibrate_opts *o, uint64_t llc);

/* The largest data or unified cache of CPU 0, the larger of sysfs's and
 * sysconf's L3 (or L2) figures, bytes;
 * 0 when neither says. */
uint64_t plan_calibrate_llc_bytes(void);

/* Fill *hw: the base preset, then the measured CPU memory size (sysinfo),
 * cores (sysconf), memory bandwidth (a triad over three arrays), CPU AdamW
 * parameters/s (cpu_adam's adam_update as the runtime calls it: fp32
 * master/m/v, the fp32 gradient sum, bf16 weights out: 30 bytes a
 * parameter, memplan's ADAM_BYTES) on `threads` threads, and on one (cpu_adam_thread_rate),
 * NVMe capacity of nvme_dir and its write and read rates
 * through the nvme module's io_uring engine (a file written, fdatasync'd
 * when buffered, read back, removed); gpus = gpus_per_node = 1.
 * hw->note says what was not measured. */
zo_status plan_calibrate_run(const plan_calibrate_opts *o, plan_hw *hw);

#endif
