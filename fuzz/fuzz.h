/* One libFuzzer target per parser (docs/testing.md). Each file defines
 * LLVMFuzzerTestOneInput; built with -DZO_FUZZ=ON (clang) it is a libFuzzer
 * program, otherwise replay.c gives it a main that runs the seed corpus once
 * (a ctest test, so the targets build and pass in every build). A target
 * returns 0 for every input; a crash, a sanitizer report, a leak or a broken
 * invariant (abort) is a finding. */
#ifndef ZO_FUZZ_FUZZ_H
#define ZO_FUZZ_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An invariant that must hold for every input: a finding when it does not. */
#define FUZZ_ASSERT(cond, ...)                                                             \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "fuzz invariant failed: %s: ", #cond);                         \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, "\n");                                                         \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* The input as a file, for readers that take a path: a memfd, its path
 * ("/proc/self/fd/N") in `path`. Returns the descriptor to close, or -1. */
static inline int fuzz_input_file(const uint8_t *data, size_t size, char *path, size_t len)
{
    int fd = memfd_create("fuzz-input", MFD_CLOEXEC);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    snprintf(path, len, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
