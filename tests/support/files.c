/* Whole files, JSON edits and plans for tests. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "tests/support/files.h"

#include <errno.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/fileio.h" /* defines: zo_file_write_all, zo_file_write_json, zo_file_read_all */

void files_write(const char *path, const void *buf, size_t len)
{
    if (zo_file_write_all(path, buf, len) != ZO_OK) fail_msg("%s", zo_last_error());
}

void files_write_text(const char *path, const char *text)
{
    files_write(path, text, strlen(text));
}

void files_write_sample_text(const char *path, int sentences)
{
    static const char s[] = "the quick brown fox jumps over the lazy dog %d. ";
    char *text = malloc((size_t)sentences * sizeof s + 1), *p = text;
    if (!text) fail_msg("out of memory for %d sentences", sentences);
    *p = '\0';
    for (int i = 0; i < sentences; i++) p += sprintf(p, s, i % 10);
    files_write_text(path, text);
    free(text);
}

char *files_read_text(const char *path)
{
    char *text;
    if (zo_file_read_all(path, 64u << 20, "a test's file", &text, NULL) != ZO_OK)
        fail_msg("%s", zo_last_error());
    return text;
}

static int remove_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    return (type == FTW_DP ? rmdir(path) : unlink(path)) ? -1 : 0;
}

void files_remove_tree(const char *dir)
{
    if (nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        fail_msg("cannot remove %s: %s", dir, strerror(errno));
}

void files_json_set(cJSON *doc, const char *field, const char *value)
{
    char path[256];
    snprintf(path, sizeof path, "%s", field);
    char *key = strrchr(path, '.');
    if (!key) fail_msg("files_json_set: \"%s\" is not OBJECT.MEMBER", field);
    *key++ = '\0';
    cJSON *o = doc;
    for (char *sv = NULL, *k = strtok_r(path, ".", &sv); k; k = strtok_r(NULL, ".", &sv))
        if (!(o = cJSON_GetObjectItemCaseSensitive(o, k))) fail_msg("%s: no object \"%s\"", field, k);
    cJSON_DeleteItemFromObjectCaseSensitive(o, key);
    if (!value) return;
    cJSON *v = cJSON_Parse(value);
    if (!v) fail_msg("%s: \"%s\" is not JSON", field, value);
    cJSON_AddItemToObject(o, key, v);
}

void files_write_json(const char *path, const cJSON *doc)
{
    if (zo_file_write_json(path, doc) != ZO_OK) fail_msg("%s", zo_last_error());
}

void files_write_plan(const char *path, const zo_plan *p, const char *field, const char *value)
{
    cJSON *doc;
    if (zo_plan_write_json(p, path, &doc) != ZO_OK) fail_msg("%s", zo_last_error());
    if (field) files_json_set(doc, field, value);
    files_write_json(path, doc);
    cJSON_Delete(doc);
}
