/* plot: draw a train --log file as SVG (loss, eval loss and learning rate
 * against steps). See --help. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/version.h"    /* defines: zo_version_print */
#include "examples/finetune.h" /* defines: ft_log_read, ft_plot_write */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: plot LOG.jsonl --out FILE.svg [--title TEXT]\n"
        "\n"
        "Draw the metrics log train --log writes (one JSON object per step) as an SVG\n"
        "picture: training loss and eval loss above, the learning rate below, against\n"
        "steps. A step logged twice (a run resumed from an earlier checkpoint) is drawn\n"
        "from its last line.\n"
        "\n"
        "  -o, --out FILE     the SVG to write\n"
        "  --title TEXT       the title (default: the log's name)\n"
        "  --version          the version\n"
        "  -h, --help         this text\n");
}

static const struct option long_opts[] = {
    {"out", required_argument, 0, 'o'},
    {"title", required_argument, 0, 't'},
    {"help", no_argument, 0, 'h'},
    {"version", no_argument, 0, 'V'},
    {0, 0, 0, 0},
};

int main(int argc, char **argv)
{
    const char *out = NULL, *title = NULL;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "ho:", long_opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 't': title = optarg; break;
        case 'h': usage(stdout); return 0;
        case 'V': zo_version_print(stdout, "plot"); return 0;
        default:
            fprintf(stderr, "plot: bad option %s (see --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind + 1 != argc || !out) {
        fprintf(stderr, "plot: %s (see --help)\n", !out ? "--out is required" : "one log file, please");
        return 2;
    }
    ft_record *r;
    size_t n;
    if (ft_log_read(argv[optind], &r, &n) != ZO_OK) {
        fprintf(stderr, "plot: %s\n", zo_last_error());
        return 2;
    }
    zo_status st = ft_plot_write(out, r, n, title ? title : argv[optind]);
    free(r);
    if (st != ZO_OK) {
        fprintf(stderr, "plot: %s\n", zo_last_error());
        return 1;
    }
    printf("# plot: %zu steps -> %s\n", n, out);
    return 0;
}
