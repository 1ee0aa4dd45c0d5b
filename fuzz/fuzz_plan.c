/* Plans: zo_plan_read; a plan it accepts is written back by the schema's
 * writer and must read again (the writer and the reader agree). */
#include <string.h>

#include <cjson/cJSON.h>

#include "common/plan_schema.h" /* defines: zo_plan_read, zo_plan_write_json */
#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static zo_plan p, q;
    if (zo_plan_read((const char *)data, size, "fuzz/plan.json", &p) != ZO_OK) return 0;
    cJSON *doc;
    zo_status st = zo_plan_write_json(&p, "fuzz/plan.json", &doc);
    FUZZ_ASSERT(st == ZO_OK, "the writer refused a plan the reader took: %s", zo_last_error());
    char *text = cJSON_PrintUnformatted(doc);
    cJSON_Delete(doc);
    if (!text) return 0;
    st = zo_plan_read(text, strlen(text), "fuzz/rewritten.json", &q);
    FUZZ_ASSERT(st == ZO_OK, "a plan written back does not read: %s\n%s", zo_last_error(), text);
    free(text);
    return 0;
}
