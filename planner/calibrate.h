/* `memplan calibrate`: measure this machine and describe it as a hardware
 * profile (docs/plan-format.md, "Hardware profiles") that --hw FILE reads.
 *
 * Not part of the pure planner core (zo_planner): it allocates, times and
 * calls cpu_adam, so it is its own library linked into memplan only. */
#ifndef ZO_PLANNER_CALIBRATE_H
#define ZO_PLANNER_CALIBRATE_H

#include <stddef.h>

#include "planner/hardware.h"

typedef struct plan_calibrate_opts {
    const char *base;      /* preset giving what cannot be measured here (the GPU) */
    size_t adam_params;    /* elements per AdamW timing */
    size_t stream_bytes;   /* bytes per array of the memory-bandwidth triad */
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

/* Defaults: base h100-80gb, 16M parameters, 64 MiB arrays, 0.5 s, 512 MiB
 * of NVMe traffic. */
void plan_calibrate_defaults(plan_calibrate_opts *o);

/* Fill *hw: the base preset, then the measured CPU memory size (sysinfo),
 * cores (sysconf), memory bandwidth (a triad over three arrays), CPU AdamW
 * parameters/s (cpu_adam's adam_update: fp32 master/m/v, bf16 gradient and
 * bf16 weights out) on `threads` threads, and on one (cpu_adam_thread_rate),
 * NVMe capacity of nvme_dir and its write and read rates
 * through the nvme module's io_uring engine (a file written, fdatasync'd
 * when buffered, read back, removed); gpus = gpus_per_node = 1.
 * hw->note says what was not measured. */
zo_status plan_calibrate_run(const plan_calibrate_opts *o, plan_hw *hw);

#endif
