/* train: train a GPT-2 or LLaMA-family model on a token file, or on text
 * through the model's tokenizer.json, on the offload runtime: on the CPU
 * device backend or a CUDA GPU (--device), its memory capped by
 * --device-mem, weights resident or streamed from pinned host memory or
 * NVMe, AdamW over fp32 master state in memory and/or on NVMe, a
 * learning-rate schedule, evaluation on held-out data, checkpoints, a
 * metrics log and its picture, a plan from memplan; on several ranks under
 * mpirun (ZeRO stages 0-3). See --help.
 *
 * The program's parts: args.c (the flags, --help, their checks), inputs.c
 * (the config, tokenizer, data and LoRA choice), weights.c (weights in and
 * out, block by block), run.c (set-up, the steps, evaluation, checkpoints,
 * signals, the end), report.c (what it prints and writes). */
#include "examples/train/args.h"    /* defines: train_args, args_parse */
#include "examples/train/report.h"  /* defines: report_start, report_step, report_end, ... */
#include "examples/train/run.h"     /* defines: train_run, run_setup, run_step, run_finish, ... */

/* Whether the every-N-steps action is due after step k (always after the last). */
static int due(long every, long k, long steps)
{
    return (every && (k + 1) % every == 0) || k + 1 == steps;
}

int main(int argc, char **argv)
{
    /* the flags: a plan (--plan) first, then every flag over it */
    train_args a;
    int rc = args_parse(argc, argv, &a);
    if (rc >= 0) return rc; /* --help, or bad flags */
    if (a.check_plan) return run_check_plan(&a);

    train_run r;
    train_report rep;
    report_init(&rep, &a);
    zo_status st = run_init(&r, &a); /* the stop signals caught, the test seams read */
    if (st != ZO_OK) goto out;

    /* read the config, the plan against it, the tokenizer, the data */
    if ((st = run_read_inputs(&r)) != ZO_OK) goto out;
    /* set up the device, the ranks, the model on the device, the runtime */
    if ((st = run_setup(&r)) != ZO_OK) goto out;
    /* load the weights (a safetensors file, or random), then a checkpoint to resume */
    if ((st = run_load_weights(&r)) != ZO_OK) goto out;
    /* what will run (model, data, device, placement, method), the log opened */
    if ((st = report_start(&rep, &r)) != ZO_OK) goto out;

    /* train */
    if ((st = run_start(&r)) != ZO_OK) goto out;
    for (long k = r.k0; k < a.steps; k++) {
        /* the micro-batches' forward and backward, then the update */
        ft_record rec;
        int skipped;
        if ((st = run_step(&r, k, &rec, &skipped)) != ZO_OK) goto out;
        report_step(&r, &rec, skipped);
        /* the held-out loss, every --eval-every steps and after the last */
        if (a.eval_data && due(a.eval_every, k, a.steps)) {
            uint64_t counted;
            if ((st = run_evaluate(&r, &rec, &counted)) != ZO_OK) goto out;
            report_eval(&r, &rec, counted);
        }
        /* the step into the metrics log (and the plot's records) */
        if ((st = report_record(&rep, &rec)) != ZO_OK) goto out;
        /* a checkpoint, every --save-every steps and after the last */
        if (a.ckpt && due(a.save_every, k, a.steps) && (st = run_checkpoint(&r, k + 1)) != ZO_OK) goto out;
        if ((st = run_stopped()) != ZO_OK) goto out; /* SIGINT, SIGTERM or SIGHUP */
        report_progress(&rep, &r, k, rec.loss);
    }

    /* the plot, the device's peak, the memory per tier against the plan, the stats */
    if ((st = report_end(&rep, &r)) != ZO_OK) goto out;
    /* the trained weights, or the adapters */
    if (a.save) st = run_save(&r);
out:
    report_free(&rep);
    return run_finish(&r, st);
}
