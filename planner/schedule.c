/* The optimizer schedule as a critical path (docs/memplan.md, "Optimizer
 * schedules"): when the CPU update of a step runs beside the GPU's work,
 * the step is the longest chain of dependent work over the GPU, the CPU
 * optimizer and the links, not the sum of everything.
 *
 * A rank's blocks are the stage's first block (the embedding), its layers
 * and its last block (the head); within a kind every block is alike, so
 * each maximum over blocks below is taken at a kind's first or last block
 * (the quantities are linear in the block's index there). */
#include "cost.h"

#include <math.h>

static double dmax(double a, double b) { return a > b ? a : b; }
static double dmin(double a, double b) { return a < b ? a : b; }

const char *plan_bound_name(plan_bound b)
{
    static const char *n[] = {"gpu", "optimizer", "h2d", "d2h", "nvme", "host-memory"};
    return b <= PLAN_BOUND_HOST_MEM ? n[b] : "?";
}

/* Overlap, measured after the GPU's work of the step (time 0):
 * - exact clipping: every update waits for the global norm, i.e. for the
 *   whole backward; the CPU updates blocks in forward order and the next
 *   forward of block i waits for block i's update. The first forward then
 *   ends at max over i of (fill + U_i + F_i): U_i the updates of blocks
 *   0..i, F_i the forward of blocks i..n-1. What that adds to the step,
 *   beyond the GPU's own optimizer share, is returned.
 * - stale clipping (or none): block i's update starts when its gradients
 *   are complete, in the last micro-batch's backward, B_i before its end (the
 *   backward of blocks 0..i-1 still to run); blocks in backward order (the
 *   pipeline filled before the first, the last block), and the next forward
 *   waits for block 0's, the last. The chain ends at the largest of
 *   U_i - B_i, and fill + U_n-1 - B_n-1. */
static double overlap_added(const plan_sched_in *in, const double u[3], double fill, int stale)
{
    double fsum = 0;
    for (int k = 0; k < 3; k++) fsum += in->seg_n[k] * in->seg_fwd[k];
    double ucum = stale ? 0 : fill, fpre = 0, bpre = 0, worst = -INFINITY, last = -INFINITY;
    for (int k = 0; k < 3; k++) {
        int n = in->seg_n[k];
        if (!n) continue;
        double f = in->seg_fwd[k], b = in->seg_bwd[k];
        /* the kind's first block, then its last */
        double first = stale ? ucum + u[k] - bpre : ucum + u[k] + fsum - fpre;
        last = stale ? ucum + n * u[k] - bpre - (n - 1) * b
                     : ucum + n * u[k] + fsum - fpre - (n - 1) * f;
        worst = dmax(worst, dmax(first, last));
        ucum += n * u[k];
        fpre += n * f;
        bpre += n * b;
    }
    if (worst == -INFINITY) return 0;
    if (stale) worst = dmax(worst, last + fill);
    double after = stale ? worst : worst - fsum; /* the chain beyond what it overlaps */
    return dmax(after - in->opt_gpu, 0);
}

int plan_sched_sum_team(zo_plan_schedule s, int clip_stale)
{
    return s == ZO_PLAN_SCHED_DPU || (s == ZO_PLAN_SCHED_OVERLAP && clip_stale);
}

void plan_time_schedule(plan_time *o, zo_plan_schedule s)
{
    /* the host's gradient sums on the schedule's team (cost.c, host_teams):
     * all the cores alone, those the optimizer's thread leaves beside it */
    int team = plan_sched_sum_team(s, o->sched.clip_stale);
    if (team != o->sched.d2h_team) {
        plan_sched_in *w = &o->sched;
        double dd = w->d2h_exposed[team] - w->d2h_exposed[w->d2h_team];
        o->d2h += dd;
        w->gpu += dd;
        w->d2h_busy += w->d2h_link[team] - w->d2h_link[w->d2h_team];
        w->d2h_team = team;
    }
    const plan_sched_in *in = &o->sched;
    double n = in->cpu_n;
    /* serial: CPU AdamW and the NVMe share pipelined (the slower of the two
     * and one sub-group to fill it), then the new weights uploaded */
    double a = n > 0 ? n / in->rate_serial : 0, nv = in->n_elem * n;
    int upload = n > 0 && in->w_bytes > 0;
    double w_elem = upload ? in->w_bytes / in->pcie : 0, up = upload ? n * in->w_bytes / in->pcie : 0;
    double cpu_s = a, nvme_s = n > 0 ? dmax(a, nv) + in->fill * dmin(a, nv) - a : 0, up_s = up;
    double serial_opt = cpu_s + nvme_s + up_s;
    double base = in->gpu + in->opt_gpu;
    o->schedule = s;
    o->cpu_adam_total = a;
    o->serial_step = base + serial_opt;
    double exposed;
    if (s == ZO_PLAN_SCHED_SERIAL || n <= 0) {
        exposed = o->opt_s = serial_opt;
        /* one after the other: the step is the sum, the larger part what
         * bounds it (a LoRA update of milliseconds after seconds of GPU
         * work does not) */
        o->bound = n > 0 && serial_opt > base ? PLAN_BOUND_OPT : PLAN_BOUND_GPU;
        o->opt_threads = in->threads_serial;
        o->cpu_adam_rate = in->rate_serial;
        o->schedule = n > 0 ? s : ZO_PLAN_SCHED_SERIAL; /* nothing to overlap */
    } else {
        /* block by block, each resource a stage of a pipeline: an element
         * costs the slowest of CPU AdamW, its NVMe traffic and its upload;
         * the first sub-group passes through all three */
        double a1 = 1 / in->rate_over, c = dmax(a1, dmax(in->n_elem, w_elem));
        double fill = in->fill * n * (a1 + in->n_elem + w_elem - c);
        double chain = n * c + fill, u[3];
        for (int k = 0; k < 3; k++) u[k] = in->seg_elems[k] * c;
        o->opt_s = chain;
        o->opt_threads = in->threads_over;
        o->cpu_adam_rate = in->rate_over;
        o->cpu_adam_total = n * a1;
        double added = s == ZO_PLAN_SCHED_DPU ? dmax(chain - base, 0)
                                           : overlap_added(in, u, fill, in->clip_stale);
        o->bound = added > 0 ? PLAN_BOUND_OPT : PLAN_BOUND_GPU;
        double period = base + added;
        /* no link carries more than a step's worth: each is a lower bound;
         * so is the host's memory, which the gradient sums and AdamW both
         * stream (each memory-bound on every core): beside each other on
         * two teams of cores they take no less than one after the other
         * on all of them, and the PCIe copies' DMA reads and writes of it
         * (the gradients, streamed weights, checkpoints, the update's
         * upload) come on top at its own rate */
        double dma = in->host_rate > 0 ? (in->dma_bytes + n * in->w_bytes) / in->host_rate : 0;
        double bus = in->rate_bus > 0 ? in->host_sum[0] + n / in->rate_bus + dma : 0;
        const struct {
            double busy;
            plan_bound b;
        } links[] = {{in->h2d_busy + up, PLAN_BOUND_H2D},
                     {in->d2h_busy, PLAN_BOUND_D2H},
                     {in->nvme_busy + nv, PLAN_BOUND_NVME},
                     {bus, PLAN_BOUND_HOST_MEM}};
        for (int k = 0; k < 4; k++)
            if (links[k].busy > period) {
                period = links[k].busy;
                o->bound = links[k].b;
            }
        exposed = period - base;
    }
    o->opt_exposed = exposed;
    o->opt_hidden = dmax(o->opt_s - exposed, 0);
    /* the exposed update, in proportion to its serial parts */
    double f = exposed == serial_opt ? 1 : serial_opt > 0 ? exposed / serial_opt : 0;
    o->cpu_adam = cpu_s * f;
    o->nvme = nvme_s * f;
    o->h2d = in->h2d + up_s * f;
    o->optimizer_gpu = in->opt_gpu;
    o->step = o->forward + o->backward + o->recompute + o->tp_comm + o->pp_bubble + o->pp_comm +
              o->dp_comm + o->h2d + o->d2h + o->optimizer_gpu + o->cpu_adam + o->nvme +
              o->ep_comm + o->pp_engine;
    o->tokens_per_s = in->tokens / o->step;
    o->mfu = o->model_flops / (o->step * in->peak);
    o->hfu = o->hw_flops / (o->step * in->peak);
}
