/* What `train` adds for fine-tuning, apart from the model: the
 * learning-rate schedule, the metrics log (one JSON object per step) and its
 * picture (SVG: loss, eval loss and learning rate against steps). Plain C,
 * no device and no runtime: the `plot` program and the tests use it too. */
#ifndef ZO_EXAMPLES_FINETUNE_H
#define ZO_EXAMPLES_FINETUNE_H

#include <stdint.h>
#include <stdio.h>

#include "common/status.h" /* defines: zo_status */

/* ---- learning-rate schedules -------------------------------------------------
 * Step k (0-based, the k-th optimizer step) of a schedule over S steps with
 * W warmup steps, peak lr and floor min_lr:
 *     k <  W:  lr * (k + 1) / W                  (linear warmup)
 *     k >= W:  p = (k - W) / (S - W), at most 1
 *              constant: lr
 *              linear:   lr + (min_lr - lr) * p
 *              cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2
 * (Hugging Face's get_cosine_schedule_with_warmup and
 * get_linear_schedule_with_warmup, with the warmup counted from step 1 so that
 * no step runs at lr 0.) The lr is a function of k alone: a resumed run
 * continues the schedule exactly. */
typedef enum ft_schedule_kind {
    FT_LR_CONSTANT = 0,
    FT_LR_COSINE,
    FT_LR_LINEAR,
} ft_schedule_kind;

typedef struct ft_schedule {
    ft_schedule_kind kind;
    double lr, min_lr;
    long warmup, steps;
} ft_schedule;

/* "constant", "cosine", "linear"; messages name `what`. */
zo_status ft_schedule_parse(const char *s, const char *what, ft_schedule_kind *out);
const char *ft_schedule_name(ft_schedule_kind k);
double ft_lr_at(const ft_schedule *s, long k);

/* ---- the metrics log ----------------------------------------------------------
 * One JSON object per line:
 *   {"step": K, "loss": X, "lr": Y, "grad_norm": G, "tokens_per_s": R,
 *    "peak_bytes": {"gpu": .., "cpu": .., "nvme": ..},
 *    "eval_loss": E, "eval_ppl": P}          (the eval members when evaluated) */
#define FT_TIERS 3

typedef struct ft_record {
    long step;
    double loss, lr, grad_norm, tokens_per_s;
    uint64_t peak[FT_TIERS];  /* gpu, cpu, nvme */
    int has_eval;
    double eval_loss, eval_ppl;
} ft_record;

/* Write one line (and flush). */
zo_status ft_log_write(FILE *f, const char *path, const ft_record *r);
/* Read a log: records in step order, a step logged twice (a run resumed
 * from an earlier checkpoint) keeps its last line. ZO_ERR_FORMAT names the
 * line. *out is malloc'd. */
zo_status ft_log_read(const char *path, ft_record **out, size_t *n);

/* ---- the picture ----------------------------------------------------------------
 * Two panels sharing the step axis: training loss (and eval loss, as points
 * joined by a line) above, the learning rate below. Returns the document
 * (malloc'd) or NULL when out of memory. */
char *ft_plot_svg(const ft_record *r, size_t n, const char *title);
/* ft_plot_svg written to `path` (through a temporary file and a rename). */
zo_status ft_plot_write(const char *path, const ft_record *r, size_t n, const char *title);

#endif
