/* The project's version, one line every program prints for --version. */
#ifndef ZO_COMMON_VERSION_H
#define ZO_COMMON_VERSION_H

#include <stdio.h>

/* The release (CMake's project version, "0.1.0"). */
const char *zo_version(void);

/* "PROGRAM (zoffload) 0.1.0, plan format zoffload-plan 1" and a newline, to f. */
void zo_version_print(FILE *f, const char *program);

#endif
