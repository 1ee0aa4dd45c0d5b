/* What train prints and writes about a run: the header lines (the model,
 * data and device, the placement, the method, the lr schedule), a line per
 * step and per evaluation, the metrics log (--log) and its picture (--plot,
 * examples/finetune.h), the progress line on a terminal, and at the end the
 * device's peak, the peak bytes per tier against the plan's prediction, the
 * time split and --stats-json. Rank 0 prints (the others' stdout is
 * /dev/null); the peaks are gathered from every rank. */
#ifndef ZO_EXAMPLES_TRAIN_REPORT_H
#define ZO_EXAMPLES_TRAIN_REPORT_H

#include <stdio.h>

#include "examples/train/run.h" /* defines: train_run */

typedef struct train_report {
    const train_args *a;
    FILE *log;              /* --log */
    ft_record *recs;        /* --plot: this run's records */
    size_t n_recs;
    int progress;           /* stderr a terminal and stdout not: a progress line */
    double t_start;
} train_report;

void report_init(train_report *rp, const train_args *a);
/* The header lines, then --log opened (appended to with --resume; a path
 * that cannot be written is bad input). */
zo_status report_start(train_report *rp, const train_run *r);
/* "step K loss X lr Y norm G tok/s R mem M". */
void report_step(const train_run *r, const ft_record *rec, int skipped);
/* "eval step K loss X ppl P (N batches, T tokens)". */
void report_eval(const train_run *r, const ft_record *rec, uint64_t counted);
/* The step's record into --log and, for --plot, into memory. */
zo_status report_record(train_report *rp, const ft_record *rec);
/* "[K/N] loss X, Ts left" on stderr (with a capacity factor ", D% dropped"
 * after the loss), when it is a terminal and stdout is not. */
void report_progress(train_report *rp, const train_run *r, long k, double loss);
/* After the last step: the plot, the device's peak, the peaks per tier
 * (gathered: every rank calls it), the time split, --stats-json. */
zo_status report_end(train_report *rp, train_run *r);
void report_free(train_report *rp);

/* "# start: WHAT in X s" and, when detail is not NULL, ": DETAIL": a phase
 * of the start-up done, printed as it ends (flushed: a long start says what
 * it is doing). */
void report_start_phase(const char *what, double seconds, const char *detail);
/* An offload_init_hook: each part of the runtime's set-up as a start line,
 * "# start: runtime's PART in X s: cpu B (pinned P), gpu B, nvme B" (the
 * tiers it allocated in). */
void report_init_part(void *user, const offload_init_part *part);

/* "# LoRA r ..." once the model is set up. */
void report_lora(const train_args *a, const tf_model *m);
/* "# placement: ..." and "# method: ..." of the run's configuration (the
 * plan's, then the flags). */
void report_placement(const train_args *a);
void report_method(const train_args *a);
/* "# plan predicts ...": the plan's peaks per tier and step time. */
void report_prediction(const offload_prediction *pr);

#endif
