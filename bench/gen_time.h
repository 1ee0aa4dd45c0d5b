/* Generation's time on the CPU backend beside memplan generate's prediction
 * (bench_generate): this machine described to the planner as a "GPU" that
 * is its own CPU (plan_hw_cpu_backend), the runtime's time per token
 * measured. */
#ifndef ZO_BENCH_GEN_TIME_H
#define ZO_BENCH_GEN_TIME_H

#include "planner/generate.h" /* defines: plan_gen, plan_gen_estimate */
#include "planner/hardware.h" /* defines: plan_hw */

/* A generation to time: the model, the batch, prompt and new tokens, the
 * dtype, where the weights live; random weights. */
typedef struct gen_time_case {
    const char *name;
    zo_model_config m;
    int batch, prompt, new_tokens;
    zo_dtype dtype;
    zo_plan_tier params_on;
    int prefetch;
} gen_time_case;

/* What the planner is told of this machine, measured: the host's profile
 * (memplan calibrate's functions: the triad's bandwidth, the NVMe read rate
 * of `nvme_dir` over a file the size of the weights, sustained over 8
 * passes, idle and beside a triad on every thread: a token reads the same
 * weights again), memcpy's rate (the CPU backend's copy to the "device"),
 * and the forward of case c's model outside the runtime (every block in
 * device memory, run one after another by the transformer alone, on
 * `threads` threads): a token's (halfway through the generation) and the
 * prompts'. Measure several times, beside the runs compared with it (the
 * machine may be shared), and keep the best of each (gen_time_best). */
typedef struct gen_time_machine {
    plan_hw host;
    double copy_bw;         /* bytes/s */
    double token_s;         /* a token's forward, seconds */
    double prompt_s;        /* the prompts' forward */
    int nvme_rounds;        /* rounds whose NVMe read rate host.nvme_read_bw sustains */
} gen_time_machine;

zo_status gen_time_measure_machine(const gen_time_case *c, int threads, const char *nvme_dir, gen_time_machine *out);
/* Two measurements as one: the faster rates and times, but the NVMe read
 * rate sustained over both (their bytes over their time: each round reads
 * the same bytes), as a run reads the disk token after token. */
void gen_time_best(gen_time_machine *best, const gen_time_machine *m);

/* The CPU backend as the planner's hardware (plan_hw_cpu_backend): the
 * host, memcpy as its link, and the device's two rates, its memory's and
 * its peak, set so that the planner's compute of a token (memory-bound) and
 * of the prompts (compute-bound) are the times measured. What the runtime
 * adds (its slots and events, streaming, copies and reads) is the
 * planner's to predict. */
zo_status gen_time_hw(const gen_time_case *c, const gen_time_machine *m, plan_hw *hw);

/* The planner's estimate of case c on hw (nothing reserved on the device). */
zo_status gen_time_predict(const gen_time_case *c, const plan_hw *hw, plan_gen_estimate *e);

/* Generate case c on the CPU backend (`threads` threads, NVMe weights in
 * nvme_dir): seconds per token over the tokens after the first, and the
 * time to the first tokens. */
zo_status gen_time_measure(const gen_time_case *c, int threads, const char *nvme_dir, double *s_per_token,
                           double *ttft);

#endif
