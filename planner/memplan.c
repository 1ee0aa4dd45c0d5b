/* memplan: size a transformer's training on given hardware.
 *
 *   memplan estimate [options]   bytes per rank, per tier and kind; fits or not
 *   memplan plan [options]       the search: the best layouts and placements
 *   memplan max-model [options]  the largest model per strategy
 *   memplan calibrate [options]  measure this machine: a hardware profile
 *   memplan generate [options]   generation: bytes per tier, the cache, time per token
 *   memplan models, hardware     the presets
 *
 * One file a command: memplan_estimate.c, memplan_plan.c (the search's flags
 * too, which max-model shares), memplan_max_model.c, memplan_calibrate.c,
 * memplan_generate.c, memplan_list.c.
 *
 * The flags the commands share are parsed once (memplan_cli.c).
 * Exit status: 0 fits (or a listing), 1 does not fit, 2 bad input. */
#include <stdio.h>
#include <string.h>

#include "common/version.h" /* defines: zo_version_print */
#include "planner/memplan_cli.h"

static const char usage_main[] =
    "usage: memplan <command> [options]\n"
    "\n"
    "Size the training of a transformer on given hardware.\n"
    "\n"
    "commands:\n"
    "  estimate    bytes each rank needs per tier (GPU, CPU, NVMe) and kind; whether it fits;\n"
    "              the predicted step time by part\n"
    "  plan        search layouts, ZeRO stages, recompute and placements; the best few\n"
    "  max-model   the largest model of a family that trains on the hardware, per strategy\n"
    "  calibrate   measure this machine; write a hardware profile for --hw FILE\n"
    "  generate    bytes per tier to generate with a model (weights resident or streamed, the\n"
    "              key/value cache), the predicted time per token\n"
    "  models      list the model presets with their shapes and parameter counts\n"
    "  hardware    list the hardware presets\n"
    "  help        this text; 'memplan estimate --help' for the estimate's options\n"
    "  --version   the version (also: version); every command takes --version and -h/--help\n"
    "\n"
    "exit status: 0 fits (or a listing), 1 does not fit, 2 bad input\n";

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_main, stderr);
        return EXIT_BADINPUT;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        fputs(usage_main, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        zo_version_print(stdout, "memplan");
        return 0;
    }
    if (!strcmp(cmd, "estimate")) return cmd_estimate(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "max-model")) return cmd_max_model(argc - 1, argv + 1);
    if (!strcmp(cmd, "calibrate")) return cmd_calibrate(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "models") || !strcmp(cmd, "hardware")) {
        /* listings take no options but --version and -h/--help, as every command */
        if (argc > 2 && (!strcmp(argv[2], "--version") || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
            if (!strcmp(argv[2], "--version")) zo_version_print(stdout, "memplan");
            else fprintf(stdout, "usage: memplan %s\n  list the %s presets\n", cmd, cmd[0] == 'm' ? "model" : "hardware");
            return 0;
        }
        if (argc > 2) {
            fprintf(stderr, "memplan: %s takes no arguments: '%s' (see 'memplan --help')\n", cmd, argv[2]);
            return EXIT_BADINPUT;
        }
        return !strcmp(cmd, "models") ? cmd_models() : cmd_hardware();
    }
    fprintf(stderr, "memplan: unknown command '%s' (commands: estimate, plan, max-model, calibrate, generate, models, hardware; see "
                    "'memplan --help')\n", cmd);
    return EXIT_BADINPUT;
}
