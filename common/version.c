#include "version.h"

#include "plan_schema.h" /* defines: ZO_PLAN_FORMAT, ZO_PLAN_VERSION */

#ifndef ZO_VERSION
#error "ZO_VERSION is set by common/CMakeLists.txt from the project's version"
#endif

const char *zo_version(void) { return ZO_VERSION; }

void zo_version_print(FILE *f, const char *program)
{
    fprintf(f, "%s (zoffload) %s, plan format %s %d\n", program, ZO_VERSION, ZO_PLAN_FORMAT, ZO_PLAN_VERSION);
}
