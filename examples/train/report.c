/* What train prints and writes about a run (report.h). */
#include "examples/train/report.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/clock.h" /* defines: zo_now */
#include "common/fileio.h" /* defines: zo_file_write_json */
#include "common/units.h" /* defines: zo_format_bytes */
#include "examples/train/weights.h" /* defines: weights_frozen_total */

/* ---- the configuration -------------------------------------------------------------- */

void report_lora(const train_args *a, const tf_model *m)
{
    char tg[128], b[32];
    printf("# LoRA r %d alpha %g on %s%s: %zu trainable parameters over a frozen base of %s\n",
           a->lora.r, a->lora.alpha, zo_lora_targets_str(a->lora.targets, tg, sizeof tg),
           a->qlora ? " (QLoRA: NF4 base)" : "", m->adapters.total_numel,
           zo_format_bytes(weights_frozen_total(m), b, sizeof b));
}

void report_placement(const train_args *a)
{
    const offload_config *oc = &a->p.cfg;
    char rc[48];
    if (oc->recompute && oc->recompute_layers)
        snprintf(rc, sizeof rc, "full of the first %d layers", oc->recompute_layers);
    else
        snprintf(rc, sizeof rc, "%s", oc->recompute == OFFLOAD_RECOMPUTE_OPS ? "ops (every other matmul)"
                                      : oc->recompute                          ? "full"
                                                                               : "none");
    printf("# placement: weights %s (prefetch %d), optimizer cpu %.2f nvme %.2f gpu %.2f, "
           "gradients %s, checkpoints %s, recompute %s; gradients reduced in %s%s%s\n",
           offload_tier_name(oc->params_on), oc->prefetch_depth, oc->opt_frac[OFFLOAD_CPU],
           oc->opt_frac[OFFLOAD_NVME], oc->opt_frac[OFFLOAD_DEVICE],
           oc->opt_frac[OFFLOAD_DEVICE] >= 1 ? "gpu" : oc->opt_frac[OFFLOAD_DEVICE] > 0 ? "gpu+cpu" : "cpu",
           offload_tier_name(oc->checkpoints_on),
           rc, zo_dtype_name(oc->reduce_dtype), a->plan ? "; plan " : "", a->plan ? a->plan : "");
}

void report_method(const train_args *a)
{
    const offload_config *oc = &a->p.cfg;
    char tg[128];
    printf("# method: %s", !a->lora.r ? "full" : a->qlora ? "qlora" : "lora");
    if (a->lora.r)
        printf(" (LoRA r %d alpha %g on %s, adapters on %s)", a->lora.r, a->lora.alpha,
               zo_lora_targets_str(a->lora.targets, tg, sizeof tg), offload_tier_name(oc->trainable_on));
    printf("; optimizer schedule %s", offload_schedule_name(oc->schedule));
    if (oc->schedule == OFFLOAD_SCHEDULE_DPU) printf(" (warm-up %d)", oc->dpu_warmup);
    if (oc->schedule == OFFLOAD_SCHEDULE_OVERLAP && oc->clip_stale) printf(" (clip stale)");
    if (oc->opt_state != ZO_PLAN_STATE_FP32) printf("; AdamW m, v in %s", zo_plan_opt_state_name(oc->opt_state));
    if (a->p.file.training.loss_chunk > 0) printf("; loss in chunks of %d tokens", a->p.file.training.loss_chunk);
    printf("\n");
}

void report_prediction(const offload_prediction *pr)
{
    if (!pr->present) {
        printf("# plan predicts: nothing (the plan has no \"predicted\" member)\n");
        return;
    }
    char b[32];
    printf("# plan predicts peak bytes per tier:");
    for (int t = 0; t < OFFLOAD_TIERS; t++)
        printf(" %s %s%s", offload_tier_name((offload_tier)t), zo_format_bytes(pr->peak[t], b, sizeof b),
               t + 1 < OFFLOAD_TIERS ? "," : "");
    printf("; step %.3g s\n", pr->step_s);
}

/* ---- the start-up ---------------------------------------------------------------------- */

void report_start_phase(const char *what, double seconds, const char *detail)
{
    printf("# start: %s in %.2f s%s%s\n", what, seconds, detail ? ": " : "", detail ? detail : "");
    fflush(stdout);
}

void report_init_part(void *user, const offload_init_part *part)
{
    (void)user;
    char what[64], detail[256] = "", b[32], pb[32];
    size_t n = 0;
    for (int t = 0; t < OFFLOAD_TIERS; t++) {
        if (!part->bytes[t]) continue;
        n += (size_t)snprintf(detail + n, sizeof detail - n, "%s%s %s", n ? ", " : "",
                              offload_tier_name((offload_tier)t), zo_format_bytes(part->bytes[t], b, sizeof b));
        if (t == OFFLOAD_CPU && part->pinned && n < sizeof detail)
            n += (size_t)snprintf(detail + n, sizeof detail - n, " (pinned %s)",
                                  zo_format_bytes(part->pinned, pb, sizeof pb));
        if (n >= sizeof detail) break;
    }
    snprintf(what, sizeof what, "runtime's %s", part->what);
    report_start_phase(what, part->seconds, n ? detail : NULL);
}

/* ---- the run -------------------------------------------------------------------------- */

void report_init(train_report *rp, const train_args *a)
{
    *rp = (train_report){.a = a};
}

/* "# adamw: ..." the optimizer's settings, and whether they are the
 * Hugging Face Trainer's defaults (betas 0.9/0.999, eps 1e-8, no weight
 * decay, so none on LoRA adapters; clip 1) or the flags'. */
static void print_adamw(const train_args *a)
{
    const offload_adamw *ad = &a->p.cfg.adam;
    int trainer = ad->beta1 == 0.9f && ad->beta2 == 0.999f && ad->eps == 1e-8f && ad->weight_decay == 0.0f &&
                  ad->clip == 1.0f;
    printf("# adamw: lr %g, betas %g/%g, eps %g, weight decay %g on %s, clip %g (%s)\n", ad->lr, ad->beta1,
           ad->beta2, ad->eps, ad->weight_decay, a->lora.r ? "the adapters' 2-D weights" : "2-D weights", ad->clip,
           trainer ? "Hugging Face Trainer's defaults" : "set by flags");
}

/* "# train: ..." (the model, batch, data and device), the ranks, the
 * placement, the method and the lr schedule. */
static void print_header(const train_run *r)
{
    const train_args *a = r->a;
    const offload_config *oc = &a->p.cfg;
    const zo_model_config *cfg = &r->cfg;
    char b1[32], b2[32];
    gpu_mem_stats ms;
    gpu_mem_get_stats(r->dev, &ms);
    printf("# train: %s (%s), %llu parameters, %d layers, hidden %d, vocab %d; dtype %s (%s); "
           "batch %ld x %ld x %d; data %s (%llu tokens); device %s, %s in use of %s\n",
           cfg->name, zo_model_family_name(cfg), (unsigned long long)r->trained->total_numel,
           cfg->n_layers, cfg->hidden, cfg->vocab, zo_dtype_name(a->dtype), a->dtype_from, a->micro_batch, a->seq,
           r->accum,
           a->data, (unsigned long long)r->tokens.n, gpu_device_name(r->dev),
           zo_format_bytes(ms.in_use, b1, sizeof b1),
           ms.capacity ? zo_format_bytes(ms.capacity, b2, sizeof b2) : "unlimited");
    if (r->ranks > 1)
        printf("# ranks: %d (%s), ZeRO-%d; global batch %ld x %ld x %d x %d ranks\n", r->ranks,
               comm_backend_name(comm_get_backend(r->comm)), oc->zero_stage, a->micro_batch, a->seq, r->accum,
               r->ranks);
    report_placement(a);
    report_method(a);
    print_adamw(a);
    if (a->p.selective_as_none && !oc->recompute)
        printf("# recompute: \"selective\" runs as none (the attention keeps no s x s "
               "scores, so selective would recompute nothing)\n");
    if (cfg->moe.sparsemixer) /* docs/transformer.md, "The sparsemixer" */
        printf("# router: sparsemixer in its eval form (jitter eps %g): the top expert and the next, each "
               "weighed by a softmax over the logits its mask keeps, its gradient through those softmaxes with "
               "the masks and choices held constant; Hugging Face's training mode samples the choices (Gumbel), "
               "jitters the layer's input and scales a straight-through gradient, which is random and not "
               "computed here\n",
               (double)cfg->moe.jitter_eps);
    const ft_schedule *sc = &a->sched;
    if (sc->kind != FT_LR_CONSTANT || sc->warmup)
        printf("# lr: %s from %g to %g over %ld steps, %ld warmup\n", ft_schedule_name(sc->kind), sc->lr,
               sc->kind == FT_LR_CONSTANT ? sc->lr : sc->min_lr, sc->steps, sc->warmup);
    fflush(stdout);
}

zo_status report_start(train_report *rp, const train_run *r)
{
    const train_args *a = rp->a;
    print_header(r);
    if (a->log && !(rp->log = fopen(a->log, a->resume ? "a" : "w"))) /* a path that cannot be written: bad input */
        return zo_error(ZO_ERR_IO, "--log %s: %s", a->log, strerror(errno));
    rp->progress = isatty(STDERR_FILENO) && !isatty(STDOUT_FILENO);
    /* the time line counts the training alone: not the set-up, the weights'
     * load or a resume's */
    offload_reset_times(r->rt);
    rp->t_start = zo_now();
    return ZO_OK;
}

/* The share of `pairs` dropped, in percent (0 of none). */
static double dropped_pct(uint64_t dropped, uint64_t pairs)
{
    return pairs ? 100.0 * (double)dropped / (double)pairs : 0.0;
}

void report_step(const train_run *r, const ft_record *rec, int skipped)
{
    char b[32];
    gpu_mem_stats ms;
    gpu_mem_get_stats(r->dev, &ms);
    char dropped[48] = "";
    if (r->m.opts.capacity_factor > 0) /* every rank's pairs of the step */
        snprintf(dropped, sizeof dropped, " dropped %.2f%%", dropped_pct(r->step_dropped, r->step_pairs));
    printf("step %ld loss %.6f lr %.6g norm %.4f tok/s %.0f mem %s%s%s\n", rec->step, rec->loss, rec->lr,
           rec->grad_norm, rec->tokens_per_s, zo_format_bytes(ms.high_water, b, sizeof b), dropped,
           skipped ? " (overflow: skipped)" : "");
}

void report_eval(const train_run *r, const ft_record *rec, uint64_t counted)
{
    char dropped[48] = "";
    if (r->m.opts.capacity_factor > 0) /* this rank's pairs of the evaluation */
        snprintf(dropped, sizeof dropped, " dropped %.2f%%", dropped_pct(r->eval_dropped, r->eval_pairs));
    printf("eval step %ld loss %.6f ppl %.4f (%ld batches, %llu tokens)%s\n", rec->step, rec->eval_loss,
           rec->eval_ppl, r->a->eval_batches, (unsigned long long)counted, dropped);
}

zo_status report_record(train_report *rp, const ft_record *rec)
{
    fflush(stdout);
    zo_status st;
    if (rp->log && (st = ft_log_write(rp->log, rp->a->log, rec)) != ZO_OK) return st;
    if (!rp->a->plot) return ZO_OK;
    ft_record *nr = realloc(rp->recs, (rp->n_recs + 1) * sizeof *nr);
    if (!nr) return zo_error(ZO_ERR_NOMEM, "train: out of host memory for the plot");
    rp->recs = nr;
    rp->recs[rp->n_recs++] = *rec;
    return ZO_OK;
}

void report_progress(train_report *rp, const train_run *r, long k, double loss)
{
    if (!rp->progress) return;
    long steps = rp->a->steps;
    double el = zo_now() - rp->t_start;
    char dropped[40] = "";
    if (r->m.opts.capacity_factor > 0)
        snprintf(dropped, sizeof dropped, ", %.1f%% dropped", dropped_pct(r->step_dropped, r->step_pairs));
    fprintf(stderr, "\r[%ld/%ld] loss %.4f%s, %.0fs left ", k + 1, steps, loss, dropped,
            el / (k + 1 - r->k0) * (steps - k - 1));
}

/* ---- the end ---------------------------------------------------------------------------- */

/* --plot: the whole log (earlier runs too when resumed), else this run's steps. */
static zo_status write_plot(train_report *rp, const train_run *r)
{
    const train_args *a = rp->a;
    if (rp->log) {
        fclose(rp->log);
        rp->log = NULL;
        free(rp->recs);
        rp->recs = NULL;
        zo_status st = ft_log_read(a->log, &rp->recs, &rp->n_recs);
        if (st != ZO_OK) return st;
    }
    char title[256];
    snprintf(title, sizeof title, "%s on %s", r->cfg.name, a->data);
    zo_status st = ft_plot_write(a->plot, rp->recs, rp->n_recs, title);
    if (st == ZO_OK) printf("# plot %s\n", a->plot);
    return st;
}

/* Peak bytes per tier beside the plan's prediction (per rank). */
static void print_peaks(const char *who, const uint64_t *peak, const offload_prediction *pred)
{
    char b1[32], vs[160];
    printf("# %speak bytes per tier:", who);
    for (int t = 0; t < OFFLOAD_TIERS; t++) {
        offload_format_peak_vs_plan(vs, sizeof vs, peak[t], pred, (offload_tier)t);
        printf(" %s %s%s", offload_tier_name((offload_tier)t), zo_format_bytes(peak[t], b1, sizeof b1), vs);
        printf(t + 1 < OFFLOAD_TIERS ? "," : "\n");
    }
}

/* Every rank's peaks (gathered: a collective), rank 0 prints them, and what
 * the ranks sent each other. */
static zo_status print_rank_peaks(offload_t *rt, const offload_stats *st, const offload_prediction *pred,
                                  uint64_t psi)
{
    uint64_t *all = calloc((size_t)st->ranks * OFFLOAD_TIERS, sizeof *all);
    if (!all) return zo_error(ZO_ERR_NOMEM, "train: out of host memory");
    zo_status e = offload_gather(rt, st->peak, sizeof st->peak, all);
    for (int r = 0; r < st->ranks && e == ZO_OK; r++) {
        char who[32];
        snprintf(who, sizeof who, "rank %d of %d: ", r, st->ranks);
        print_peaks(who, all + (size_t)r * OFFLOAD_TIERS, pred);
    }
    free(all);
    if (e != ZO_OK) return e;
    printf("# communication: %.3f Psi per step (%llu elements in %lld collectives since the start)\n",
           st->steps ? (double)(st->comm_elems + st->comm_reused_elems) / (double)st->steps / (double)psi
                     : 0.0,
           (unsigned long long)st->comm_elems, (long long)st->comm_calls);
    return ZO_OK;
}

/* The peaks per tier (every rank's), then this rank's time split: the
 * training's wall time (`total`, from its start), the parts of it the
 * runtime's calls spent, the rest (the host's own work: batches, logging,
 * checkpoints' bookkeeping) as "other"; what the optimizer's thread spent
 * beside it on a line of its own. */
static zo_status print_tiers(offload_t *rt, const offload_stats *st, const offload_prediction *pred,
                             uint64_t psi, double total)
{
    if (st->ranks <= 1) print_peaks("", st->peak, pred);
    else {
        zo_status e = print_rank_peaks(rt, st, pred, psi);
        if (e != ZO_OK) return e;
    }
    double parts = 0, beside = 0;
    printf("# time:");
    for (int p = 0; p < OFFLOAD_TIME_PARTS; p++) {
        printf(" %s %.3fs,", offload_time_part_name((offload_time_part)p), st->time[p]);
        parts += st->time[p];
        beside += st->time_beside[p];
    }
    printf(" other %.3fs = total %.3fs\n", total - parts, total);
    if (beside > 0) {
        printf("# time beside it, on the optimizer's thread:");
        for (int p = 0; p < OFFLOAD_TIME_PARTS; p++)
            if (st->time_beside[p] > 0)
                printf(" %s %.3fs", offload_time_part_name((offload_time_part)p), st->time_beside[p]);
        printf("\n");
        if (st->grad_sums > 0)
            printf("# gradient sums: %lld on the host, %lld of them on the cores the optimizer's thread "
                   "left while it updated, the others on every core\n",
                   (long long)st->grad_sums, (long long)st->grad_sums_beside);
    }
    if (st->optimizer_s > 0)
        printf("# optimizer: %.3fs on the host, %.0f%% of it beside the device's work\n", st->optimizer_s,
               100.0 * st->optimizer_overlap);
    return ZO_OK;
}

/* --stats-json: the runtime's document, and with --profile its table
 * under "profile". */
/* Expert parallelism's exchanges over the run (tf_model.ep_layers,
 * ep_pairs): the layers and pairs of each pass and the bytes the rank's
 * all-to-alls sent to the others, which those give exactly
 * (docs/offload.md, "Expert parallelism"). */
static cJSON *ep_json(const train_run *r)
{
    static const char *const pass[3] = {"forward", "recompute", "backward"};
    cJSON *e = cJSON_CreateObject();
    if (!e) return NULL;
    cJSON_AddNumberToObject(e, "ranks", r->ep);
    cJSON_AddNumberToObject(e, "local_experts", r->m.layout.expert_count);
    cJSON_AddNumberToObject(e, "all_to_all_bytes", (double)comm_all_to_all_bytes(r->ep_comm));
    for (int k = 0; k < 3; k++) {
        cJSON *p = cJSON_AddObjectToObject(e, pass[k]);
        cJSON_AddNumberToObject(p, "layers", (double)r->m.ep_layers[k]);
        cJSON_AddNumberToObject(p, "pairs_out", (double)r->m.ep_pairs[k][0]);
        cJSON_AddNumberToObject(p, "pairs_in", (double)r->m.ep_pairs[k][1]);
    }
    return e;
}

/* An MoE model's routing over the run's steps: the capacity factor and
 * the (token, expert) pairs every rank's micro-batches routed and dropped;
 * over the run's evaluations, this rank's. */
static cJSON *moe_json(const train_run *r)
{
    cJSON *e = cJSON_CreateObject();
    if (!e) return NULL;
    cJSON_AddNumberToObject(e, "capacity_factor", r->m.opts.capacity_factor);
    cJSON_AddNumberToObject(e, "pairs", (double)r->moe_pairs);
    cJSON_AddNumberToObject(e, "dropped", (double)r->moe_dropped);
    cJSON_AddNumberToObject(e, "eval_pairs", (double)r->moe_eval_pairs);
    cJSON_AddNumberToObject(e, "eval_dropped", (double)r->moe_eval_dropped);
    return e;
}

static zo_status write_stats(const train_run *r, const offload_prediction *pred, const char *path)
{
    int moe = r->cfg.moe.experts > 0;
    if (!r->prof && r->ep <= 1 && !moe) return offload_write_stats_json(r->rt, pred, path);
    cJSON *o;
    zo_status st = offload_stats_json(r->rt, pred, &o);
    if (st != ZO_OK) return zo_error_wrap(st, "--stats-json %s", path);
    cJSON *pj = r->prof ? gpu_profile_json(r->prof) : NULL, *ej = r->ep > 1 ? ep_json(r) : NULL;
    cJSON *mj = moe ? moe_json(r) : NULL;
    if ((r->prof && !pj) || (r->ep > 1 && !ej) || (moe && !mj)) {
        cJSON_Delete(pj);
        cJSON_Delete(ej);
        cJSON_Delete(mj);
        cJSON_Delete(o);
        return zo_error(ZO_ERR_NOMEM, "--stats-json %s: out of host memory", path);
    }
    if (pj) cJSON_AddItemToObject(o, "profile", pj);
    if (ej) cJSON_AddItemToObject(o, "ep", ej);
    if (mj) cJSON_AddItemToObject(o, "moe", mj);
    st = zo_file_write_json(path, o);
    cJSON_Delete(o);
    return st;
}

zo_status report_end(train_report *rp, train_run *r)
{
    const train_args *a = rp->a;
    const offload_prediction *pred = a->plan ? &a->p.predicted : NULL;
    double total = zo_now() - rp->t_start; /* the training's wall time */
    zo_status st;
    if (rp->progress) fprintf(stderr, "\n");
    if (a->plot && (st = write_plot(rp, r)) != ZO_OK) return st;
    char b1[32], b2[32];
    gpu_mem_stats ms;
    gpu_mem_get_stats(r->dev, &ms);
    printf("# device memory: peak %s of %s\n", zo_format_bytes(ms.high_water, b1, sizeof b1),
           ms.capacity ? zo_format_bytes(ms.capacity, b2, sizeof b2) : "unlimited");
    offload_stats ost;
    offload_get_stats(r->rt, &ost);
    if ((st = print_tiers(r->rt, &ost, pred, r->trained->total_numel, total)) != ZO_OK) return st;
    if (ost.n_expert_slots) /* docs/offload.md, "Experts streamed apart" */
        printf("# experts streamed apart: %d slots of %s, %llu experts fetched, %s of weights copied to the "
               "device\n", ost.n_expert_slots, zo_format_bytes(ost.expert_slot_bytes, b1, sizeof b1),
               (unsigned long long)ost.experts_fetched, zo_format_bytes(ost.bytes_weights, b2, sizeof b2));
    if (r->ep > 1) /* docs/offload.md, "Expert parallelism" */
        printf("# expert parallelism: %d ranks a group, %d experts a rank; rank 0's all-to-alls sent %llu bytes "
               "(%llu pairs out, %llu in, forward)\n", r->ep, r->m.layout.expert_count,
               (unsigned long long)comm_all_to_all_bytes(r->ep_comm), (unsigned long long)r->m.ep_pairs[0][0],
               (unsigned long long)r->m.ep_pairs[0][1]);
    if (r->cfg.moe.experts) /* docs/offload.md, "Capacity-limited routing" */
        printf("# moe routing: capacity factor %g%s; %llu pairs of token and expert, %llu dropped (%.2f%%)\n",
               r->m.opts.capacity_factor, r->m.opts.capacity_factor > 0 ? "" : " (dropless)",
               (unsigned long long)r->moe_pairs, (unsigned long long)r->moe_dropped,
               dropped_pct(r->moe_dropped, r->moe_pairs));
    if (r->prof) { /* the records still in flight waited for, then the table */
        if ((st = gpu_profile_stop(r->prof)) != ZO_OK) return zo_error_wrap(st, "--profile");
        gpu_profile_print(r->prof, stdout);
    }
    if (!a->stats_json) return ZO_OK;
    /* rank r > 0 writes FILE.rank<r> */
    char path[4200];
    snprintf(path, sizeof path, r->rank ? "%s.rank%d" : "%s", a->stats_json, r->rank);
    if ((st = write_stats(r, pred, path)) != ZO_OK) return st;
    printf("# stats %s\n", a->stats_json);
    return ZO_OK;
}

void report_free(train_report *rp)
{
    if (rp->log) fclose(rp->log);
    free(rp->recs);
    *rp = (train_report){0};
}
