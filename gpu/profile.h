/* Where a step's device time goes, op by op: a profile attached to a device
 * times every op (gpu_op_run: the one place every op of gpu/ops.h passes),
 * every copy and every memset enqueued on its streams, each between two
 * timed events on the stream it runs on (gpu_event_create_timed), and sums
 * the times per row: the op, its shape class (a GEMM's m x n x k and
 * layout, an attention's b, t, heads and head size; other ops one row
 * each) and its stream. GEMM and attention rows count their FLOPs from the
 * shapes, copies their bytes.
 *
 * Cost: nothing when no profile is attached (one load and a branch per op,
 * no event created). Attached, it records two events per op, taken from a
 * pool it reuses, and never waits inside a step: gpu_profile_step_end
 * resolves the records whose events have completed and keeps the rest for a
 * later call, so the profile adds no host synchronization to what it
 * measures. Only ops enqueued between gpu_profile_step_begin and
 * gpu_profile_step_end are timed (train times the steps after the first).
 *
 * Thread-safe: ops may be enqueued from any thread (the optimizer's); the
 * step calls and the results are the caller's thread's. */
#ifndef ZO_GPU_PROFILE_H
#define ZO_GPU_PROFILE_H

#include <stdio.h>

#include "common/status.h" /* zo_status */
#include "gpu/device.h"    /* defines: gpu_device_t, gpu_stream_t, gpu_gemm_desc, gpu_attn_desc */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpu_profile gpu_profile;

/* Attach a profile to `dev` (ZO_ERR_BUSY when one is attached already). */
zo_status gpu_profile_start(gpu_device_t dev, gpu_profile **out);
/* Detach it: ops enqueued from now on run untimed; the records still in
 * flight are waited for and summed. The results stay readable. Call it
 * when the work to profile is done; it may be called again (a no-op). */
zo_status gpu_profile_stop(gpu_profile *p);
/* Stop, then free the profile and its events; call it before the device
 * is freed, once no other thread can enqueue work on the device. */
void gpu_profile_free(gpu_profile *p);

/* The name a stream's rows carry ("compute", "h2d"; at most 23 bytes);
 * a stream not named is "stream N", N counted from 1 in order of first use. */
void gpu_profile_name_stream(gpu_profile *p, gpu_stream_t s, const char *name);

/* A step to profile begins: ops enqueued from now to gpu_profile_step_end
 * are timed, and the step's wall time (the host's clock) is counted. */
void gpu_profile_step_begin(gpu_profile *p);
/* It ended: the ops whose events have completed are summed; the others are
 * kept for a later call (no wait). */
zo_status gpu_profile_step_end(gpu_profile *p);

/* Host work of the profiled steps that the caller timed (the CPU AdamW):
 * a row whose stream is "host". */
void gpu_profile_add_host(gpu_profile *p, const char *name, double seconds, double calls);
/* The host thread's time split over the profiled steps (what it waited
 * for: "compute", "weights", ...): printed after the table. */
void gpu_profile_add_wait(gpu_profile *p, const char *name, double seconds);

/* FLOPs counted: a GEMM 2 m n k per product (times batch); attention, for
 * causal masking, the dense count halved: forward 4 b hq t^2 d / 2 (the
 * score and value products), backward 2.5 times the forward (five
 * products: the scores recomputed, dV, dP, dQ, dK); with a window w < t
 * the band's area t w - w^2 / 2 in place of t^2 / 2. */
double gpu_gemm_flops(const gpu_gemm_desc *d);
double gpu_attention_flops(const gpu_attn_desc *a, int backward);

/* One row: the sums over the profiled steps. */
typedef struct gpu_profile_row {
    char op[40];     /* "gemm", "attention_backward", "copy h2d", "memset", or a host row's name */
    char shape[64];  /* gemm "8192x5120x5120 NT bf16" (m x n x k, op(A) op(B), storage), batched
                      * "32 x 128x128x64 NN f32"; attention "b4 t2048 hq40 hkv40 d128"
                      * (" w4096": a window); else "" */
    char stream[24];
    double calls;
    double seconds;
    double flops;    /* 0: not counted (ops other than GEMM and attention) */
    double bytes;    /* copies and memsets */
    int host;        /* a host row (gpu_profile_add_host) */
} gpu_profile_row;

/* The rows, the longest first, and their number. */
size_t gpu_profile_rows(gpu_profile *p, const gpu_profile_row **rows);
/* The calls of op `op` ("rope_forward", "nf4_dequantize"), over its rows
 * of every shape and stream. */
double gpu_profile_op_calls(gpu_profile *p, const char *op);
/* Profiled steps and their wall time in seconds (summed). */
int gpu_profile_steps(const gpu_profile *p);
double gpu_profile_step_seconds(const gpu_profile *p);

/* The table, every line starting "# profile": op, shape, stream, calls per
 * step, ms per step, % of the step's wall time, and TFLOP/s (GEMM,
 * attention) or GB/s (copies); then each stream's busy time and the host
 * thread's split. */
void gpu_profile_print(gpu_profile *p, FILE *f);
/* The same as a JSON object (the caller deletes it): steps, step_ms, the
 * FLOP convention, "ops" (one object a row), "streams" (busy ms per step),
 * "host_ms_per_step" (the waits); NULL when out of memory. */
struct cJSON;
struct cJSON *gpu_profile_json(gpu_profile *p);

#ifdef __cplusplus
}
#endif

#endif
