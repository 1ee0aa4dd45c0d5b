/* The run: what train reads, the device, ranks, model and runtime it sets
 * up, a step (the micro-batches' forward and backward, the update, the mean
 * loss), evaluation, checkpoints, --save, the stop signals, and the end:
 * everything released and the exit status chosen (0 ok, 1 failed at run
 * time, 2 bad input: by the status and by what the run was doing). */
#ifndef ZO_EXAMPLES_TRAIN_RUN_H
#define ZO_EXAMPLES_TRAIN_RUN_H

#include <stdint.h>

#include "common/model_config.h"       /* defines: zo_model_config */
#include "examples/finetune.h"         /* defines: ft_record */
#include "examples/train/args.h"       /* defines: train_args */
#include "examples/train/weights.h"    /* defines: weights_ckpt */
#include "gpu/comm.h"                  /* defines: comm_t, comm_launch */
#include "gpu/device.h"                /* defines: gpu_device_t, gpu_stream_t */
#include "gpu/profile.h"               /* defines: gpu_profile */
#include "model/data.h"                /* defines: model_tokens */
#include "model/tokenizer.h"           /* defines: model_tokenizer */
#include "offload/offload.h"           /* defines: offload_t */
#include "transformer/offload_model.h" /* defines: tf_model, tf_offload_model */

/* What the run was doing, for the exit status: reading its inputs (config,
 * plan, tokenizer, data and eval data, LoRA adapters, weights, a checkpoint
 * to resume, the --log path), setting up (device, model, runtime), or
 * training. */
typedef enum run_phase { RUN_INPUT, RUN_SETUP, RUN_TRAIN } run_phase;

/* What a rank sends at the end of a step (offload_gather): its
 * micro-batches' loss sum and the MoE pairs they routed and dropped. */
typedef struct run_step_sums {
    double loss, pairs, dropped;
} run_step_sums;

typedef struct train_run {
    train_args *a;
    run_phase phase;
    zo_model_config cfg;
    model_tokenizer *tok;           /* --tokenizer, or NULL */
    int32_t eot;                    /* end-of-text after each document; -1: none */
    model_tokens tokens, eval;      /* --data, --eval-data */
    comm_launch launch;             /* the ranks the launcher started */
    gpu_device_t dev;
    gpu_stream_t s;
    comm_t comm;
    int rank, ranks;
    /* expert parallelism (--ep N > 1, parallel.ep): the group of N
     * consecutive ranks that together hold every expert (the token
     * exchange), and the ranks holding the same experts as this one (their
     * gradients' all-reduce; NULL when N is the rank count) */
    int ep;
    comm_t ep_comm, expert_comm;
    tf_model m;
    tf_offload_model tm;            /* the model as the runtime's blocks */
    offload_t *rt;
    gpu_profile *prof;              /* --profile, else NULL */
    const model_layout *trained;    /* the model's layout, or with LoRA the adapters' */
    weights_ckpt ckpt_weights;      /* a checkpoint's model.safetensors (weights_write) */
    int accum;                      /* micro-batches per step and rank */
    long k0;                        /* the first step: 0, or the resumed checkpoint's */
    int32_t *inputs, *targets;      /* a micro-batch: (micro_batch, seq) */
    run_step_sums *sums;            /* [ranks] a step's, every rank's */
    uint64_t step_pairs, step_dropped; /* the last step's (token, expert) pairs, every rank's: routed, dropped */
    uint64_t moe_pairs, moe_dropped;   /* the same over the run's steps (tf_options.capacity_factor) */
    /* the last evaluation's pairs, routed and dropped, and the same over the
     * run's evaluations: this rank's (every rank evaluates the same batches
     * and routes them alike, with --ep too: each drops among its own tokens) */
    uint64_t eval_pairs, eval_dropped;
    uint64_t moe_eval_pairs, moe_eval_dropped;
    long kill_rank, kill_step;      /* test seam ZO_TRAIN_KILL="RANK:STEP" */
    const char *pause_spec;         /* test seam ZO_TRAIN_CKPT_PAUSE="POINT:N:FD", or NULL */
    long fsize_rank, fsize_bytes;   /* test seam ZO_TRAIN_CKPT_FSIZE="RANK:BYTES" */
    long devfail_rank;              /* test seam ZO_TRAIN_CKPT_DEVFAIL="RANK:POINT" */
    char devfail_point[32];
    int quiet;                      /* the failure is every rank's alike and rank 0 says it */
    double t_begin;                 /* zo_now() at run_init: the start-up's clock */
} train_run;

/* Before anything: the stop signals (SIGINT, SIGTERM, SIGHUP end the run
 * after the current micro-batch, through run_finish) and the test seams of
 * the environment. *r is ready for run_finish whatever this returns. */
zo_status run_init(train_run *r, train_args *a);

/* The inputs: the model's config, the plan against it and the ranks, the
 * tokenizer, the data and the eval data, the LoRA choice; then whether the
 * runtime runs what they ask for on the launcher's ranks (the capability
 * table, common/capability.h: ZO_ERR_UNSUPPORTED, exit 2). This and the
 * next two print a "# start:" line per phase of the start-up as it ends
 * (report_start_phase; rank 0 alone), the last "# start: ready". */
zo_status run_read_inputs(train_run *r);

/* The device (one GPU per rank of a node on "cuda"), the communicator, the
 * model on the device and the runtime over it. */
zo_status run_setup(train_run *r);

/* The initial weights (weights_load), then a checkpoint to resume. */
zo_status run_load_weights(train_run *r);

/* From here on, failures are the run's: the batch buffers. */
zo_status run_start(train_run *r);

/* Step k: the lr of the schedule, forward and backward over the rank's
 * micro-batches, the update; *rec gets the mean loss over the global batch,
 * the lr, the gradient norm, the tokens per second and the peak bytes per
 * tier, *skipped whether the update was skipped (fp16 overflow). With
 * --profile, the steps after the first (the only one, when one step runs)
 * are profiled: their ops, the host's AdamW and the host's time split. */
zo_status run_step(train_run *r, long k, ft_record *rec, int *skipped);

/* The mean loss over the counted targets of --eval-batches batches of the
 * held-out data (the same batches every time), forward only, into rec's
 * eval members; *counted: the targets counted. */
zo_status run_evaluate(train_run *r, ft_record *rec, uint64_t *counted);

/* A checkpoint into --ckpt after `steps` steps. */
zo_status run_checkpoint(train_run *r, long steps);

/* --save (weights_save): every rank takes part. */
zo_status run_save(train_run *r);

/* ZO_ERR_INTERNAL, naming the signal, once a stop signal came; else ZO_OK. */
zo_status run_stopped(void);

/* The end: everything released (on several ranks, a failure ends every
 * rank), the message printed, a stop signal re-raised once cleaned up.
 * Returns the exit status. */
int run_finish(train_run *r, zo_status st);

/* --check-plan: the plan against the model (its parameters and one rank),
 * the placement, method and schedule a run would use and the plan's
 * predictions; no device, no data, nothing of the model allocated. Returns
 * the exit status: 0 they agree, 2 they do not or a file is bad (1 only
 * when the host runs out of memory reading them). */
int run_check_plan(train_args *a);

#endif
