/* The run (run.h): its inputs, the device, ranks, model and runtime, the
 * steps, evaluation, checkpoints, the stop signals and the end. */
#include "examples/train/run.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/capability.h"       /* defines: zo_capability_check */
#include "common/clock.h"            /* defines: zo_now */
#include "common/units.h"            /* defines: zo_format_bytes, zo_format_count */
#include "examples/train/inputs.h"   /* defines: inputs_load_config, inputs_open_data, ... */
#include "examples/train/report.h"   /* defines: report_lora, report_placement, ... */
#include "examples/train/weights.h"  /* defines: weights_load, weights_save, weights_write */
#include "gpu/ops_cpu.h"             /* defines: gpu_cpu_inject_faults */

/* ---- signals and test seams -------------------------------------------------------- */

static volatile sig_atomic_t stop_signal; /* SIGINT, SIGTERM or SIGHUP came */
static int stop_wake_fd = -1;              /* the pause seam's pipe, write end (-1: no seam) */
static int stop_wake_read = -1;            /* and read end */

/* Any thread may take a process-directed signal: the handler also writes a
 * byte to the pause seam's pipe, so a thread waiting there wakes whichever
 * thread ran the handler. */
static void on_stop_signal(int sig)
{
    int saved = errno;
    stop_signal = sig;
    if (stop_wake_fd >= 0 && write(stop_wake_fd, "s", 1) < 0) {
        /* the pipe is full: a byte is already waiting */
    }
    errno = saved;
}

/* SIGINT, SIGTERM and SIGHUP end the run at the next micro-batch, through
 * the normal exit path (swap files removed, locks released). */
static void catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART; /* I/O in flight completes */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

zo_status run_stopped(void)
{
    if (!stop_signal) return ZO_OK;
    return zo_error(ZO_ERR_INTERNAL, "stopped by signal %d (%s)", (int)stop_signal, strsignal(stop_signal));
}

/* Test seam: ZO_TRAIN_CKPT_PAUSE="POINT:N:FD" makes the N-th checkpoint
 * write, at hook POINT ("begin", "optimizer-half", "before-rename",
 * "before-latest"), write one byte to FD and wait there for a signal (a test
 * kills the process mid-write, or stops it with SIGTERM: the write goes on
 * then, and the run ends as a stopped run does). The wait reads the stop
 * handler's pipe: sigsuspend would wait forever when the signal went to
 * another thread (the optimizer's, an I/O or OpenMP thread) between the
 * check of stop_signal and the suspend. */
static void pause_at(const char *spec, const char *point)
{
    static int saves;
    if (!strcmp(point, "begin")) saves++;
    char want[64];
    int nth = 0, fd = -1;
    if (sscanf(spec, "%63[^:]:%d:%d", want, &nth, &fd) != 3 || strcmp(want, point) || nth != saves)
        return;
    if (write(fd, "k", 1) != 1) return;
    char c;
    while (!stop_signal)
        if (read(stop_wake_read, &c, 1) < 0 && errno != EINTR) break;
}

static void ckpt_hook(void *user, const char *point)
{
    train_run *r = user;
    if (r->pause_spec) pause_at(r->pause_spec, point);
    /* test seam: ZO_TRAIN_CKPT_FSIZE="RANK:BYTES": from its first save on,
     * rank RANK writes no file past BYTES (RLIMIT_FSIZE, SIGXFSZ ignored: a
     * write past it fails with EFBIG, "File too large", as on a file system
     * that takes no more) */
    if (r->fsize_rank == r->rank && !strcmp(point, "begin")) {
        struct rlimit lim = {.rlim_cur = (rlim_t)r->fsize_bytes, .rlim_max = (rlim_t)r->fsize_bytes};
        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &lim);
    }
    /* test seam: ZO_TRAIN_CKPT_DEVFAIL="RANK:POINT": at a save's POINT
     * (offload_save_streamed's hook), the next copy on rank RANK's CPU
     * device fails, as a failing GPU's would (gpu_cpu_inject_faults) */
    if (r->devfail_rank == r->rank && !strcmp(point, r->devfail_point)) {
        gpu_cpu_faults f = {.copy_fail = 1};
        if (gpu_cpu_inject_faults(r->dev, &f) != ZO_OK) /* (a CUDA device takes none: said, not silent) */
            fprintf(stderr, "train: ZO_TRAIN_CKPT_DEVFAIL: %s\n", zo_last_error());
        r->devfail_rank = -1; /* once */
    }
}

zo_status run_init(train_run *r, train_args *a)
{
    *r = (train_run){.a = a, .phase = RUN_INPUT, .eot = -1, .tokens = {.fd = -1}, .eval = {.fd = -1},
                     .ranks = 1, .accum = 1, .kill_rank = -1, .kill_step = -1, .fsize_rank = -1,
                     .devfail_rank = -1, .t_begin = zo_now()};
    catch_stop_signals();
    const char *kill_spec = getenv("ZO_TRAIN_KILL"); /* kills rank RANK in step STEP */
    if (kill_spec && sscanf(kill_spec, "%ld:%ld", &r->kill_rank, &r->kill_step) != 2)
        return zo_error(ZO_ERR_INVALID, "ZO_TRAIN_KILL=%s is not RANK:STEP", kill_spec);
    const char *fsize_spec = getenv("ZO_TRAIN_CKPT_FSIZE");
    if (fsize_spec && (sscanf(fsize_spec, "%ld:%ld", &r->fsize_rank, &r->fsize_bytes) != 2 || r->fsize_bytes < 0))
        return zo_error(ZO_ERR_INVALID, "ZO_TRAIN_CKPT_FSIZE=%s is not RANK:BYTES", fsize_spec);
    const char *devfail_spec = getenv("ZO_TRAIN_CKPT_DEVFAIL");
    if (devfail_spec && sscanf(devfail_spec, "%ld:%31s", &r->devfail_rank, r->devfail_point) != 2)
        return zo_error(ZO_ERR_INVALID, "ZO_TRAIN_CKPT_DEVFAIL=%s is not RANK:POINT", devfail_spec);
    r->pause_spec = getenv("ZO_TRAIN_CKPT_PAUSE");
    if (r->pause_spec) {
        int p[2]; /* the handler's end never blocks */
        if (pipe2(p, O_CLOEXEC) || fcntl(p[1], F_SETFL, O_NONBLOCK))
            return zo_error(ZO_ERR_IO, "ZO_TRAIN_CKPT_PAUSE: pipe: %s", strerror(errno));
        stop_wake_read = p[0];
        stop_wake_fd = p[1];
    }
    if (r->pause_spec || fsize_spec || devfail_spec) {
        a->p.cfg.ckpt_hook = ckpt_hook;
        a->p.cfg.ckpt_hook_user = r;
    }
    return ZO_OK;
}

/* ---- exit status ----------------------------------------------------------------------- */

/* memplan's convention: 2 bad input, 1 failed at run time. */
static int exit_code(zo_status st, run_phase phase)
{
    return zo_exit_status(st, phase == RUN_INPUT, phase == RUN_TRAIN);
}

int run_finish(train_run *r, zo_status st)
{
    offload_free(r->rt); /* the optimizer's thread joined: nothing else enqueues */
    gpu_profile_free(r->prof);
    tf_offload_model_free(&r->tm);
    tf_free(&r->m);
    if (st != ZO_OK && r->ranks > 1) {
        /* the others would wait for this rank in a collective until their
         * timeout: end the job now, saying why, with the exit status one
         * rank would have */
        char msg[1200];
        snprintf(msg, sizeof msg, "train: rank %d of %d: %s", r->rank, r->ranks, zo_last_error());
        comm_abort(r->comm, exit_code(st, r->phase), msg);
    }
    comm_free(r->expert_comm); /* the groups, then the world they were split from */
    comm_free(r->ep_comm);
    comm_free(r->comm);
    if (r->s) gpu_stream_destroy(r->s);
    gpu_device_free(r->dev);
    model_tokens_close(&r->tokens);
    model_tokens_close(&r->eval);
    model_tokenizer_free(r->tok);
    free(r->inputs);
    free(r->targets);
    free(r->sums);
    if (st == ZO_OK) return 0;
    if (!r->quiet) fprintf(stderr, "train: %s\n", zo_last_error());
    if (stop_signal) { /* cleaned up: end the way the signal would have */
        fflush(NULL);
        signal(stop_signal, SIG_DFL);
        raise(stop_signal);
    }
    return exit_code(st, r->phase);
}

/* ---- inputs and set-up ---------------------------------------------------------------- */

/* A plan made for another model or another number of ranks would run as
 * something it never planned. */
static zo_status check_plan_run(const train_args *a, const zo_model_config *cfg, int ranks)
{
    if (zo_plan_check_run(&a->p.file, cfg, ranks, a->plan) == ZO_OK) return ZO_OK;
    char why[1024];
    snprintf(why, sizeof why, "%s", zo_last_error());
    return zo_error(ZO_ERR_INVALID, "--plan %s", why);
}

/* Recompute of the first K layers: K within the model's layers, and
 * checkpoints on the GPU (a layer not recomputed keeps its activations
 * there; host checkpoints are every layer's input alone). */
static zo_status check_recompute_layers(const train_args *a, const zo_model_config *cfg)
{
    int k = a->p.cfg.recompute_layers;
    if (k > cfg->n_layers)
        return zo_error(ZO_ERR_INVALID, "--recompute-layers %d (training.recompute_layers): the model %s has %d "
                        "layers", k, cfg->name, cfg->n_layers);
    if (a->p.cfg.recompute == OFFLOAD_RECOMPUTE_OPS && cfg->moe.experts)
        return zo_error(ZO_ERR_INVALID, "--recompute ops (training.recompute): the model %s has experts; the "
                        "runtime recomputes by op in dense layers (recompute full or none)", cfg->name);
    if (k && k < cfg->n_layers && a->p.cfg.checkpoints_on == OFFLOAD_CPU)
        return zo_error(ZO_ERR_INVALID, "--recompute-layers %d with --checkpoints-on cpu: host checkpoints need "
                        "every layer recomputed (a layer not recomputed keeps its activations on the GPU)", k);
    return ZO_OK;
}

/* A capacity factor (--capacity-factor, parallel.capacity_factor) needs
 * routed experts (here too: --check-plan never runs tf_init). */
static zo_status check_capacity(const train_args *a, const zo_model_config *cfg)
{
    double f = a->p.file.parallel.capacity_factor;
    const char *why = zo_moe_check_capacity(cfg, f);
    if (why)
        return zo_error(ZO_ERR_INVALID, "--capacity-factor %g (parallel.capacity_factor): %s (%s)", f, why,
                        cfg->name);
    return ZO_OK;
}

/* The expert-parallel degree: --ep, or the plan's parallel.ep. */
static int run_ep(const train_args *a)
{
    if (a->ep) return a->ep;
    return a->plan && a->p.file.parallel.ep > 1 ? a->p.file.parallel.ep : 1;
}

/* Expert parallelism runs on N | ranks and N | experts (memplan's words). */
static zo_status check_ep(const train_args *a, const zo_model_config *cfg, int ranks)
{
    int ep = run_ep(a);
    if (ep <= 1) return ZO_OK;
    if (ranks % ep)
        return zo_error(ZO_ERR_INVALID, "--ep %d must divide the data-parallel degree (DP %d, the ranks): expert "
                        "parallelism shards the experts over data-parallel ranks", ep, ranks);
    if (cfg->moe.experts % ep)
        return zo_error(ZO_ERR_INVALID, "--ep %d does not divide the %d experts of %s", ep, cfg->moe.experts,
                        cfg->name);
    return ZO_OK;
}

/* What the run would be, as the capability table (common/capability.h)
 * sees it: the plan and the flags over it, on `ranks` ranks. */
static void run_shape(const train_args *a, int ranks, zo_run_shape *out)
{
    const offload_config *oc = &a->p.cfg;
    zo_run_shape_defaults(out);
    out->method = !a->lora.r ? ZO_PLAN_FULL : a->qlora ? ZO_PLAN_QLORA : ZO_PLAN_LORA;
    out->ranks = ranks;
    out->zero = oc->zero_stage;
    out->schedule = (zo_plan_schedule)oc->schedule;
    out->params = (zo_plan_tier)oc->params_on;
    out->adapters = (zo_plan_tier)oc->trainable_on;
    memcpy(out->optimizer, oc->opt_frac, sizeof out->optimizer);
    out->optim_dtype = oc->opt_state;
    out->master = a->p.file.training.master;
    out->loss_chunk = a->p.file.training.loss_chunk;
    if (a->tp) out->tp = a->tp;
    if (a->pp) out->pp = a->pp;
    out->ep = run_ep(a);
}

/* The runtime runs it, or the table's words (the same on every rank:
 * rank 0 says it, the others end quietly with the same status). */
static zo_status check_capability(train_run *r, int ranks)
{
    zo_run_shape shape;
    run_shape(r->a, ranks, &shape);
    shape.moe = r->cfg.moe.experts > 0;
    zo_status st = zo_capability_check(&shape, NULL, 0);
    if (st != ZO_OK) r->quiet = r->launch.rank > 0;
    return st;
}

static zo_status read_inputs(train_run *r)
{
    train_args *a = r->a;
    zo_status st;
    if ((st = inputs_load_config(a->model, &r->cfg)) != ZO_OK) return st;
    if ((st = check_recompute_layers(a, &r->cfg)) != ZO_OK || (st = check_capacity(a, &r->cfg)) != ZO_OK) return st;
    if ((st = comm_launch_detect(&r->launch)) != ZO_OK) return st;
    if (a->plan && (st = check_plan_run(a, &r->cfg, r->launch.size)) != ZO_OK) return st;
    if ((st = inputs_tokenizer(a, r->cfg.vocab, &r->tok, &r->eot)) != ZO_OK) return st;
    if ((st = inputs_open_data(a, a->data, r->tok, r->eot, r->cfg.vocab, &r->tokens)) != ZO_OK) return st;
    if (a->eval_data && (st = inputs_open_data(a, a->eval_data, r->tok, r->eot, r->cfg.vocab, &r->eval)) != ZO_OK)
        return st;
    if ((st = inputs_lora_choice(a, &r->cfg)) != ZO_OK) return st;
    int ranks = r->launch.size > 1 ? r->launch.size : 1;
    /* a merge reads the frozen base block by block on rank 0: whole there
     * unless ZeRO-3 partitions it over the ranks */
    if (a->merge && ranks > 1 && a->p.cfg.zero_stage == 3) {
        r->quiet = r->launch.rank > 0; /* rank 0 says it */
        return zo_error(ZO_ERR_UNSUPPORTED, "--merge %s: ZeRO-3 partitions the frozen base over the %d ranks; "
                        "train with ZeRO 0-2 to merge, or merge the saved adapters on one rank", a->merge, ranks);
    }
    if ((st = check_capability(r, ranks)) != ZO_OK) return st;
    if ((st = check_ep(a, &r->cfg, ranks)) != ZO_OK) r->quiet = r->launch.rank > 0; /* rank 0 says it */
    return st;
}

zo_status run_read_inputs(train_run *r)
{
    double t0 = zo_now();
    zo_status st = read_inputs(r);
    if (st != ZO_OK || r->launch.rank > 0) return st; /* (rank 0 speaks for the job) */
    char detail[160];
    int n = snprintf(detail, sizeof detail, "config, data %llu tokens", (unsigned long long)r->tokens.n);
    if (r->a->eval_data && n > 0 && (size_t)n < sizeof detail)
        snprintf(detail + n, sizeof detail - (size_t)n, ", eval data %llu tokens", (unsigned long long)r->eval.n);
    report_start_phase("inputs read", zo_now() - t0, detail);
    return ZO_OK;
}

/* --device NAME with --device-mem as the capacity: the CPU backend with its
 * thread count, or gpu_device_open's "cuda"/"cuda:N". A CUDA name gets a
 * message saying what is missing: the backend in this build, or a GPU. */
static zo_status open_device(const char *name, size_t capacity, int threads, gpu_device_t *out)
{
    if (!strcmp(name, "cpu")) {
        gpu_cpu_options o = {.capacity = capacity, .n_threads = threads};
        return gpu_device_init_cpu(&o, out);
    }
    zo_status st = gpu_device_open(name, capacity, out);
    if (st == ZO_ERR_UNSUPPORTED) /* the message names what is missing: CUDA in the build, the
                                   * backend's module, a library it needs or the driver */
        return zo_error_wrap(st, "--device %s (or use --device cpu)", name);
    if (st == ZO_ERR_NOT_FOUND && !gpu_cuda_device_count())
        return zo_error_wrap(st, "--device %s: no CUDA GPU found on this machine (use --device cpu)",
                             name);
    if (st != ZO_OK) return zo_error_wrap(st, "--device %s", name);
    return ZO_OK;
}

/* The device and the communicator: several ranks on "cuda" take one GPU
 * per rank of a node, by the launcher's local rank. */
static zo_status open_device_and_ranks(train_run *r)
{
    const train_args *a = r->a;
    char device[32];
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!local) local = getenv("MPI_LOCALRANKID"); /* MPICH's hydra */
    if (!local) local = getenv("SLURM_LOCALID");
    snprintf(device, sizeof device, "%s", a->device);
    if (r->launch.size > 1 && !strcmp(a->device, "cuda") && local) snprintf(device, sizeof device, "cuda:%s", local);
    zo_status st = open_device(device, (size_t)a->device_mem, (int)a->threads, &r->dev);
    if (st != ZO_OK) return st;
    /* the communicator: MPI or NCCL under a launcher, else one rank */
    comm_options co = {.device = r->dev, .timeout_s = a->comm_timeout};
    if ((st = comm_init(&co, &r->comm)) != ZO_OK) return st;
    r->rank = comm_rank(r->comm);
    r->ranks = comm_size(r->comm);
    /* expert parallelism: groups of ep consecutive ranks hold every expert
     * (rank r the experts of r % ep), and the ranks of one r % ep the same */
    r->ep = run_ep(a);
    if (r->ep > 1) {
        if ((st = comm_split(r->comm, r->rank / r->ep, r->rank, &r->ep_comm)) != ZO_OK ||
            (st = comm_split(r->comm, r->rank % r->ep, r->rank, &r->expert_comm)) != ZO_OK)
            return zo_error_wrap(st, "--ep %d: the expert-parallel groups", r->ep);
    }
    /* rank 0 speaks for the job; the others print only errors */
    if (r->rank > 0 && !freopen("/dev/null", "w", stdout))
        return zo_error(ZO_ERR_IO, "train: rank %d: /dev/null: %s", r->rank, strerror(errno));
    return ZO_OK;
}

/* --profile: attached to the device, its streams named; it times only
 * the steps run_step opens to it. */
static zo_status start_profile(train_run *r)
{
    zo_status st = gpu_profile_start(r->dev, &r->prof);
    if (st != ZO_OK) return st;
    gpu_stream_t h2d, d2h;
    offload_copy_streams(r->rt, &h2d, &d2h);
    gpu_profile_name_stream(r->prof, r->s, "compute");
    gpu_profile_name_stream(r->prof, h2d, "h2d");
    gpu_profile_name_stream(r->prof, d2h, "d2h");
    return ZO_OK;
}

zo_status run_setup(train_run *r)
{
    train_args *a = r->a;
    offload_config *oc = &a->p.cfg;
    r->phase = RUN_SETUP;
    double t0 = zo_now();
    zo_status st = open_device_and_ranks(r);
    if (st != ZO_OK) return st;
    char what[96], detail[96], b[32];
    snprintf(what, sizeof what, "device %s opened%s", gpu_device_name(r->dev),
             r->ranks > 1 ? " and the ranks met" : "");
    report_start_phase(what, zo_now() - t0, NULL);
    t0 = zo_now();
    gpu_mem_stats m0, m1;
    gpu_mem_get_stats(r->dev, &m0);
    oc->comm = r->comm;
    oc->ep_comm = r->ep_comm;
    oc->expert_comm = r->expert_comm;
    if ((st = gpu_stream_create(r->dev, &r->s)) != ZO_OK) return st;
    tf_options to = {.recompute = oc->recompute, .recompute_layers = oc->recompute_layers, .external_res = 1,
                     .lora = {.r = a->lora.r, .alpha = a->lora.alpha, .targets = a->lora.targets, .nf4 = a->qlora},
                     .loss_chunk = a->p.file.training.loss_chunk, .ep = r->ep_comm,
                     .capacity_factor = a->p.file.parallel.capacity_factor};
    if ((st = tf_init_opts(&r->m, &r->cfg, r->dev, a->dtype, (int)a->micro_batch, (int)a->seq, &to)) != ZO_OK)
        return st;
    if (a->lora.r) report_lora(a, &r->m);
    if ((st = tf_offload_model_init(&r->tm, &r->m)) != ZO_OK) return st;
    gpu_mem_get_stats(r->dev, &m1);
    snprintf(detail, sizeof detail, "gpu %s (activations and work buffers)",
             zo_format_bytes(m1.in_use > m0.in_use ? m1.in_use - m0.in_use : 0, b, sizeof b));
    report_start_phase("model", zo_now() - t0, detail);
    oc->init_hook = report_init_part; /* "# start: runtime's ..." */
    if ((st = offload_init(&r->rt, r->dev, &r->tm.om, oc)) != ZO_OK) return st;
    if (a->profile && (st = start_profile(r)) != ZO_OK) return st;
    r->trained = a->lora.r ? &r->m.adapters : &r->m.layout;
    r->ckpt_weights = weights_ckpt_of(&r->m, a);
    r->accum = oc->grad_accum ? oc->grad_accum : 1;
    return ZO_OK;
}

/* The step a checkpoint's data position is at in this run's batches. Rows
 * (sequences) count it: step k takes rows [k G, (k + 1) G) of the data, G =
 * micro-batch x grad-accum x ranks, however they are split, so any split of
 * the checkpoint's global batch resumes at the same rows; another --seq
 * (other rows) or another global batch (other steps) is refused. A
 * version-3 checkpoint counted micro-batches and recorded no shape: read as
 * it was, on the word of --micro-batch and --seq. */
static zo_status resume_position(train_run *r, const offload_ckpt_meta *meta)
{
    const train_args *a = r->a;
    const offload_ckpt_batch *b = &meta->batch;
    int64_t global = (int64_t)a->micro_batch * r->accum * r->ranks;
    if (meta->state_version == 3) {
        if (meta->data_step % (r->accum * r->ranks))
            return zo_error(ZO_ERR_INVALID, "--resume %s: the checkpoint is %lld micro-batches into the data, not "
                            "a whole number of global batches of %d ranks x grad-accum %d", a->resume,
                            (long long)meta->data_step, r->ranks, r->accum);
        r->k0 = (long)(meta->data_step / (r->accum * r->ranks));
        printf("# %s: a version-3 state.json records no batch shape: its %lld micro-batches are taken to be of "
               "--micro-batch %ld --seq %ld, as this run's\n", a->resume, (long long)meta->data_step,
               a->micro_batch, a->seq);
        return ZO_OK;
    }
    if (!b->micro_batch)
        return zo_error(ZO_ERR_INVALID, "--resume %s: the checkpoint records no batch shape (not saved by "
                        "train): its data position cannot be placed", a->resume);
    int64_t saved = b->micro_batch * b->grad_accum * b->ranks;
    if (b->seq != a->seq)
        return zo_error(ZO_ERR_INVALID, "--resume %s: --seq %ld is not the checkpoint's --seq %lld (its data "
                        "position counts sequences of %lld tokens): resume with --seq %lld", a->resume, a->seq,
                        (long long)b->seq, (long long)b->seq, (long long)b->seq);
    if (global != saved)
        return zo_error(ZO_ERR_INVALID, "--resume %s: a global batch of %lld sequences (--micro-batch %ld x "
                        "--grad-accum %d x %d rank%s) is not the checkpoint's %lld (--micro-batch %lld x "
                        "--grad-accum %lld x %lld rank%s): resume with --micro-batch and --grad-accum whose "
                        "product with the ranks is %lld", a->resume, (long long)global, a->micro_batch, r->accum,
                        r->ranks, r->ranks > 1 ? "s" : "", (long long)saved, (long long)b->micro_batch,
                        (long long)b->grad_accum, (long long)b->ranks, b->ranks > 1 ? "s" : "", (long long)saved);
    if (meta->data_step % global)
        return zo_error(ZO_ERR_FORMAT, "--resume %s: the checkpoint is %lld sequences into the data, not a whole "
                        "number of its global batches of %lld", a->resume, (long long)meta->data_step,
                        (long long)global);
    r->k0 = (long)(meta->data_step / global);
    return ZO_OK;
}

zo_status run_load_weights(train_run *r)
{
    const train_args *a = r->a;
    r->phase = RUN_INPUT;
    double t0 = zo_now(), into_s;
    zo_status st = weights_load(r->rt, &r->m, a, &into_s);
    if (st != ZO_OK) return st;
    const model_layout *l = &r->m.layout;
    char what[1200], src[64], detail[128], n[32];
    snprintf(src, sizeof src, "random, --seed %lld", (long long)a->seed);
    snprintf(what, sizeof what, "initial weights %s (%s%s)", zo_format_count(l->total_numel, n, sizeof n),
             a->weights ? a->weights : src, a->lora.r ? "; the frozen base, then the adapters" : "");
    double dt = zo_now() - t0;
    snprintf(detail, sizeof detail, "%s %.2f s, into the runtime %.2f s", a->weights ? "read" : "drawn", dt - into_s,
             into_s);
    report_start_phase(what, dt, detail);
    if (a->resume) {
        t0 = zo_now();
        offload_ckpt_meta meta;
        if ((st = offload_load(r->rt, a->resume, &meta)) != ZO_OK || (st = weights_resume(&r->m, a)) != ZO_OK)
            return st;
        if ((st = resume_position(r, &meta)) != ZO_OK) return st;
        printf("# resumed from %s at step %ld\n", a->resume, r->k0);
        /* the run ends well with nothing trained (its --save still written) */
        if (r->k0 >= a->steps)
            printf("# nothing left to train: %s is at step %ld of --steps %ld\n", a->resume, r->k0, a->steps);
        report_start_phase("checkpoint read", zo_now() - t0, a->resume);
    }
    report_start_phase("ready", zo_now() - r->t_begin, NULL);
    return ZO_OK;
}

zo_status run_start(train_run *r)
{
    r->phase = RUN_TRAIN;
    zo_status st = run_stopped(); /* came while the data was read or the model set up */
    if (st != ZO_OK) return st;
    size_t n = (size_t)r->a->micro_batch * r->a->seq;
    r->inputs = malloc(n * sizeof *r->inputs);
    r->targets = malloc(n * sizeof *r->targets);
    r->sums = calloc((size_t)r->ranks, sizeof *r->sums);
    if (!r->inputs || !r->targets || !r->sums)
        return zo_error(ZO_ERR_NOMEM, "train: out of host memory for the batch");
    return ZO_OK;
}

/* ---- steps, evaluation, checkpoints ----------------------------------------------------- */

/* Batch `index` of `data` through the model: forward and backward
 * (`train`), or forward only; its mean loss. Data that holds what it should
 * not is bad input: the phase says so. */
static zo_status run_batch(train_run *r, const model_tokens *data, long index, int train, float *loss)
{
    int B = (int)r->a->micro_batch, T = (int)r->a->seq;
    zo_status st = model_batch_get(data, B, T, index, 0, MODEL_SAMPLE_SEQUENTIAL, r->inputs, r->targets);
    if (st != ZO_OK) {
        r->phase = RUN_INPUT;
        return st;
    }
    if ((st = tf_set_batch(&r->m, r->s, r->inputs, r->targets, B, T)) != ZO_OK) return st;
    st = train ? offload_micro_batch(r->rt, r->s) : offload_forward(r->rt, r->s);
    return st == ZO_OK ? tf_loss(&r->m, r->s, loss) : st;
}

/* The host's side of a profiled step: the CPU AdamW's time (every thread's)
 * as a row, and the host thread's time split (`dt` its wall time), from
 * the runtime's counters before (`o0`) and after the step. */
static void profile_host(train_run *r, const offload_stats *o0, double dt)
{
    offload_stats o1;
    offload_get_stats(r->rt, &o1);
    double adam = o1.optimizer_s - o0->optimizer_s, parts = 0;
    if (adam > 0) gpu_profile_add_host(r->prof, "adamw (cpu)", adam, 1);
    for (int p = 0; p < OFFLOAD_TIME_PARTS; p++) {
        double t = o1.time[p] - o0->time[p];
        gpu_profile_add_wait(r->prof, offload_time_part_name((offload_time_part)p), t);
        parts += t;
    }
    /* the rest of the step; 0 when the parts exceed it: with the optimizer
     * on NVMe the runtime adds a pipeline's time when it ends, which may
     * have begun in the step before */
    gpu_profile_add_wait(r->prof, "other", dt > parts ? dt - parts : 0.0);
}

zo_status run_step(train_run *r, long k, ft_record *rec, int *skipped)
{
    const train_args *a = r->a;
    /* --profile: the steps after the first, which pays for first touches */
    int profiled = r->prof && (k > r->k0 || a->steps - r->k0 == 1);
    offload_stats o0;
    if (profiled) {
        offload_get_stats(r->rt, &o0);
        gpu_profile_step_begin(r->prof);
    }
    double t0 = zo_now(), sum = 0, lr = ft_lr_at(&a->sched, k);
    uint64_t pairs0 = r->m.moe_pairs, dropped0 = r->m.moe_dropped;
    offload_set_lr(r->rt, (float)lr);
    zo_status st;
    for (int j = 0; j < r->accum; j++) {
        /* rank r's slice of the global batch of step k */
        float loss;
        if ((st = run_batch(r, &r->tokens, (k * r->ranks + r->rank) * r->accum + j, 1, &loss)) != ZO_OK)
            return r->phase == RUN_INPUT ? st : zo_error_wrap(st, "step %ld", k); /* the data names itself */
        sum += loss;
        if ((st = run_stopped()) != ZO_OK) return st;
    }
    /* test seam: ZO_TRAIN_KILL="RANK:STEP" kills that rank mid-step (steps
     * counted from 1, as the step lines) */
    if (r->kill_rank == r->rank && r->kill_step == k + 1) raise(SIGKILL);
    offload_step_info info;
    if ((st = offload_step(r->rt, &info)) != ZO_OK) return zo_error_wrap(st, "step %ld", k);
    /* the mean over the global batch: every rank's sum, in rank order;
     * the MoE pairs every rank's micro-batches routed and dropped */
    run_step_sums mine = {sum, (double)(r->m.moe_pairs - pairs0), (double)(r->m.moe_dropped - dropped0)};
    if ((st = offload_gather(r->rt, &mine, sizeof mine, r->sums)) != ZO_OK) return st;
    sum = 0;
    r->step_pairs = r->step_dropped = 0;
    for (int q = 0; q < r->ranks; q++) {
        sum += r->sums[q].loss;
        r->step_pairs += (uint64_t)r->sums[q].pairs;
        r->step_dropped += (uint64_t)r->sums[q].dropped;
    }
    r->moe_pairs += r->step_pairs;
    r->moe_dropped += r->step_dropped;
    double dt = zo_now() - t0;
    if (profiled) { /* the step's records resolved, outside its time */
        if ((st = gpu_profile_step_end(r->prof)) != ZO_OK) return zo_error_wrap(st, "--profile, step %ld", k);
        profile_host(r, &o0, dt);
    }
    int global = r->accum * r->ranks; /* micro-batches */
    /* steps are counted from 1, as the checkpoints are: "step N" is the
     * N-th step done, and a checkpoint after it is "step N" too */
    *rec = (ft_record){.step = k + 1, .loss = sum / global, .lr = lr, .grad_norm = info.grad_norm,
                       .tokens_per_s = (double)a->micro_batch * a->seq * global / dt};
    offload_stats ost;
    offload_get_stats(r->rt, &ost);
    for (int t = 0; t < FT_TIERS; t++) rec->peak[t] = ost.peak[t];
    *skipped = info.skipped;
    return ZO_OK;
}

zo_status run_evaluate(train_run *r, ft_record *rec, uint64_t *counted)
{
    double sum = 0;
    *counted = 0;
    /* the evaluation routes with the training's capacity factor: its pairs
     * dropped are counted apart from the steps' */
    uint64_t pairs0 = r->m.moe_pairs, dropped0 = r->m.moe_dropped;
    for (long j = 0; j < r->a->eval_batches; j++) {
        float l;
        zo_status st = run_batch(r, &r->eval, j, 0, &l);
        if (st != ZO_OK) return zo_error_wrap(st, "evaluation batch %ld", j);
        sum += (double)l * r->m.n_targets;
        *counted += (uint64_t)r->m.n_targets;
    }
    r->eval_pairs = r->m.moe_pairs - pairs0;
    r->eval_dropped = r->m.moe_dropped - dropped0;
    r->moe_eval_pairs += r->eval_pairs;
    r->moe_eval_dropped += r->eval_dropped;
    rec->has_eval = 1;
    rec->eval_loss = *counted ? sum / (double)*counted : NAN;
    rec->eval_ppl = exp(rec->eval_loss);
    return ZO_OK;
}

zo_status run_checkpoint(train_run *r, long steps)
{
    const train_args *a = r->a;
    offload_ckpt_meta meta = {.data_step = steps * a->micro_batch * r->accum * r->ranks, .seed = (uint64_t)a->seed,
                              .batch = {.micro_batch = a->micro_batch, .grad_accum = r->accum, .ranks = r->ranks,
                                        .seq = a->seq}};
    zo_status st = offload_save_streamed(r->rt, a->ckpt, &meta, weights_write, &r->ckpt_weights);
    if (st == ZO_OK) printf("# checkpoint %s step %ld\n", a->ckpt, steps);
    return st;
}

zo_status run_save(train_run *r)
{
    zo_status st = weights_save(r->rt, &r->m, r->a, r->rank, r->ep_comm);
    if (st == ZO_OK) printf("# saved %s\n", r->a->save);
    return st;
}

/* ---- --check-plan ---------------------------------------------------------------------- */

int run_check_plan(train_args *a)
{
    if (!a->plan || !a->model) {
        fprintf(stderr, "train: --check-plan needs --plan FILE%s\n", a->plan ? " and --model" : "");
        return 2;
    }
    zo_model_config cfg;
    zo_status st = inputs_load_config(a->model, &cfg);
    if (st == ZO_OK) st = check_plan_run(a, &cfg, 1);
    if (st == ZO_OK) st = check_recompute_layers(a, &cfg);
    if (st == ZO_OK) st = check_capacity(a, &cfg);
    if (st != ZO_OK) {
        fprintf(stderr, "train: %s\n", zo_last_error());
        return exit_code(st, RUN_INPUT);
    }
    const offload_config *oc = &a->p.cfg;
    printf("# check-plan: %s (%s), %llu parameters, %d layers, hidden %d, vocab %d; dtype %s; "
           "batch %ld x %ld x %d: the plan is for this model and one rank\n",
           cfg.name, zo_model_family_name(&cfg), (unsigned long long)zo_model_params(&cfg), cfg.n_layers,
           cfg.hidden, cfg.vocab, zo_dtype_name(a->dtype), a->micro_batch, a->seq,
           oc->grad_accum ? oc->grad_accum : 1);
    if (inputs_lora_choice(a, &cfg) != ZO_OK) {
        fprintf(stderr, "train: --plan %s: %s\n", a->plan, zo_last_error());
        return 2;
    }
    /* what the runtime runs, on the plan's ranks */
    zo_run_shape shape;
    run_shape(a, a->p.file.parallel.dp > 0 ? a->p.file.parallel.dp : 1, &shape);
    shape.moe = cfg.moe.experts > 0;
    if (zo_capability_check(&shape, NULL, 0) != ZO_OK) {
        fprintf(stderr, "train: --plan %s: %s\n", a->plan, zo_last_error());
        return 2;
    }
    report_placement(a);
    report_method(a);
    report_prediction(&a->p.predicted);
    return 0;
}
