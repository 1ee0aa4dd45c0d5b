#include "search.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "planner/planfile.h" /* defines: plan_run_shape (the capability table's view of a plan) */

void plan_space_defaults(plan_space *s, const zo_model_config *m, const plan_hw *hw)
{
    memset(s, 0, sizeof *s);
    s->gpus = hw->gpus;
    s->global_batch = 8 * hw->gpus;
    s->max_micro_batch = 16;
    s->max_vpp = 4;
    s->opt_steps = 10;
    s->max_prefetch = 3;
    s->allow_offload = 1;
    s->allow_nvme = 1;
    s->zero_min = 0;
    s->zero_max = 3;
    s->recompute = -1;
    s->params_on = -1;
    s->opt_on = -1;
    s->schedule = -1;
    s->adapters_on = -1;
    s->objective = PLAN_OBJ_TIME;
    plan_train_defaults(&s->base, m);
    plan_train_fit_hw(&s->base, hw);
}

/* ---- the ranked list -------------------------------------------------------------- */

/* Plans that differ only in prefetch depth count as one (the faster kept). */
static int same_shape(const plan_candidate *a, const plan_train *t, int gpus)
{
    const plan_train *u = &a->t;
    return a->gpus == gpus && u->dp == t->dp && u->tp == t->tp && u->pp == t->pp &&
           u->ep == t->ep && u->vpp == t->vpp && u->sp == t->sp && u->zero == t->zero &&
           u->micro_batch == t->micro_batch && u->recompute == t->recompute &&
           u->recompute_layers == t->recompute_layers &&
           u->params_on == t->params_on && u->grads_on == t->grads_on &&
           u->checkpoints_on == t->checkpoints_on && u->opt_frac[0] == t->opt_frac[0] &&
           u->opt_frac[1] == t->opt_frac[1] && u->opt_frac[2] == t->opt_frac[2] &&
           u->schedule == t->schedule && u->adapters_on == t->adapters_on && u->method == t->method &&
           u->opt_state == t->opt_state;
}

typedef struct ranked {
    plan_result *r;
    int k;
    double tie; /* scores within this relative difference are equal (ranks_before) */
} ranked;

/* Scores (predicted steps) within this relative difference of each other
 * are a tie: the step does not tell the plans apart. */
#define SCORE_TIE 1e-9
/* plan_space.max_step's margin, far above SCORE_TIE and the roundings */
#define CAP_SLACK 1e-6

/* The layers a plan recomputes whole (every layer of its stage: INT_MAX). */
static int recomputed_layers(const plan_train *t)
{
    if (t->recompute != ZO_PLAN_RECOMPUTE_FULL) return 0;
    return t->recompute_layers ? t->recompute_layers : INT_MAX;
}

/* Whether a plan of score sa, GPU bytes ga, ra layers recomputed and na
 * GPUs ranks before one of sb, gb, rb, nb: the lower score; between scores
 * that tie (within `tie`, relative) the fewer GPU bytes, which leave
 * headroom rather than fill the GPU for no step time, then the fewer layers
 * recomputed, then the fewer GPUs. The ranking is then the same whichever
 * order the search meets them in, but for plans equal in all four (of one
 * GPU count: walk_gpus meets them in one order) and for scores that chain
 * ties (a ties b, b ties c, a does not tie c: within 2e-9 of each other).
 * (The GPU count was the search's first order: with --max-gpus it met
 * fewer GPUs first, and kept the first met of two plans equal in the
 * rest; search_method now may walk the most GPUs first, and the rule
 * keeps what the first order ranked.) */
static int ranks_before(double tie, double sa, uint64_t ga, int ra, int na, double sb, uint64_t gb, int rb,
                        int nb)
{
    if (fabs(sa - sb) > tie * fmax(fabs(sa), fabs(sb))) return sa < sb;
    if (ga != gb) return ga < gb;
    if (ra != rb) return ra < rb;
    return na < nb;
}

static int before_candidate(const ranked *rk, double score, const plan_train *t, int gpus,
                            const plan_estimate *e, const plan_candidate *c)
{
    return ranks_before(rk->tie, score, e->total[ZO_PLAN_GPU], recomputed_layers(t), gpus, c->score,
                        c->total[ZO_PLAN_GPU], recomputed_layers(&c->t), c->gpus);
}

/* Whether the plan would enter the ranking (the list not full, or it ranks
 * before the last). */
static int enters(const ranked *rk, double score, const plan_train *t, int gpus, const plan_estimate *e)
{
    const plan_result *r = rk->r;
    return r->n_best < rk->k || before_candidate(rk, score, t, gpus, e, &r->best[r->n_best - 1]);
}

static void rank_insert(ranked *rk, const plan_train *t, int gpus, double score,
                        const plan_time *pt, const plan_estimate *e)
{
    plan_result *r = rk->r;
    int at = r->n_best;
    for (int i = 0; i < r->n_best; i++)
        if (same_shape(&r->best[i], t, gpus)) {
            if (!before_candidate(rk, score, t, gpus, e, &r->best[i])) return;
            at = i; /* replaced: remove it, then insert in order */
            memmove(&r->best[i], &r->best[i + 1], sizeof r->best[0] * (size_t)(r->n_best - i - 1));
            r->n_best--;
            break;
        }
    (void)at;
    int pos = r->n_best;
    while (pos > 0 && before_candidate(rk, score, t, gpus, e, &r->best[pos - 1])) pos--;
    if (pos >= rk->k) return;
    int n = r->n_best < rk->k ? r->n_best + 1 : rk->k;
    memmove(&r->best[pos + 1], &r->best[pos], sizeof r->best[0] * (size_t)(n - pos - 1));
    plan_candidate *c = &r->best[pos];
    c->t = *t;
    c->gpus = gpus;
    c->score = score;
    c->time = *pt;
    memcpy(c->total, e->total, sizeof c->total);
    r->n_best = n;
}

/* ---- the enumeration -------------------------------------------------------------- */

typedef struct walk {
    const zo_model_config *m;
    const plan_space *s;
    plan_hw hw;         /* with this count of GPUs */
    ranked rk;
    plan_result *r;
    plan_time_mb part_mb; /* the micro-batch of the layout with part_k layers recomputed */
    int part_k;           /* (0: none yet for this layout) */
    double cap;           /* > 0: layouts whose floor exceeds it are not walked (search_method) */
    int bound;            /* the step-time and cost objectives: once the ranking is full, layouts
                             whose floor's score exceeds its last plan's are not walked
                             (layout_bound) */
    double floor;         /* the layout's plan_time_floor (with a cap, a bound or a visitor) */
} walk;

/* A searched optimizer schedule other than serial counts this much slower
 * in the ranking: it must beat every serial plan by that much (the simpler
 * schedule otherwise; dpu changes what a step computes with). */
#define SCHED_MIN_GAIN 0.02

static double score_of(const plan_space *s, const plan_time *pt, const plan_estimate *e,
                       int gpus)
{
    double step = pt->step;
    if (s->schedule < 0 && pt->schedule != ZO_PLAN_SCHED_SERIAL) step *= 1 + SCHED_MIN_GAIN;
    switch (s->objective) {
    case PLAN_OBJ_MEMORY:
        /* GPU bytes first, step time breaks ties (a second is worth 1 byte) */
        return (double)e->total[ZO_PLAN_GPU] + step;
    case PLAN_OBJ_COST: return gpus * step / pt->sched.tokens; /* GPU-seconds per token */
    default: return step;
    }
}

/* Rank the configuration `t`, whose estimate `e` (of the serial schedule)
 * fits and whose step is `pt`, under each optimizer schedule the space
 * allows: serial, and when the CPU updates something overlap and the
 * delayed update (which holds its new weights in a host copy). */
static void rank_schedules(walk *w, plan_train *t, const plan_estimate *e, plan_time *pt)
{
    const plan_space *s = w->s;
    plan_estimate e_dpu;
    for (int sch = ZO_PLAN_SCHED_SERIAL; sch < ZO_PLAN_SCHEDULES; sch++) {
        if (s->schedule >= 0 && sch != s->schedule) continue;
        /* (the GPU's share cannot wait a step) */
        if (sch == ZO_PLAN_SCHED_DPU && t->opt_frac[ZO_PLAN_GPU] > 0) continue;
        if (sch != ZO_PLAN_SCHED_SERIAL && pt->sched.cpu_n <= 0 && s->schedule < 0) break;
        t->schedule = (zo_plan_schedule)sch;
        /* a plan file is for train: only what the runtime runs */
        if (s->runtime_plans) {
            zo_run_shape run;
            plan_run_shape(w->m, t, &run);
            if (zo_capability_find(&run) != ZO_CAP_RUNS ||
                zo_model_run_gap(w->m, t->capacity_factor))
                continue;
        }
        const plan_estimate *se = e;
        if (sch == ZO_PLAN_SCHED_DPU) {
            plan_estimate_unchecked(w->m, &w->hw, t, &e_dpu);
            if (!e_dpu.fits) continue;
            se = &e_dpu;
        }
        if (sch != ZO_PLAN_SCHED_SERIAL) plan_time_schedule(pt, t->schedule);
        double sc = score_of(s, pt, se, w->hw.gpus);
        if (s->visit) s->visit(s->visit_arg, t, w->hw.gpus, pt->step, w->floor);
        if (enters(&w->rk, sc, t, w->hw.gpus, se)) rank_insert(&w->rk, t, w->hw.gpus, sc, pt, se);
    }
}

/* Whether steps a and b tie (ranks_before's rule). */
static int steps_tie(const walk *w, double a, double b)
{
    return fabs(a - b) <= w->rk.tie * fmax(fabs(a), fabs(b));
}

/* Recompute full of part of the layers, where recomputing every layer fits
 * (`full`, estimated with `t`): the fewest layers of a stage that keep the
 * GPU within its capacity, since each layer not recomputed adds what it keeps
 * beyond its input (for every micro-batch in flight, with the allocator's
 * allowance). Where recomputing more layers takes the same step (another
 * resource sets it: the disk, the host's update), the most layers that do,
 * for the GPU's headroom; every layer (returns 0: the caller ranks `full`)
 * when that ties too. Timed and ranked when some layers need not be
 * recomputed; the micro-batch's time of the last K tried is kept in
 * *part_mb. */
static int walk_partial(walk *w, plan_train *t, const plan_estimate *full, const plan_time_mb *mb,
                        plan_time_mb *part_mb, int *part_k)
{
    int layers = full->layers;
    double each = full->inflight * (double)(full->act_layer_full - full->act_layer) *
                  (1 + t->buf.fragmentation);
    if (layers < 2 || each <= 0) return 0;
    double room = (double)full->capacity[ZO_PLAN_GPU] - (double)full->total[ZO_PLAN_GPU];
    int keep = (int)floor(room / each);
    if (keep < 1) return 0;
    if (keep >= layers) return 0; /* (all of them: recompute none says it, faster) */
    plan_estimate e, best_e;
    plan_time pt, best_pt;
    int best_k = 0;
    double first = 0; /* the fewest layers' step, which the others must tie */
    for (int k = layers - keep; k < layers; k++) {
        t->recompute_layers = k;
        t->schedule = ZO_PLAN_SCHED_SERIAL; /* (the memory of the serial schedule) */
        w->r->configs++;
        plan_estimate_unchecked(w->m, &w->hw, t, &e);
        if (!e.fits) {
            if (best_k) break;
            continue;
        }
        w->r->feasible++;
        if (*part_k != k) {
            plan_time_mb_recompute_part(mb, (double)k / layers, part_mb);
            *part_k = k;
        }
        plan_time_step(w->m, &w->hw, t, &e, part_mb, &pt);
        if (!best_k) first = pt.step;
        else if (!steps_tie(w, pt.step, first)) break;
        best_k = k;
        best_e = e;
        best_pt = pt;
    }
    t->recompute_layers = 0;
    if (!best_k) return 0;
    if (best_k == layers - 1) {
        t->schedule = ZO_PLAN_SCHED_SERIAL;
        plan_time_step(w->m, &w->hw, t, full, mb, &pt);
        if (steps_tie(w, pt.step, first)) return 0;
    }
    t->recompute_layers = best_k;
    rank_schedules(w, t, &best_e, &best_pt);
    t->recompute_layers = 0;
    return 1;
}

/* One placement (weights, adapters, optimizer split): each checkpoint tier
 * and prefetch depth estimated, and what fits timed and ranked. Sets
 * *fitted when something fitted, *gpu_fits when the GPU's part once did. */
static void walk_depths(walk *w, plan_train *t, const plan_time_mb *mb, int *fitted, int *gpu_fits)
{
    const plan_space *s = w->s;
    plan_estimate e;
    plan_time pt;
    /* host checkpoints are layer inputs kept for full recompute */
    int ckmax = s->allow_offload && t->recompute == ZO_PLAN_RECOMPUTE_FULL ? ZO_PLAN_CPU : ZO_PLAN_GPU;
    int streamed = t->params_on != ZO_PLAN_GPU || t->adapters_on != ZO_PLAN_GPU || t->zero >= 3;
    int dmin = streamed ? 1 : s->base.buf.prefetch_depth;
    int dmax = streamed ? s->max_prefetch : s->base.buf.prefetch_depth;
    for (int ck = ZO_PLAN_GPU; ck <= ckmax; ck++) {
        t->checkpoints_on = (zo_plan_tier)ck;
        for (int d = dmin; d <= dmax; d++) {
            t->buf.prefetch_depth = d;
            w->r->configs++;
            t->schedule = ZO_PLAN_SCHED_SERIAL; /* (the memory of the serial schedule) */
            plan_estimate_unchecked(w->m, &w->hw, t, &e);
            *gpu_fits |= e.total[ZO_PLAN_GPU] <= e.capacity[ZO_PLAN_GPU];
            if (!e.fits) continue;
            *fitted = 1;
            w->r->feasible++;
            /* where part of the layers can keep their activations, that is
             * faster than recomputing them all (which is then ranked only by
             * memory, or where the step ties: walk_partial) */
            if (t->recompute == ZO_PLAN_RECOMPUTE_FULL && ck == ZO_PLAN_GPU &&
                e.activations_known && walk_partial(w, t, &e, mb, &w->part_mb, &w->part_k) &&
                s->objective != PLAN_OBJ_MEMORY)
                continue;
            plan_time_step(w->m, &w->hw, t, &e, mb, &pt);
            rank_schedules(w, t, &e, &pt);
        }
    }
}

/* The optimizer's splits of one placement of the weights (and adapters):
 * g/steps of it on the GPU (its gradients summed there), k/steps on NVMe,
 * the rest on the CPU; the whole of it on the GPU first. Streamed weights
 * keep a CPU share (LoRA's need not: the base streams, the adapters stay); a
 * three-way split is searched for full fine-tuning (LoRA's adapters are too
 * small to be worth one). `share[g]` is the GPU's share as the runtime takes
 * it (whole blocks from the last) of g/steps asked for.
 * (Pruned by the cost model's order: a larger GPU share and a smaller NVMe
 * share are never slower, and cost memory only on the GPU and on the host.
 * So no split is tried once the whole optimizer fitted on the GPU; a split's
 * NVMe share grows only until something fits, and while the GPU's share
 * fits there; and once a split fitted without NVMe, smaller GPU shares are
 * not tried. The CPU-and-NVMe placements (no GPU share) are all tried: the
 * delayed update takes them.) */
static void walk_splits(walk *w, plan_train *t, const plan_time_mb *mb, int steps,
                        const double *share)
{
    const plan_space *s = w->s;
    int split = s->allow_offload && s->opt_on < 0 && t->method == ZO_PLAN_FULL;
    double last_fg = -1;
    int whole_fits = 0, split_done = 0;
    for (int g = steps; g >= 0; g--) {
        if (g < steps && !s->allow_offload) break;
        if (g == steps && t->params_on != ZO_PLAN_GPU && t->method == ZO_PLAN_FULL) continue;
        int partial = g > 0 && g < steps;
        if (partial && (!split || whole_fits || split_done)) continue;
        if (s->opt_on == ZO_PLAN_GPU && g < steps) continue;
        if ((s->opt_on == ZO_PLAN_CPU || s->opt_on == ZO_PLAN_NVME) && g > 0) continue;
        /* a split that rounds to the one before is not tried twice, and the
         * plan says the share it gets */
        double fg = partial ? share[g] : (double)g / steps;
        if (partial && (fg >= 1 || fg == last_fg)) continue;
        last_fg = fg;
        for (int k = 0; k <= steps - g; k++) {
            double fn = (double)k / steps;
            if (k > 0 && !s->allow_nvme) break;
            if (s->opt_on == ZO_PLAN_CPU && k > 0) break;
            if (s->opt_on == ZO_PLAN_NVME && k != steps) continue;
            if (fg + fn > 1 + 1e-9) break;
            t->opt_frac[ZO_PLAN_GPU] = fg;
            t->opt_frac[ZO_PLAN_NVME] = fn;
            t->opt_frac[ZO_PLAN_CPU] = fg + fn >= 1 ? 0 : 1 - fg - fn;
            if (t->opt_frac[ZO_PLAN_GPU] < s->opt_min[ZO_PLAN_GPU] - 1e-9 ||
                t->opt_frac[ZO_PLAN_CPU] < s->opt_min[ZO_PLAN_CPU] - 1e-9 ||
                t->opt_frac[ZO_PLAN_NVME] < s->opt_min[ZO_PLAN_NVME] - 1e-9)
                continue;
            t->grads_on = g == steps ? ZO_PLAN_GPU : ZO_PLAN_CPU;
            int fitted = 0, gpu_fits = 0;
            walk_depths(w, t, mb, &fitted, &gpu_fits);
            whole_fits |= fitted && g == steps;
            split_done |= fitted && partial && k == 0;
            /* (a larger NVMe share changes nothing on the GPU) */
            if (partial && (fitted || !gpu_fits)) break;
        }
    }
}

/* The placements and ZeRO stages of one parallel layout. */
static void walk_placements(walk *w, plan_train *t, const plan_time_mb *mb)
{
    const plan_space *s = w->s;
    int zmin = s->zero_min, zmax = s->zero_max;
    if (t->dp == 1) zmin = zmax = 0; /* nothing to shard */
    int pmax = !s->allow_offload ? ZO_PLAN_GPU : s->allow_nvme ? ZO_PLAN_NVME : ZO_PLAN_CPU;
    int steps = s->opt_steps < 1 ? 1 : s->opt_steps > PLAN_OPT_STEPS_MAX ? PLAN_OPT_STEPS_MAX : s->opt_steps;
    /* LoRA: the adapters on any tier the weights may take */
    int amax = t->method == ZO_PLAN_FULL ? ZO_PLAN_GPU : pmax;
    /* the GPU's share of a split as the runtime takes it (whole blocks from
     * the last), g/steps of it asked for: the layout's, whatever the placement */
    double share[PLAN_OPT_STEPS_MAX + 1];
    for (int g = 0; g <= steps; g++) {
        t->opt_frac[ZO_PLAN_GPU] = (double)g / steps;
        share[g] = t->pp == 1 ? plan_gpu_share(w->m, t, 0) : (double)g / steps;
    }
    unsigned states = s->opt_states && t->optimizer == ZO_PLAN_ADAMW ? s->opt_states
                                                                      : 1u << t->opt_state;
    for (int os = 0; os < ZO_PLAN_STATES; os++) {
      if (!(states & (1u << os))) continue;
      t->opt_state = (zo_plan_opt_state)os;
      for (int z = zmin; z <= zmax; z++) {
        t->zero = z;
        for (int pla = 0; pla <= (pmax + 1) * (amax + 1) - 1; pla++) {
            int pl = pla / (amax + 1), ad = pla % (amax + 1);
            if (s->params_on >= 0 && pl != s->params_on) continue;
            if (s->adapters_on >= 0 && t->method != ZO_PLAN_FULL && ad != s->adapters_on) continue;
            t->params_on = (zo_plan_tier)pl;
            t->adapters_on = (zo_plan_tier)ad;
            walk_splits(w, t, mb, steps, share);
        }
      }
    }
}

/* Recompute ops is searched when asked for (--recompute ops; a point between
 * none and full that full of part of the layers mostly covers, at a third more
 * of the search), where it is modelled (dense GPT and LLaMA layers, flash
 * attention; full fine-tuning, LoRA and QLoRA), which is where the runtime
 * runs it too. */
static int ops_searched(const zo_model_config *m, const plan_space *s)
{
    return s->recompute == ZO_PLAN_RECOMPUTE_OPS && !m->params_override &&
           !m->moe.experts && !m->mla.kv_rank && s->base.flash_attn;
}

/* The floor above which a layout is not walked (0: every layout is): the
 * cap (plan_space.max_step, search_method says why it is sound), or, in a
 * step-time search whose ranking holds `top` plans, the last plan's score
 * and CAP_SLACK, whichever is smaller (each bound alone skips only layouts
 * that change nothing the search returns, so the smaller one does too).
 *
 * Why the bound leaves the ranking as it is. Every plan of the layout
 * scores at least its step (score_of: the step-time objective is the step,
 * times 1 + SCHED_MIN_GAIN >= 1 for a schedule other than serial, so that
 * margin only raises a score and needs none here), and steps at least the
 * layout's floor (plan_time_floor, rounded otherwise, far within
 * CAP_SLACK). With the floor above last * (1 + CAP_SLACK) each plan's score
 * is above the last's by more than SCORE_TIE, relative: ranks_before puts
 * the last first whatever the GPU bytes and layers recomputed, and `enters`
 * refuses the plan, so rank_insert, the list's only writer (which replaces
 * a same-shape entry only after `enters` let the plan in), is not called.
 * The list the layout's next plan meets is then the same one, with the
 * same last, and by induction none of the layout's plans changes it:
 * walking it would add only to configs and feasible. The list need not be
 * this search's alone: the methods of --method auto (plan_search) and the
 * GPU counts of --max-gpus fill one list in turn, and whatever filled it,
 * a plan enters only before its last. A list not yet full takes any plan:
 * no bound then. Which layouts the bound skips depends on the order they
 * are met in; the ranking does not (ranks_before's tie rule), so
 * search_method walks the GPU counts from the most.
 * The cost objective (GPU-seconds per token) is bounded alike in its own
 * units: a plan scores gpus x its step (at least the floor, and more with
 * SCHED_MIN_GAIN) over the step's tokens, which the layout fixes
 * (floor_score), so the same argument holds with the floor's score in the
 * floor's place. The memory objective ranks by bytes first: no bound. */
/* What a layout's floor (a step) is in the objective's units: the cost
 * objective's GPU-seconds per token of a plan stepping at the floor. */
static double floor_score(const walk *w, const plan_train *t, double floor)
{
    if (w->s->objective != PLAN_OBJ_COST) return floor;
    return w->hw.gpus * floor / plan_step_tokens(t);
}

static double layout_bound(const walk *w)
{
    double lim = w->cap;
    const plan_result *r = w->r;
    if (w->bound && r->n_best == w->rk.k) {
        double last = r->best[r->n_best - 1].score * (1 + CAP_SLACK);
        if (last > 0 && !(lim > 0 && lim <= last)) lim = last;
    }
    return lim;
}

static void walk_gpus(walk *w, int gpus)
{
    const zo_model_config *m = w->m;
    const plan_space *s = w->s;
    w->hw.gpus = gpus;
    int L = m->params_override ? 1 : m->n_layers;
    int node = w->hw.gpus_per_node;
    /* (a plan file for train: data parallelism only, the capability table's
     * first rows; rank_schedules asks the table of every candidate) */
    int par_max = s->runtime_plans ? 1 : gpus;
    for (int tp = 1; tp <= gpus && tp <= node && tp <= par_max; tp++) {
        if (gpus % tp || (s->tp && tp != s->tp)) continue;
        if (!m->params_override && (m->n_heads % tp || m->n_kv_heads % tp)) continue;
        if (m->params_override && tp > 1) continue;
        for (int pp = 1; pp * tp <= gpus && pp <= par_max; pp++) {
            if ((gpus / tp) % pp || L % pp || (s->pp && pp != s->pp)) continue;
            int dp = gpus / (tp * pp);
            if (s->global_batch % dp) continue;
            int per_dp = s->global_batch / dp;
            for (int mbs = 1; mbs <= per_dp && mbs <= s->max_micro_batch; mbs *= 2) {
                if (per_dp % mbs) continue;
                int ga = per_dp / mbs;
                /* DeepSpeed's pipeline engine does not interleave */
                int vmax = pp > 1 && ga % pp == 0 && s->pp_schedule != PLAN_PP_DEEPSPEED ? s->max_vpp : 1;
                for (int v = 1; v <= vmax; v++) {
                    if (v > 1 && L % (pp * v)) continue;
                    for (int sp = 0; sp <= (tp > 1); sp++) {
                      /* expert parallelism over data-parallel ranks (MoE only) */
                      /* (a plan file too: the table is asked of each candidate) */
                      for (int ep = 1; ep <= dp; ep++) {
                        if (dp % ep || (ep > 1 && (!m->moe.experts || m->moe.experts % ep))) continue;
                        if (s->ep && ep != s->ep) continue;
                        for (int rc = ZO_PLAN_RECOMPUTE_NONE; rc < ZO_PLAN_RECOMPUTES; rc++) {
                            if (s->recompute >= 0 && rc != s->recompute) continue;
                            /* with flash attention selective recompute saves nothing */
                            if (rc == ZO_PLAN_RECOMPUTE_SELECTIVE && s->base.flash_attn) continue;
                            if (m->params_override && rc == ZO_PLAN_RECOMPUTE_SELECTIVE) continue;
                            if (rc == ZO_PLAN_RECOMPUTE_OPS && !ops_searched(m, s)) continue;
                            plan_train t = s->base;
                            t.dp = dp;
                            t.tp = tp;
                            t.pp = pp;
                            t.vpp = v;
                            /* a pipeline engine times pipelines only */
                            t.pp_schedule = pp > 1 ? s->pp_schedule : PLAN_PP_MEGATRON;
                            t.sp = sp;
                            t.ep = ep;
                            t.micro_batch = mbs;
                            t.grad_accum = ga;
                            t.recompute = (zo_plan_recompute)rc;
                            plan_time_mb mb;
                            plan_time_microbatch(m, &w->hw, &t, &mb);
                            w->r->layouts++;
                            /* none of this layout's plans steps within the cap, or enters
                             * the full ranking */
                            double bound = layout_bound(w);
                            if (bound > 0 || s->visit) {
                                w->floor = plan_time_floor(m, &w->hw, &t, &mb);
                                if (bound > 0 && floor_score(w, &t, w->floor) > bound) {
                                    w->r->skipped++;
                                    continue;
                                }
                            }
                            w->part_k = 0;
                            walk_placements(w, &t, &mb);
                        }
                      }
                    }
                }
            }
        }
    }
}

/* The search of one method (s->base.method) into out's ranking. */
static zo_status search_method(const zo_model_config *m, const plan_hw *hw, const plan_space *s, int top,
                               plan_result *out);

zo_status plan_search(const zo_model_config *m, const plan_hw *hw, const plan_space *s, int top,
                      plan_result *out)
{
    memset(out, 0, sizeof *out);
    unsigned mask = s->methods ? s->methods : 1u << s->base.method;
    for (int k = ZO_PLAN_FULL; k <= ZO_PLAN_QLORA; k++) {
        if (!(mask & 1u << k)) continue;
        plan_space sm = *s;
        sm.base.method = (zo_plan_method)k;
        zo_status st = search_method(m, hw, &sm, top, out);
        /* several methods: one the model cannot take (LoRA of a latent
         * attention) is left out */
        if (st && mask != 1u << k && k != ZO_PLAN_FULL) {
            zo_clear_error();
            continue;
        }
        if (st) return st;
    }
    return ZO_OK;
}

static zo_status search_method(const zo_model_config *m, const plan_hw *hw, const plan_space *s, int top,
                               plan_result *out)
{
    if (top < 1 || top > PLAN_TOP_MAX)
        return zo_error(ZO_ERR_INVALID, "--top %d: between 1 and %d", top, PLAN_TOP_MAX);
    if (s->global_batch < 1)
        return zo_error(ZO_ERR_INVALID, "--global-batch must be positive");
    if (s->gpus < 1 && s->max_gpus < 1)
        return zo_error(ZO_ERR_INVALID, "--gpus or --max-gpus must be positive");
    if (s->zero_min < 0 || s->zero_max > 3 || s->zero_min > s->zero_max)
        return zo_error(ZO_ERR_INVALID, "--zero: stages between 0 and 3");
    if (s->base.seq < 1) return zo_error(ZO_ERR_INVALID, "--seq must be positive");
    if (!m->params_override && zo_model_position_rows(m) && s->base.seq > m->max_seq)
        return zo_error(ZO_ERR_INVALID, "--seq %d exceeds the %d learned positions of %s",
                        s->base.seq, m->max_seq, m->name);
    /* the hardware and buffers are checked once, on a trivially valid layout */
    plan_train probe = s->base;
    plan_hw h1 = *hw;
    h1.gpus = 1;
    probe.dp = probe.tp = probe.pp = probe.vpp = probe.ep = 1;
    probe.sp = 0;
    probe.zero = 0;
    probe.seq = s->base.seq;
    probe.schedule = ZO_PLAN_SCHED_SERIAL; /* (searched with the placements) */
    zo_status st = plan_train_validate(&probe, m, &h1);
    if (st) return st;
    if (hw->peak_flops_16 <= 0 || hw->gemm_eff_max <= 0 || hw->hbm_eff <= 0 || hw->pcie_bw <= 0)
        return zo_error(ZO_ERR_INVALID, "hardware '%s' lacks the cost model's rates", hw->name);
    /* (the other objectives rank by what a step time does not bound) */
    if (!(s->max_step >= 0) || (s->max_step > 0 && s->objective != PLAN_OBJ_TIME))
        return zo_error(ZO_ERR_INVALID, "plan_space.max_step %g: a step-time cap, >= 0, with the step-time "
                        "objective only", s->max_step);

    /* (the memory objective's score is bytes and seconds: exact ties only) */
    walk w = {.m = m, .s = s, .hw = *hw, .rk = {out, top, s->objective == PLAN_OBJ_MEMORY ? 0.0 : SCORE_TIE},
              .r = out, .bound = s->objective != PLAN_OBJ_MEMORY && !s->no_bound};
    /* The cap on the score: a plan that steps at most max_step scores at
     * most (1 + SCHED_MIN_GAIN) of it (score_of), one ranked before it no
     * more than that (within SCORE_TIE), and a plan's step is at most its
     * score, its layout's floor at most its step (rounded otherwise: the
     * floor adds a subset of the step's parts). CAP_SLACK covers the tie
     * and the roundings, so no such plan's layout is skipped. */
    if (s->max_step > 0)
        w.cap = s->max_step * (s->schedule < 0 ? 1 + SCHED_MIN_GAIN : 1) * (1 + CAP_SLACK);
    if (s->max_gpus > 0) {
        /* With the bound, the most GPUs first: under a fixed global batch
         * more GPUs mostly step faster, so the ranking fills with fast plans
         * early and the bound skips more (the 70B command's search 0.05-0.07 s
         * of CPU against 0.56-0.70 s walking fewer GPUs first;
         * docs/performance.md; the cost objective's 70B search 0.7-1.1 s
         * against 4.7-6.5 s without its bound). The ranking is the same in
         * either order (ranks_before); without the bound, fewer GPUs first
         * as before. */
        const int most_first = w.bound;
        for (int i = 1; i <= s->max_gpus; i++) {
            int g = most_first ? s->max_gpus + 1 - i : i;
            int pow2 = (g & (g - 1)) == 0;
            if (!pow2 && g % hw->gpus_per_node) continue;
            walk_gpus(&w, g);
        }
    } else {
        walk_gpus(&w, s->gpus);
    }
    return ZO_OK;
}

/* ---- words ------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, used;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...)
{
    if (b->used >= b->len) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->used, b->len - b->used, fmt, ap);
    va_end(ap);
    if (n > 0) b->used += (size_t)n;
    if (b->used >= b->len) b->used = b->len - 1;
}

static void describe_opt(const double f[ZO_PLAN_TIERS], char *buf, size_t len)
{
    if (f[ZO_PLAN_GPU] >= 1) snprintf(buf, len, "the GPU");
    else if (f[ZO_PLAN_CPU] >= 1) snprintf(buf, len, "the CPU");
    else if (f[ZO_PLAN_NVME] >= 1) snprintf(buf, len, "NVMe");
    else if (f[ZO_PLAN_GPU] > 0)
        snprintf(buf, len, "%.0f%% GPU / %.0f%% CPU / %.0f%% NVMe", 100 * f[ZO_PLAN_GPU], 100 * f[ZO_PLAN_CPU],
                 100 * f[ZO_PLAN_NVME]);
    else snprintf(buf, len, "%.0f%% CPU / %.0f%% NVMe", 100 * f[ZO_PLAN_CPU], 100 * f[ZO_PLAN_NVME]);
}

static const char *tier_words(zo_plan_tier t)
{
    return t == ZO_PLAN_GPU ? "the GPU" : t == ZO_PLAN_CPU ? "the CPU" : "NVMe";
}

const char *plan_method_words(const plan_train *t, char *buf, size_t len)
{
    char tg[64];
    if (t->method == ZO_PLAN_FULL) snprintf(buf, len, "full fine-tuning");
    else
        snprintf(buf, len, "%s r %d on %s", t->method == ZO_PLAN_QLORA ? "QLoRA" : "LoRA", t->lora.r,
                 zo_lora_targets_str(t->lora.targets, tg, sizeof tg));
    return buf;
}

void plan_describe_diff(const plan_candidate *best, const plan_candidate *c, char *buf, size_t len)
{
    char mw[2][96];
    sbuf b = {buf, len, 0};
    buf[0] = '\0';
    const plan_train *x = &best->t, *y = &c->t;
    const char *sep = "";
#define DIFF(cond, ...)               \
    do {                              \
        if (cond) {                   \
            put(&b, "%s", sep);       \
            put(&b, __VA_ARGS__);     \
            sep = "; ";               \
        }                             \
    } while (0)
    DIFF(y->method != x->method, "%s instead of %s", plan_method_words(y, mw[0], sizeof mw[0]),
         plan_method_words(x, mw[1], sizeof mw[1]));
    DIFF(c->gpus != best->gpus, "%d GPUs instead of %d", c->gpus, best->gpus);
    DIFF(y->dp != x->dp, "DP %d instead of %d", y->dp, x->dp);
    DIFF(y->tp != x->tp, "TP %d instead of %d", y->tp, x->tp);
    DIFF(y->pp != x->pp, "PP %d instead of %d", y->pp, x->pp);
    DIFF(y->ep != x->ep, "EP %d instead of %d", y->ep, x->ep);
    DIFF(y->vpp != x->vpp, "%d model chunks per stage instead of %d", y->vpp, x->vpp);
    DIFF(y->sp != x->sp, "%s sequence parallelism", y->sp ? "with" : "without");
    DIFF(y->zero != x->zero, "ZeRO-%d instead of ZeRO-%d", y->zero, x->zero);
    DIFF(y->micro_batch != x->micro_batch, "micro-batch %d x %d instead of %d x %d",
         y->micro_batch, y->grad_accum, x->micro_batch, x->grad_accum);
    char ry[48], rx[48];
    plan_recompute_words(y, ry, sizeof ry);
    plan_recompute_words(x, rx, sizeof rx);
    DIFF(strcmp(ry, rx), "recompute %s instead of %s", ry, rx);
    DIFF(y->params_on != x->params_on, "weights on %s instead of %s", tier_words(y->params_on),
         tier_words(x->params_on));
    DIFF(y->grads_on != x->grads_on, "gradients on %s instead of %s", tier_words(y->grads_on),
         tier_words(x->grads_on));
    if (memcmp(y->opt_frac, x->opt_frac, sizeof x->opt_frac)) {
        char a[48], o[48];
        describe_opt(y->opt_frac, a, sizeof a);
        describe_opt(x->opt_frac, o, sizeof o);
        DIFF(1, "optimizer on %s instead of %s", a, o);
    }
    DIFF(y->checkpoints_on != x->checkpoints_on, "checkpoints on %s instead of %s",
         tier_words(y->checkpoints_on), tier_words(x->checkpoints_on));
    DIFF(y->adapters_on != x->adapters_on, "adapters on %s instead of %s", tier_words(y->adapters_on),
         tier_words(x->adapters_on));
    DIFF(y->opt_state != x->opt_state, "%s m, v instead of %s", zo_plan_opt_state_name(y->opt_state),
         zo_plan_opt_state_name(x->opt_state));
    DIFF(y->schedule != x->schedule, "optimizer schedule %s instead of %s",
         zo_plan_schedule_name(y->schedule), zo_plan_schedule_name(x->schedule));
    int streamed = y->params_on != ZO_PLAN_GPU || y->zero >= 3 || x->params_on != ZO_PLAN_GPU || x->zero >= 3 ||
                   y->adapters_on != ZO_PLAN_GPU || x->adapters_on != ZO_PLAN_GPU;
    DIFF(streamed && y->buf.prefetch_depth != x->buf.prefetch_depth, "prefetch %d instead of %d",
         y->buf.prefetch_depth, x->buf.prefetch_depth);
#undef DIFF
    double d = c->time.step / best->time.step - 1;
    put(&b, "%s%.1f%% %s step", sep, fabs(d) * 100, d >= 0 ? "slower" : "faster");
    double gb = ((double)c->total[ZO_PLAN_GPU] - (double)best->total[ZO_PLAN_GPU]) / (1 << 30);
    put(&b, ", %+.1f GiB GPU", gb);
}

static double gib(uint64_t v) { return (double)v / (1 << 30); }

/* Try `t` with one change: 1 fits, 0 does not, -1 the change is no plan
 * (the estimate refuses the combination: *e is then not its estimate);
 * *step its step time. */
static int try_change(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                      plan_estimate *e, double *step)
{
    plan_train u = *t;
    /* a change that puts optimizer state on the GPU takes the delayed
     * update's place with the overlapped schedule (dpu cannot wait on it) */
    if (u.schedule == ZO_PLAN_SCHED_DPU && u.opt_frac[ZO_PLAN_GPU] > 0) u.schedule = ZO_PLAN_SCHED_OVERLAP;
    if (plan_estimate_run(m, hw, &u, e)) return -1;
    plan_time pt;
    if (plan_time_run(m, hw, &u, e, &pt)) return -1;
    *step = pt.step;
    return e->fits;
}

/* Why `what` in plan c, from the plan with it changed back (its estimate
 * e, whether that fits, its step). */
static void because(sbuf *b, const char *what, const plan_estimate *e, int fits, double step,
                    const plan_candidate *c, zo_plan_tier tier)
{
    static const char *names[] = {"GPU", "CPU", "NVMe"};
    double best_step = c->time.step;
    if (fits < 0) return; /* no plan to compare with */
    if (!fits) {
        /* the tier the change fills, else the one that overflows (moving
         * the weights off the CPU can overflow the GPU) */
        if (e->total[tier] <= e->capacity[tier])
            for (int k = 0; k < ZO_PLAN_TIERS; k++)
                if (e->total[k] > e->capacity[k]) {
                    tier = (zo_plan_tier)k;
                    break;
                }
        put(b, "%s because there the %s would need %.1f GiB of its %.1f GiB per rank\n", what,
            names[tier], gib(e->total[tier]), gib(e->capacity[tier]));
    } else if (step > best_step * (1 + SCORE_TIE)) {
        put(b, "%s because it is faster (%.3f s per step against %.3f s)\n", what, best_step,
            step);
    } else if (step >= best_step * (1 - SCORE_TIE) && e->total[ZO_PLAN_GPU] > c->total[ZO_PLAN_GPU]) {
        /* (the search's tie: the same step, the GPU's headroom kept) */
        put(b, "%s for the GPU's headroom (the same %.3f s per step with %.1f GiB on the GPU, not %.1f)\n", what,
            best_step, gib(c->total[ZO_PLAN_GPU]), gib(e->total[ZO_PLAN_GPU]));
    } else {
        /* (a flag kept the faster one out: --optimizer-min, --zero, ...) */
        put(b, "%s as the flags ask (%.3f s per step; %.3f s without)\n", what, best_step, step);
    }
}

/* The optimizer schedule against the others on the same configuration. */
static void explain_schedule(sbuf *b, const plan_candidate *c)
{
    if (c->time.sched.cpu_n <= 0) return;
    double step[ZO_PLAN_SCHEDULES];
    for (int s = 0; s < ZO_PLAN_SCHEDULES; s++) {
        plan_time x = c->time;
        plan_time_schedule(&x, (zo_plan_schedule)s);
        step[s] = x.step;
    }
    const plan_time *pt = &c->time;
    int dpu = c->t.opt_frac[ZO_PLAN_GPU] <= 0; /* (not with a GPU share) */
    if (pt->schedule == ZO_PLAN_SCHED_SERIAL) {
        put(b, "optimizer schedule serial (%.3f s per step): overlapped %.3f s (%s clipping)", pt->step,
            step[ZO_PLAN_SCHED_OVERLAP], c->t.clip_stale ? "stale" : "exact");
        if (dpu) put(b, ", with the delayed update %.3f s", step[ZO_PLAN_SCHED_DPU]);
        else put(b, " (no delayed update with optimizer state on the GPU)");
        put(b, "; another is taken for at least %.0f%% less\n", 100 * SCHED_MIN_GAIN);
        return;
    }
    put(b, "optimizer schedule %s: %.3f s per step against %.3f s serial", zo_plan_schedule_name(pt->schedule),
        pt->step, step[ZO_PLAN_SCHED_SERIAL]);
    if (pt->schedule != ZO_PLAN_SCHED_OVERLAP)
        put(b, ", %.3f s overlapped (%s clipping)", step[ZO_PLAN_SCHED_OVERLAP],
            c->t.clip_stale ? "stale" : "exact");
    if (pt->schedule != ZO_PLAN_SCHED_DPU && dpu) put(b, ", %.3f s with the delayed update", step[ZO_PLAN_SCHED_DPU]);
    put(b, "; %.3f s of the CPU optimizer's %.3f s run beside the GPU's work", pt->opt_hidden,
        pt->opt_s);
    if (pt->schedule == ZO_PLAN_SCHED_DPU)
        put(b, "; after %d serial steps each step computes with the weights before the previous "
               "step's update (--schedule overlap keeps the serial results bit for bit)",
            c->t.dpu_warmup);
    else if (pt->schedule == ZO_PLAN_SCHED_OVERLAP && !c->t.clip_stale)
        put(b, "; exact clipping: the updates wait for the whole backward's norm (--clip-stale "
               "lets them start as each block's gradients are complete)");
    put(b, "\n");
}

void plan_explain(const zo_model_config *m, const plan_hw *hw, const plan_candidate *c, char *buf,
                  size_t len)
{
    sbuf b = {buf, len, 0};
    buf[0] = '\0';
    plan_hw h = *hw;
    h.gpus = c->gpus;
    const plan_train *t = &c->t;
    plan_estimate e;
    double step = 0;
    char what[160];
    int rpn = plan_hw_ranks_per_node(&h);

    if (t->opt_frac[ZO_PLAN_GPU] < 1) {
        plan_train u = *t;
        if (t->opt_frac[ZO_PLAN_NVME] > 0) {
            /* could the NVMe share live in CPU memory? */
            u.opt_frac[ZO_PLAN_CPU] = t->opt_frac[ZO_PLAN_CPU] + t->opt_frac[ZO_PLAN_NVME];
            u.opt_frac[ZO_PLAN_NVME] = 0;
            int fits = try_change(m, &h, &u, &e, &step);
            char o[48];
            describe_opt(t->opt_frac, o, sizeof o);
            if (fits == 0)
                put(&b, "optimizer on %s because CPU memory is %.0f GiB per node (%.1f GiB per "
                        "rank) and all of it in CPU memory would need %.1f GiB per rank\n",
                    o, gib(h.cpu_mem), gib(h.cpu_mem) / rpn, gib(e.total[ZO_PLAN_CPU]));
            else
                because(&b, "optimizer partly on NVMe", &e, fits, step, c, ZO_PLAN_CPU);
        } else {
            u.opt_frac[ZO_PLAN_GPU] = 1;
            u.opt_frac[ZO_PLAN_CPU] = 0;
            u.grads_on = ZO_PLAN_GPU;
            /* (full fine-tuning: a GPU optimizer updates resident weights;
             * LoRA's adapters have their own placement) */
            if (t->method == ZO_PLAN_FULL) u.params_on = ZO_PLAN_GPU;
            int fits = try_change(m, &h, &u, &e, &step);
            if (t->opt_frac[ZO_PLAN_GPU] > 0)
                snprintf(what, sizeof what, "%.0f%% of the optimizer on the CPU", 100 * t->opt_frac[ZO_PLAN_CPU]);
            else
                snprintf(what, sizeof what, "optimizer on the CPU");
            because(&b, what, &e, fits, step, c, ZO_PLAN_GPU);
        }
    }
    if (t->params_on != ZO_PLAN_GPU) {
        plan_train u = *t;
        u.params_on = t->params_on == ZO_PLAN_NVME ? ZO_PLAN_CPU : ZO_PLAN_GPU;
        int fits = try_change(m, &h, &u, &e, &step);
        snprintf(what, sizeof what, "%s streamed from %s",
                 t->method == ZO_PLAN_FULL ? "weights" : "frozen base", tier_words(t->params_on));
        because(&b, what, &e, fits, step, c, t->params_on == ZO_PLAN_NVME ? ZO_PLAN_CPU : ZO_PLAN_GPU);
    }
    if (t->adapters_on != ZO_PLAN_GPU) {
        plan_train u = *t;
        u.adapters_on = ZO_PLAN_GPU;
        int fits = try_change(m, &h, &u, &e, &step);
        snprintf(what, sizeof what, "adapters streamed from %s", tier_words(t->adapters_on));
        because(&b, what, &e, fits, step, c, ZO_PLAN_GPU);
    }
    if (t->checkpoints_on == ZO_PLAN_CPU) {
        plan_train u = *t;
        u.checkpoints_on = ZO_PLAN_GPU;
        int fits = try_change(m, &h, &u, &e, &step);
        because(&b, "activation checkpoints in CPU memory", &e, fits, step, c, ZO_PLAN_GPU);
    }
    if (t->recompute != ZO_PLAN_RECOMPUTE_NONE) {
        plan_train u = *t;
        u.recompute = ZO_PLAN_RECOMPUTE_NONE;
        /* (checkpoints in CPU memory need every layer recomputed: without
         * recompute they stay on the GPU) */
        if (u.checkpoints_on == ZO_PLAN_CPU) u.checkpoints_on = ZO_PLAN_GPU;
        int fits = try_change(m, &h, &u, &e, &step);
        snprintf(what, sizeof what, "%s recompute", zo_plan_recompute_name(t->recompute));
        because(&b, what, &e, fits, step, c, ZO_PLAN_GPU);
    }
    if (t->recompute == ZO_PLAN_RECOMPUTE_FULL && !t->recompute_layers &&
        plan_estimate_run(m, &h, t, &e) == ZO_OK) {
        /* every layer where the fewest that fit take the same step (walk_partial's tie) */
        plan_train u = *t;
        int layers = e.layers;
        for (int k = 1; k < layers; k++) {
            u.recompute_layers = k;
            if (try_change(m, &h, &u, &e, &step) <= 0) continue;
            if (step <= c->time.step * (1 + SCORE_TIE) && e.total[ZO_PLAN_GPU] > c->total[ZO_PLAN_GPU])
                put(&b, "every layer recomputed for the GPU's headroom (the same %.3f s per step with %.1f GiB on "
                        "the GPU, not %.1f recomputing %d of %d)\n", c->time.step, gib(c->total[ZO_PLAN_GPU]),
                    gib(e.total[ZO_PLAN_GPU]), k, layers);
            break;
        }
        zo_clear_error();
    }
    if (t->zero > 0) {
        plan_train u = *t;
        u.zero = t->zero - 1;
        int fits = try_change(m, &h, &u, &e, &step);
        snprintf(what, sizeof what, "ZeRO-%d rather than ZeRO-%d", t->zero, t->zero - 1);
        because(&b, what, &e, fits, step, c, ZO_PLAN_GPU);
    }
    if (*plan_opt_accuracy_note(t)) {
        plan_train u = *t;
        u.opt_state = ZO_PLAN_STATE_FP32;
        u.master = ZO_PLAN_MASTER_FP32;
        int fits = try_change(m, &h, &u, &e, &step);
        snprintf(what, sizeof what, "optimizer state of %.4g B/param (fp32 master, m, v: %.4g)",
                 plan_opt_bytes_per_param(t), plan_opt_bytes_per_param(&u));
        zo_plan_tier over = ZO_PLAN_GPU;
        for (int i = ZO_PLAN_TIERS - 1; i >= 0; i--)
            if (e.total[i] > e.capacity[i]) over = (zo_plan_tier)i;
        because(&b, what, &e, fits, step, c, over);
        put(&b, "accuracy of that state: %s\n", plan_opt_accuracy_note(t));
    }
    explain_schedule(&b, c);
    if (!b.used) put(&b, "everything on the GPU: it fits there\n");
}

/* ---- max-model ------------------------------------------------------------------- */

static const char *strategy_names[PLAN_STRATEGIES] = {
    "data-parallel", "zero-1", "zero-2", "zero-3", "3d-parallel", "zero-offload",
    "zero-infinity-cpu", "zero-infinity-nvme",
};

const char *plan_strategy_name(plan_strategy s)
{
    return s < PLAN_STRATEGIES ? strategy_names[s] : "?";
}

static int in_family(const char *want, const zo_model_config *c)
{
    if (!strcasecmp(want, c->family)) return 1;
    if (!strcasecmp(want, "gpt"))
        return !strcmp(c->family, "gpt3") || !strcmp(c->family, "megatron");
    if (!strcasecmp(want, "llama")) return !strcmp(c->family, "llama2");
    return 0;
}

zo_status plan_family_shape(const char *family, double params, zo_model_config *out)
{
    return plan_family_shape_div(family, params, 1, 1, out);
}

/* The family's curve at `params`: continuous width and depth, and the
 * preset whose kind of layer (and kv heads, MLP ratio) the shape takes. */
static zo_status family_point(const char *family, double params, const zo_model_config **tmpl,
                              double *hidden, double *layers)
{
    size_t n;
    const zo_model_preset *p = zo_model_presets(&n);
    const zo_model_config *lo = NULL, *hi = NULL, *small = NULL, *large = NULL;
    double plo = 0, phi = INFINITY, psmall = INFINITY, plarge = 0;
    for (size_t i = 0; i < n; i++) {
        const zo_model_config *c = &p[i].cfg;
        if (!in_family(family, c)) continue;
        double pc = (double)zo_model_params(c);
        if (pc <= params && pc > plo) plo = pc, lo = c;
        if (pc >= params && pc < phi) phi = pc, hi = c;
        if (pc < psmall) psmall = pc, small = c;
        if (pc > plarge) plarge = pc, large = c;
    }
    if (!small)
        return zo_error(ZO_ERR_NOT_FOUND,
                        "--family '%s': no presets of that family (gpt, llama, gpt3, megatron, "
                        "llama2, llama3)", family);
    const zo_model_config *a, *bm;
    double x;
    if (!lo) { /* below the smallest: its aspect, scaled */
        a = bm = small;
        x = cbrt(params / psmall);
    } else if (!hi) {
        a = bm = large;
        x = cbrt(params / plarge);
    } else {
        a = lo;
        bm = hi;
        x = 1;
    }
    if (a == bm) {
        *hidden = a->hidden * x;
        *layers = a->n_layers * x;
    } else {
        double pa = (double)zo_model_params(a), pb = (double)zo_model_params(bm);
        double f = pb > pa ? (log(params) - log(pa)) / (log(pb) - log(pa)) : 0;
        *hidden = exp(log(a->hidden) + f * (log(bm->hidden) - log(a->hidden)));
        *layers = exp(log(a->n_layers) + f * (log(bm->n_layers) - log(a->n_layers)));
    }
    *tmpl = a;
    return ZO_OK;
}

/* A shape of the family's kind of layer with this width and depth. */
static zo_status family_make(const char *family, const zo_model_config *a, int h, int layers,
                             zo_model_config *out)
{
    *out = *a;
    out->hidden = h;
    out->n_heads = h / 128;
    out->head_dim = 128;
    out->n_layers = layers;
    if (a->n_kv_heads == a->n_heads || out->n_heads % 8) out->n_kv_heads = out->n_heads;
    else out->n_kv_heads = 8;
    if (a->arch == ZO_ARCH_GPT) out->ffn = 4 * h;
    else out->ffn = (int)((llround((double)a->ffn / a->hidden * h) + 255) / 256 * 256);
    out->params_override = 0;
    snprintf(out->name, sizeof out->name, "%s-%dx%d", family, out->n_layers, h);
    return zo_model_config_validate(out);
}

zo_status plan_family_shape_div(const char *family, double params, int tp, int pp,
                                zo_model_config *out)
{
    const zo_model_config *a;
    double hidden, layers;
    zo_status st = family_point(family, params, &a, &hidden, &layers);
    if (st) return st;
    /* heads of 128, a multiple of tp of them; layers a multiple of pp */
    int unit = 128 * (tp > 0 ? tp : 1), lp = pp > 0 ? pp : 1;
    int h = (int)llround(hidden / unit) * unit;
    if (h < unit) h = unit;
    int l = (int)llround(layers / lp) * lp;
    return family_make(family, a, h, l < lp ? lp : l, out);
}

/* The family's depth at a width (its curve is monotone in both). */
static zo_status family_depth(const char *family, double width, const zo_model_config **tmpl,
                              double *layers)
{
    double lo = 1e6, hi = 1e16, hidden = 0;
    zo_status st = ZO_OK;
    for (int it = 0; it < 80 && hi / lo > 1.0001; it++) {
        double mid = sqrt(lo * hi);
        if ((st = family_point(family, mid, tmpl, &hidden, layers)) != ZO_OK) return st;
        if (hidden < width) lo = mid;
        else hi = mid;
    }
    return family_point(family, hi, tmpl, &hidden, layers);
}

static void strategy_space(plan_strategy st, plan_space *s)
{
    s->max_micro_batch = 1;
    s->global_batch = s->gpus;
    s->max_vpp = 1;
    s->opt_steps = 1;
    s->tp = s->pp = 1;
    s->allow_offload = 0;
    s->allow_nvme = 0;
    s->params_on = s->opt_on = -1;
    switch (st) {
    case PLAN_STRAT_DP: s->zero_min = s->zero_max = 0; break;
    case PLAN_STRAT_ZERO1: s->zero_min = s->zero_max = 1; break;
    case PLAN_STRAT_ZERO2: s->zero_min = s->zero_max = 2; break;
    case PLAN_STRAT_ZERO3: s->zero_min = s->zero_max = 3; break;
    case PLAN_STRAT_3D:
        s->zero_min = 0;
        s->zero_max = 1;
        s->tp = s->pp = 0;
        break;
    case PLAN_STRAT_OFFLOAD:
        s->zero_min = s->zero_max = 2;
        s->allow_offload = 1;
        s->params_on = ZO_PLAN_GPU;
        s->opt_on = ZO_PLAN_CPU;
        break;
    case PLAN_STRAT_INF_CPU:
        s->zero_min = s->zero_max = 3;
        s->allow_offload = 1;
        s->params_on = ZO_PLAN_CPU;
        s->opt_on = ZO_PLAN_CPU;
        break;
    default:
        s->zero_min = s->zero_max = 3;
        s->allow_offload = 1;
        s->allow_nvme = 1;
        s->params_on = ZO_PLAN_NVME;
        s->opt_on = ZO_PLAN_NVME;
        break;
    }
}

/* Does `m` train with `strategy` on TP x PP (tp, pp 0: free)? The best plan. */
static zo_status shape_fits(zo_model_config *m, const plan_hw *hw, const plan_space *base,
                            plan_strategy strategy, int tp, int pp, plan_candidate *plan,
                            int *fits)
{
    plan_space s = *base;
    s.gpus = hw->gpus;
    s.max_gpus = 0;
    strategy_space(strategy, &s);
    if (tp) s.tp = tp;
    if (pp) s.pp = pp;
    s.base.seq = base->base.seq > 0 ? base->base.seq : plan_default_seq(m);
    if (m->arch == ZO_ARCH_GPT && s.base.seq > m->max_seq) m->max_seq = s.base.seq;
    s.base.dropout = m->arch == ZO_ARCH_GPT;
    *fits = 0;
    /* a layout the shape cannot take (kv heads TP does not divide): no */
    if (tp && m->n_kv_heads % tp) return ZO_OK;
    plan_result r;
    zo_status st = plan_search(m, hw, &s, 1, &r);
    if (st) return st;
    if (r.n_best) *plan = r.best[0];
    *fits = r.n_best > 0;
    return ZO_OK;
}

/* One strategy without model parallelism: a binary search along the
 * family's curve (a larger size is wider and deeper, and needs more memory
 * per rank). */
static zo_status max_on_curve(const char *family, const plan_hw *hw, const plan_space *base,
                              plan_strategy strategy, zo_model_config *shape,
                              plan_candidate *plan, uint64_t *params)
{
    double lo = 1e7, hi = 1e15; /* lo fits (checked first), hi does not */
    for (int it = 0; it < 48 && hi / lo > 1.005; it++) {
        double mid = it == 0 ? lo : sqrt(lo * hi);
        zo_model_config m;
        plan_candidate c;
        int fits;
        zo_status st = plan_family_shape(family, mid, &m);
        if (!st) st = shape_fits(&m, hw, base, strategy, 0, 0, &c, &fits);
        if (st) return st;
        if (fits) {
            lo = mid;
            *shape = m;
            *plan = c;
            *params = zo_model_params(&m);
        } else {
            if (it == 0) break; /* even the smallest does not fit */
            hi = mid;
        }
    }
    return ZO_OK;
}

/* 3-D parallelism: TP must divide the heads and PP the layers, so along the
 * family's curve sizes that fit alternate with sizes that do not. Every TP x
 * PP layout is searched on the shapes it can run: each width with heads a
 * multiple of TP, and at that width the deepest multiple of PP layers that
 * fits (memory grows with depth), up to twice the family's depth there. */
static zo_status max_3d(const char *family, const plan_hw *hw, const plan_space *base,
                        zo_model_config *shape, plan_candidate *plan, uint64_t *params)
{
    int node = hw->gpus_per_node < hw->gpus ? hw->gpus_per_node : hw->gpus;
    for (int tp = 1; tp <= node; tp++) {
        if (hw->gpus % tp) continue;
        for (int pp = 1; pp <= hw->gpus / tp; pp++) {
            if ((hw->gpus / tp) % pp) continue;
            for (int h = 128 * tp;; h += 128 * tp) {
                const zo_model_config *a;
                double depth;
                zo_status st = family_depth(family, h, &a, &depth);
                if (st) return st;
                int top = (int)(2 * depth) / pp; /* in pipeline stages of layers */
                if (top < 1) top = 1;
                int lo = 0, hi = top + 1; /* stages: lo fits (0: none yet), hi does not */
                plan_candidate best;
                zo_model_config m, fit;
                while (hi - lo > 1) {
                    int mid = (lo + hi) / 2, fits;
                    if ((st = family_make(family, a, h, mid * pp, &m)) != ZO_OK) return st;
                    plan_candidate c;
                    if ((st = shape_fits(&m, hw, base, PLAN_STRAT_3D, tp, pp, &c, &fits)) != ZO_OK)
                        return st;
                    if (fits) {
                        lo = mid;
                        fit = m;
                        best = c;
                    } else {
                        hi = mid;
                    }
                }
                /* not even one stage of layers fits: wider ones will not either */
                if (!lo) break;
                uint64_t n = zo_model_params(&fit);
                if (n > *params) {
                    *params = n;
                    *shape = fit;
                    *plan = best;
                }
            }
        }
    }
    return ZO_OK;
}

zo_status plan_max_model(const char *family, const plan_hw *hw, const plan_space *base,
                         plan_strategy strategy, zo_model_config *shape, plan_candidate *plan,
                         uint64_t *params)
{
    *params = 0;
    if (strategy >= PLAN_STRATEGIES) return zo_error(ZO_ERR_INVALID, "unknown strategy");
    if (strategy == PLAN_STRAT_3D) return max_3d(family, hw, base, shape, plan, params);
    return max_on_curve(family, hw, base, strategy, shape, plan, params);
}
