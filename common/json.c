/* JSON in: cJSON's parser, then every object's keys checked for repeats. */
#include "common/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where a value sits: its key or index, and its parent's place. */
typedef struct json_place {
    const struct json_place *up;
    const char *key; /* NULL: an array element */
    int index;
} json_place;

static void place_str(const json_place *p, char *buf, size_t len)
{
    if (!p) {
        buf[0] = 0;
        return;
    }
    place_str(p->up, buf, len);
    size_t n = strlen(buf);
    if (n >= len) return;
    if (p->key) snprintf(buf + n, len - n, "%s%s", n ? "." : "", p->key);
    else snprintf(buf + n, len - n, "[%d]", p->index);
}

static int cmp_key(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

static zo_status dup_error(const json_place *up, const char *key, const char *path)
{
    char where[512];
    json_place p = {.up = up, .key = key};
    place_str(&p, where, sizeof where);
    return zo_error(ZO_ERR_FORMAT, "%s: key \"%s\" appears twice (JSON readers disagree on which "
                    "counts: give it once)", path, where);
}

static zo_status check_value(const cJSON *v, const json_place *here, const char *path)
{
    zo_status st;
    if (cJSON_IsObject(v)) {
        int n = 0;
        for (const cJSON *c = v->child; c; c = c->next) n++;
        if (n > 1) {
            if (n <= 8) { /* small objects: pairwise */
                for (const cJSON *c = v->child; c; c = c->next)
                    for (const cJSON *d = v->child; d != c; d = d->next)
                        if (!strcmp(c->string, d->string)) return dup_error(here, c->string, path);
            } else {
                const cJSON **keys = malloc((size_t)n * sizeof *keys);
                if (!keys) return zo_error(ZO_ERR_NOMEM, "%s: cannot sort %d keys", path, n);
                int i = 0;
                for (const cJSON *c = v->child; c; c = c->next) keys[i++] = c;
                qsort(keys, (size_t)n, sizeof *keys, cmp_key);
                const char *dup = NULL;
                for (i = 1; i < n && !dup; i++)
                    if (!strcmp(keys[i - 1]->string, keys[i]->string)) dup = keys[i]->string;
                free(keys);
                if (dup) return dup_error(here, dup, path);
            }
        }
        for (const cJSON *c = v->child; c; c = c->next) {
            if (!cJSON_IsObject(c) && !cJSON_IsArray(c)) continue;
            json_place p = {.up = here, .key = c->string};
            if ((st = check_value(c, &p, path)) != ZO_OK) return st;
        }
    } else if (cJSON_IsArray(v)) {
        int i = 0;
        for (const cJSON *c = v->child; c; c = c->next, i++) {
            if (!cJSON_IsObject(c) && !cJSON_IsArray(c)) continue;
            json_place p = {.up = here, .index = i};
            if ((st = check_value(c, &p, path)) != ZO_OK) return st;
        }
    }
    return ZO_OK;
}

zo_status zo_json_check_unique(const cJSON *doc, const char *path)
{
    return check_value(doc, NULL, path);
}

zo_status zo_json_parse(const char *text, size_t len, const char *path, cJSON **out)
{
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int bad = !*out;
    /* after the value only white space (and a C string's NUL) may follow */
    for (const char *p = end; !bad && p && p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') bad = 1, end = p;
    if (bad) {
        cJSON_Delete(*out);
        *out = NULL;
        int line = 1, col = 1;
        for (const char *p = text; end && p < end && p < text + len; p++) {
            if (*p == '\n') line++, col = 1;
            else col++;
        }
        return zo_error(ZO_ERR_FORMAT, "%s:%d:%d: malformed JSON", path, line, col);
    }
    zo_status st = zo_json_check_unique(*out, path);
    if (st != ZO_OK) {
        cJSON_Delete(*out);
        *out = NULL;
    }
    return st;
}
