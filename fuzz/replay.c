/* A main for the fuzz targets without libFuzzer: run every file given (and
 * every file in every folder given) through LLVMFuzzerTestOneInput once. */
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz/fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: cannot open\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0, r;
    uint8_t *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            uint8_t *g = realloc(buf, cap *= 2);
            if (!g) break;
            buf = g;
        }
    }
    fclose(f);
    if (!buf) return 1;
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: %s: not found\n", argv[i]);
            return 2;
        }
        if (!S_ISDIR(sb.st_mode)) {
            bad += run_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], de->d_name);
            if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
            bad += run_file(p);
            files++;
        }
        if (d) closedir(d);
    }
    printf("replay: %d inputs, %d unreadable\n", files, bad);
    return bad ? 1 : 0;
}
