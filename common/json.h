/* JSON in: one parser for every JSON file the project reads, with one rule
 * for keys given twice in an object: the file is refused. Readers disagree
 * on which of two equal keys counts (Python's json, and so Hugging Face,
 * takes the last; cJSON's lookup the first), so a file that says two things
 * is not guessed at. The plan schema (common/plan_schema.c) applies the same
 * rule through its own reader. */
#ifndef ZO_COMMON_JSON_H
#define ZO_COMMON_JSON_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/status.h" /* defines: zo_status */

/* Parse `len` bytes of `text` (`path` names it in messages) into *out, which
 * the caller frees with cJSON_Delete. Malformed JSON (trailing bytes
 * included) is ZO_ERR_FORMAT "<path>:<line>:<col>: malformed JSON"; an object
 * holding a key twice, at any depth, is ZO_ERR_FORMAT "<path>: key
 * \"a.b[2].c\" appears twice". */
zo_status zo_json_parse(const char *text, size_t len, const char *path, cJSON **out);

/* The duplicate-key check alone, over a parsed document. */
zo_status zo_json_check_unique(const cJSON *doc, const char *path);

#endif
