/* Files a test writes and reads back: whole files, JSON documents edited
 * field by field, plans as the plan schema writes them. Every helper fails
 * the running test when the file cannot be written or read (tests only;
 * links cmocka). */
#ifndef ZO_TESTS_SUPPORT_FILES_H
#define ZO_TESTS_SUPPORT_FILES_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/plan_schema.h" /* defines: zo_plan */

/* buf[0..len) as the whole of path (common/fileio.h: atomically). */
void files_write(const char *path, const void *buf, size_t len);
void files_write_text(const char *path, const char *text);

/* `sentences` sentences of English-like text ("the quick brown fox jumps
 * over the lazy dog 3. ", the number cycling 0-9) as the whole of path: data
 * for `train --text`. */
void files_write_sample_text(const char *path, int sentences);

/* The whole of path, NUL-terminated; the caller frees it. */
char *files_read_text(const char *path);

/* dir and everything below it (links not followed); nothing there is fine. */
void files_remove_tree(const char *dir);

/* The member at the dotted name `field` of doc ("placement.grads": the
 * member "grads" of the object "placement") replaced by the JSON text
 * `value`, or removed when value is NULL. Every object on the way must
 * exist; the member need not. */
void files_json_set(cJSON *doc, const char *field, const char *value);

/* doc, printed (zo_file_write_json), as the whole of path. */
void files_write_json(const char *path, const cJSON *doc);

/* The plan p as the plan schema's writer writes it, with files_json_set(
 * field, value) applied when field is not NULL, as the whole of path. */
void files_write_plan(const char *path, const zo_plan *p, const char *field, const char *value);

#endif
