/* memplan calibrate: measure this machine and write a hardware profile for
 * --hw FILE (docs/memplan.md, "memplan calibrate"). */
#include <stdio.h>

#include "common/units.h"
#include "planner/calibrate.h"
#include "planner/memplan_cli.h"
#include "planner/planfile.h" /* defines: plan_hw_json */

static const char usage_calibrate[] =
    "usage: memplan calibrate [--json | --json-out FILE] [--base PRESET] [--nvme-dir DIR] [--threads N]\n"
    "                         [--adam-params N] [--stream-bytes SIZE] [--seconds S] [--nvme-bytes SIZE]\n"
    "\n"
    "Measure this machine and write a hardware profile (JSON) that '--hw FILE' reads:\n"
    "CPU memory size and cores, memory bandwidth (a triad), CPU AdamW parameters/s\n"
    "(cpu_adam), and the free space and write/read rates of --nvme-dir (a file of\n"
    "--nvme-bytes, default 512MiB, through the nvme module's io_uring engine; the read\n"
    "again beside a triad on every thread: nvme_read_bw_busy, the rate of the CPU backend's\n"
    "reads while its cores compute, in memplan generate). What cannot\n"
    "be measured here (the GPU, PCIe) comes from --base (default h100-80gb; a machine or a\n"
    "GPU preset such as rtx-4090, 'memplan hardware'); the profile's\n"
    "\"note\" says which. --json (the default) prints it to stdout; --json-out FILE (or\n"
    "--out FILE) writes it to FILE. The triad's arrays (--stream-bytes each) and the AdamW\n"
    "state (--adam-params) are, unset or 0, four times the largest CPU cache: memory, not cache.\n";

static const struct option calibrate_opts[] = {
    {"out", required_argument, 0, OPT_JSON_OUT},
    {"json-out", required_argument, 0, OPT_JSON_OUT},
    {"json", no_argument, 0, OPT_JSON},
    {"base", required_argument, 0, OPT_BASE},
    {"nvme-dir", required_argument, 0, OPT_NVME_DIR},
    {"threads", required_argument, 0, OPT_THREADS},
    {"adam-params", required_argument, 0, OPT_ADAM_PARAMS},
    {"stream-bytes", required_argument, 0, OPT_STREAM_BYTES},
    {"seconds", required_argument, 0, OPT_SECONDS},
    {"nvme-bytes", required_argument, 0, OPT_NVME_BYTES},
    {"help", no_argument, 0, OPT_HELP},
    {"version", no_argument, 0, OPT_VERSION},
    {0, 0, 0, 0},
};

static int calibrate_flag(int c, const char *arg, void *own, zo_status *st)
{
    plan_calibrate_opts *o = own;
    long v;
    uint64_t n;
    switch (c) {
    case OPT_BASE: o->base = arg; return 1;
    case OPT_NVME_DIR: o->nvme_dir = arg; return 1;
    case OPT_THREADS:
        *st = zo_parse_int(arg, "--threads", 1, 4096, &v);
        o->threads = (int)v;
        return 1;
    case OPT_ADAM_PARAMS:
        *st = zo_parse_count(arg, "--adam-params", &n);
        o->adam_params = (size_t)n;
        return 1;
    case OPT_STREAM_BYTES:
        *st = zo_parse_size(arg, "--stream-bytes", 0, &n);
        o->stream_bytes = (size_t)n;
        return 1;
    case OPT_SECONDS: *st = zo_parse_double(arg, "--seconds", 0.01, 600, &o->seconds); return 1;
    case OPT_NVME_BYTES:
        *st = zo_parse_size(arg, "--nvme-bytes", 0, &n);
        o->nvme_bytes = (size_t)n;
        return 1;
    default: return 0;
    }
}

int cmd_calibrate(int argc, char **argv)
{
    static const cli_command cmd = {"calibrate", usage_calibrate, calibrate_opts, 0, 0,
                                    calibrate_flag};
    cli_flags f;
    plan_calibrate_opts o;
    plan_calibrate_defaults(&o);
    int rc = cli_parse(&cmd, argc, argv, &f, &o);
    if (rc != CLI_PARSED) return rc;
    plan_hw hw;
    /* --json (the default) prints the profile; --json-out FILE writes it */
    if (plan_calibrate_run(&o, &hw) != ZO_OK ||
        emit_json(plan_hw_json(&hw), !f.json_out, f.json_out) != ZO_OK)
        return fail();
    if (f.json_out)
        fprintf(stderr, "memplan: profile written to %s: CPU AdamW %.3g params/s (%.3g on one "
                        "thread), memory %.3g GB/s, %.1f GiB RAM, %d cores, NVMe read %.3g GB/s (%.3g beside "
                        "compute) (%s)\n",
                f.json_out, hw.cpu_adam_rate, hw.cpu_adam_thread_rate, hw.cpu_mem_bw / 1e9,
                (double)hw.cpu_mem / (1 << 30), hw.cpu_cores, hw.nvme_read_bw / 1e9, hw.nvme_read_bw_busy / 1e9,
                hw.note);
    return 0;
}
