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

#endif
