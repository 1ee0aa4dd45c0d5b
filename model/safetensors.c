/* safetensors: one file (open/validate/read, atomic write) and checkpoints
 * made of one file or an index of shards. Loading into a layout is in
 * weights.c. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/fileio.h" /* defines: zo_file_create, zo_file_read_all, zo_file_open_regular */
#include "common/json.h"   /* defines: zo_json_parse, zo_json_check_unique */
#include "model_io.h"       /* defines: model_io_convert_rows */

/* ---- element types ------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
    int dtype;
} st_dtypes[] = {
    {"F32", 4, ZO_DTYPE_F32}, {"F16", 2, ZO_DTYPE_F16}, {"BF16", 2, ZO_DTYPE_BF16},
    {"F64", 8, -1},           {"I64", 8, -1},           {"I32", 4, -1},
    {"I16", 2, -1},           {"I8", 1, -1},            {"U64", 8, -1},
    {"U32", 4, -1},           {"U16", 2, -1},           {"U8", 1, -1},
    {"BOOL", 1, -1},          {"F8_E4M3", 1, -1},       {"F8_E5M2", 1, -1},
};

static const char *st_dtype_name(zo_dtype t)
{
    switch (t) {
    case ZO_DTYPE_F16: return "F16";
    case ZO_DTYPE_BF16: return "BF16";
    default: return "F32";
    }
}

/* ---- opening and validating ------------------------------------------------ */

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const model_st_tensor *)a)->name, ((const model_st_tensor *)b)->name);
}

static int cmp_tensor_begin(const void *a, const void *b)
{
    const model_st_tensor *x = *(const model_st_tensor *const *)a;
    const model_st_tensor *y = *(const model_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* A JSON number that is a non-negative integer below 2^53 (exact in a double). */
static int json_u64(const cJSON *it, uint64_t *out)
{
    if (!cJSON_IsNumber(it)) return 0;
    double d = it->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* Parse one header entry into t (name already set). */
static zo_status parse_entry(const char *path, const cJSON *e, uint64_t data_size,
                             model_st_tensor *t)
{
    if (!cJSON_IsObject(e))
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": header entry is not an object", path,
                        t->name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": missing or non-string \"dtype\"", path,
                        t->name);
    t->dtype = -1;
    t->elem_size = 0;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (!strcmp(dt->valuestring, st_dtypes[i].name)) {
            snprintf(t->dtype_name, sizeof t->dtype_name, "%s", st_dtypes[i].name);
            t->elem_size = st_dtypes[i].size;
            t->dtype = st_dtypes[i].dtype;
        }
    }
    if (!t->elem_size)
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": unknown dtype \"%.32s\"", path, t->name,
                        dt->valuestring);
    if (!cJSON_IsArray(shape))
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": missing or non-array \"shape\"", path,
                        t->name);
    int nd = cJSON_GetArraySize(shape);
    if (nd > MODEL_ST_MAX_DIMS)
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": %d dimensions (at most %d)", path,
                        t->name, nd, MODEL_ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    for (int i = 0; i < nd; i++) {
        uint64_t d;
        if (!json_u64(cJSON_GetArrayItem(shape, i), &d) || d > (uint64_t)INT64_MAX)
            return zo_error(ZO_ERR_FORMAT,
                            "%s: tensor \"%s\": shape[%d] is not a non-negative integer", path,
                            t->name, i);
        t->shape[i] = (int64_t)d;
        if (d && numel > UINT64_MAX / d)
            return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": shape overflows", path, t->name);
        numel *= d;
    }
    t->numel = numel;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !json_u64(cJSON_GetArrayItem(offs, 0), &t->begin) ||
        !json_u64(cJSON_GetArrayItem(offs, 1), &t->end))
        return zo_error(ZO_ERR_FORMAT,
                        "%s: tensor \"%s\": \"data_offsets\" must be [begin, end] of "
                        "non-negative integers",
                        path, t->name);
    if (t->begin > t->end)
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%llu, %llu] run backwards",
                        path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > data_size)
        return zo_error(ZO_ERR_FORMAT,
                        "%s: tensor \"%s\": data_offsets [%llu, %llu] beyond the data section "
                        "(%llu bytes; file truncated?)",
                        path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                        (unsigned long long)data_size);
    if (numel > UINT64_MAX / t->elem_size || numel * t->elem_size != t->end - t->begin)
        return zo_error(ZO_ERR_FORMAT,
                        "%s: tensor \"%s\": %llu bytes in data_offsets but %s x %llu elements "
                        "needs %llu",
                        path, t->name, (unsigned long long)(t->end - t->begin), t->dtype_name,
                        (unsigned long long)numel, (unsigned long long)(numel * t->elem_size));
    return ZO_OK;
}

/* Tensors must tile the data section: sorted by begin, each starts where the
 * previous ended, and the last ends at the end of the file. */
static zo_status check_coverage(model_st_file *f, uint64_t data_size)
{
    zo_status st = ZO_OK;
    if (!f->n_tensors) {
        if (data_size)
            return zo_error(ZO_ERR_FORMAT, "%s: %llu data bytes but no tensors", f->path,
                            (unsigned long long)data_size);
        return ZO_OK;
    }
    model_st_tensor **by = malloc((size_t)f->n_tensors * sizeof *by);
    if (!by) return zo_error(ZO_ERR_NOMEM, "%s: cannot sort %d tensors", f->path, f->n_tensors);
    for (int i = 0; i < f->n_tensors; i++) by[i] = &f->tensors[i];
    qsort(by, (size_t)f->n_tensors, sizeof *by, cmp_tensor_begin);
    uint64_t pos = 0;
    const char *prev = NULL;
    for (int i = 0; i < f->n_tensors; i++) {
        const model_st_tensor *t = by[i];
        if (t->begin < pos) {
            st = zo_error(ZO_ERR_FORMAT,
                          "%s: tensor \"%s\": data_offsets [%llu, %llu] overlap tensor \"%s\"",
                          f->path, t->name, (unsigned long long)t->begin,
                          (unsigned long long)t->end, prev);
            goto out_free_by;
        }
        if (t->begin > pos) {
            st = zo_error(ZO_ERR_FORMAT,
                          "%s: tensor \"%s\": data_offsets [%llu, %llu] leave a hole of %llu "
                          "bytes before it",
                          f->path, t->name, (unsigned long long)t->begin,
                          (unsigned long long)t->end, (unsigned long long)(t->begin - pos));
            goto out_free_by;
        }
        pos = t->end;
        prev = t->name;
    }
    if (pos != data_size)
        st = zo_error(ZO_ERR_FORMAT,
                      "%s: tensor \"%s\" ends the data at byte %llu but the data section has "
                      "%llu bytes",
                      f->path, prev, (unsigned long long)pos, (unsigned long long)data_size);
out_free_by:
    free(by);
    return st;
}

static zo_status parse_header(model_st_file *f, const char *json, size_t len)
{
    zo_status st = ZO_OK;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - json) : 0;
        return zo_error(ZO_ERR_FORMAT, "%s: header JSON malformed near byte %zu of %zu", f->path,
                        at, len);
    }
    /* after the JSON value only padding spaces may follow */
    for (const char *p = end; p < json + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            st = zo_error(ZO_ERR_FORMAT, "%s: header has trailing bytes after the JSON object",
                          f->path);
            goto out_free_root;
        }
    }
    if (!cJSON_IsObject(root)) {
        st = zo_error(ZO_ERR_FORMAT, "%s: header is not a JSON object", f->path);
        goto out_free_root;
    }
    /* a key twice, a tensor or a field of one: refused (common/json.h) */
    if ((st = zo_json_check_unique(root, f->path)) != ZO_OK) goto out_free_root;
    int n = 0;
    for (const cJSON *e = root->child; e; e = e->next)
        if (strcmp(e->string, "__metadata__")) n++;
    f->tensors = calloc(n ? (size_t)n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        st = zo_error(ZO_ERR_NOMEM, "%s: cannot allocate %d tensor records", f->path, n);
        goto out_free_root;
    }
    uint64_t data_size = f->file_size - f->data_start;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (!cJSON_IsObject(e)) {
                st = zo_error(ZO_ERR_FORMAT, "%s: \"__metadata__\" is not an object", f->path);
                goto out_free_root;
            }
            continue;
        }
        model_st_tensor *t = &f->tensors[f->n_tensors];
        t->name = strdup(e->string);
        if (!t->name) {
            st = zo_error(ZO_ERR_NOMEM, "%s: cannot copy a tensor name", f->path);
            goto out_free_root;
        }
        f->n_tensors++;
        if ((st = parse_entry(f->path, e, data_size, t)) != ZO_OK) goto out_free_root;
    }
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_tensor_name);
    for (int i = 1; i < f->n_tensors; i++) {
        if (!strcmp(f->tensors[i - 1].name, f->tensors[i].name)) {
            st = zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\" appears twice in the header", f->path,
                          f->tensors[i].name);
            goto out_free_root;
        }
    }
    st = check_coverage(f, data_size);
out_free_root:
    cJSON_Delete(root);
    return st;
}

/* len bytes at byte `off` of f into buf (pread, retried when interrupted or
 * short). The file ending first means it shrank since it was opened (its
 * size was checked then). `what` names the bytes: "the header", "tensor "x"". */
static zo_status read_at(const model_st_file *f, const char *what, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t r = pread(f->fd, p, len < (1u << 30) ? len : (1u << 30), (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return zo_error(ZO_ERR_IO, "%s: %s: read at byte %llu: %s", f->path, what, (unsigned long long)off,
                            strerror(errno));
        if (r == 0) {
            struct stat sb;
            long long now = fstat(f->fd, &sb) == 0 ? (long long)sb.st_size : -1;
            return zo_error(ZO_ERR_FORMAT, "%s: %s: the file ends at byte %lld, before byte %llu: truncated after "
                            "it was opened (it had %llu bytes then)", f->path, what, now,
                            (unsigned long long)(off + len), (unsigned long long)f->file_size);
        }
        p += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return ZO_OK;
}

zo_status model_st_open(model_st_file *f, const char *path)
{
    zo_status st = ZO_OK;
    char *header = NULL;
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) return zo_error(ZO_ERR_NOMEM, "%s: cannot copy the path", path);
    if ((st = zo_file_open_regular(path, "a safetensors file", &f->fd)) != ZO_OK) goto out_close;
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) {
        st = zo_error(ZO_ERR_IO, "%s: fstat: %s", path, strerror(errno));
        goto out_close;
    }
    f->file_size = (uint64_t)sb.st_size;
    if (f->file_size < 8) {
        st = zo_error(ZO_ERR_FORMAT,
                      "%s: truncated: %llu bytes, shorter than the 8-byte header length", path,
                      (unsigned long long)f->file_size);
        goto out_close;
    }
    uint8_t hl[8];
    if ((st = read_at(f, "the header length", hl, 8, 0)) != ZO_OK) goto out_close;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | hl[i];
    if (hlen == 0 || hlen > MODEL_ST_MAX_HEADER || hlen > f->file_size - 8) {
        st = zo_error(ZO_ERR_FORMAT,
                      "%s: header length %llu is invalid for a file of %llu bytes (limit %u)",
                      path, (unsigned long long)hlen, (unsigned long long)f->file_size,
                      MODEL_ST_MAX_HEADER);
        goto out_close;
    }
    f->data_start = 8 + hlen;
    if (!(header = malloc((size_t)hlen))) {
        st = zo_error(ZO_ERR_NOMEM, "%s: cannot allocate the %llu-byte header", path, (unsigned long long)hlen);
        goto out_close;
    }
    if ((st = read_at(f, "the header", header, (size_t)hlen, 8)) != ZO_OK) goto out_close;
    if ((st = parse_header(f, header, (size_t)hlen)) != ZO_OK) goto out_close;
    free(header);
    return ZO_OK;
out_close:
    free(header);
    model_st_close(f);
    return st;
}

void model_st_close(model_st_file *f)
{
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

const model_st_tensor *model_st_find(const model_st_file *f, const char *name)
{
    model_st_tensor key = {.name = (char *)name};
    return bsearch(&key, f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_tensor_name);
}

/* ---- reading with conversion ------------------------------------------------ */

/* What messages call tensor t: "tensor "<name>"" (the name cut to fit). */
static void tensor_what(char *buf, size_t len, const model_st_tensor *t)
{
    snprintf(buf, len, "tensor \"%.200s\"", t->name);
}

zo_status model_st_read_raw(const model_st_file *f, const model_st_tensor *t, void *dst)
{
    char what[224];
    tensor_what(what, sizeof what, t);
    return read_at(f, what, dst, (size_t)(t->end - t->begin), f->data_start + t->begin);
}

zo_status model_st_read(const model_st_file *f, const model_st_tensor *t, void *dst, zo_dtype dt,
                        int transpose)
{
    if (t->dtype < 0)
        return zo_error(ZO_ERR_UNSUPPORTED,
                        "%s: tensor \"%s\": dtype %s cannot be loaded (F32, F16, BF16 only)%s",
                        f->path, t->name, t->dtype_name,
                        !strncmp(t->dtype_name, "F8_", 3)
                            ? ": an FP8 tensor loads only as a 2-D weight with its \"_scale_inv\" block scales"
                            : "");
    if (transpose && t->ndim != 2)
        return zo_error(ZO_ERR_INVALID, "%s: tensor \"%s\": transpose needs 2 dimensions, has %d",
                        f->path, t->name, t->ndim);
    zo_dtype sdt = (zo_dtype)t->dtype;
    if (!transpose && sdt == dt) return model_st_read_raw(f, t, dst); /* straight into place */
    /* through a bounded buffer: bands of whole rows (transposed; at least 32,
     * the transpose's tile) or runs of elements */
    char what[224];
    tensor_what(what, sizeof what, t);
    uint64_t rows = transpose ? (uint64_t)t->shape[0] : t->numel;
    uint64_t cols = transpose ? (uint64_t)t->shape[1] : 1;
    uint64_t row_bytes = cols * t->elem_size, band = MODEL_ST_READ_CHUNK / (row_bytes ? row_bytes : 1);
    if (transpose && band < 32 && row_bytes <= MODEL_ST_READ_CHUNK / 8) band = 32;
    if (!band) band = 1;
    if (band > rows) band = rows;
    size_t dsz = zo_dtype_size(dt);
    uint8_t *buf = malloc(band * row_bytes > 0 ? (size_t)(band * row_bytes) : 1);
    if (!buf) return zo_error(ZO_ERR_NOMEM, "%s: %s: cannot allocate a %llu-byte read buffer", f->path, what,
                              (unsigned long long)(band * row_bytes));
    zo_status st = ZO_OK;
    for (uint64_t r0 = 0; r0 < rows && st == ZO_OK; r0 += band) {
        uint64_t n = rows - r0 < band ? rows - r0 : band;
        st = read_at(f, what, buf, (size_t)(n * row_bytes), f->data_start + t->begin + r0 * row_bytes);
        if (st != ZO_OK) break;
        if (transpose) /* rows [r0, r0 + n) of [rows, cols] are columns [r0, r0 + n) of dst [cols, rows] */
            st = model_io_convert_rows((uint8_t *)dst + r0 * dsz, dt, buf, sdt, n, cols, rows, 1);
        else
            st = model_io_convert_rows((uint8_t *)dst + r0 * dsz, dt, buf, sdt, 1, n, 0, 0);
    }
    free(buf);
    return st;
}

/* ---- FP8 block-quantized weights ------------------------------------------------ */

double model_fp8_decode(uint8_t code, int e4m3)
{
    int ebits = e4m3 ? 4 : 5, mbits = 7 - ebits, bias = e4m3 ? 7 : 15;
    int e = (code >> mbits) & ((1 << ebits) - 1), m = code & ((1 << mbits) - 1);
    double v;
    if (e4m3 && e == 15 && m == 7)
        v = NAN; /* E4M3 has no infinities: S.1111.111 alone is NaN */
    else if (!e4m3 && e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, 1 - bias - mbits); /* subnormal */
    else
        v = ldexp((1 << mbits) + m, e - bias - mbits);
    return code & 0x80 ? -v : v;
}

/* p (finite) rounded once, to nearest even, into element i of dst: F32 by
 * the cast; a normal BF16 in the double's bits; F16 and BF16's subnormals
 * at their precision (11, 8 bits) and subnormal quantum, then stored through the float that holds the rounded value
 * exactly (a value past the type's largest becomes inf, which the loader
 * refuses as it refuses any non-finite weight). */
static void store_rounded(void *dst, zo_dtype dt, size_t i, double p)
{
    if (dt == ZO_DTYPE_F32) {
        ((float *)dst)[i] = (float)p;
        return;
    }
    if (dt == ZO_DTYPE_BF16 && fabs(p) >= 0x1p-126) {
        /* a normal bf16 (or past its largest): the double's 45 fraction bits
         * below bf16's 7 rounded off, to nearest even, in its bits */
        uint64_t u;
        memcpy(&u, &p, sizeof u);
        u += (((uint64_t)1 << 44) - 1) + ((u >> 45) & 1);
        u &= ~(((uint64_t)1 << 45) - 1);
        memcpy(&p, &u, sizeof p);
        ((uint16_t *)dst)[i] = zo_f32_to_bf16((float)p); /* exact; inf past bf16's largest */
        return;
    }
    int prec = dt == ZO_DTYPE_BF16 ? 8 : 11, emin = dt == ZO_DTYPE_BF16 ? -126 : -14;
    if (p != 0.0) {
        int e = ilogb(p);
        double q = ldexp(1.0, (e < emin ? emin : e) - prec + 1); /* the spacing at p */
        p = nearbyint(p / q) * q;
    }
    zo_store_f32(dst, dt, i, (float)p);
}

zo_status model_st_read_fp8(const model_st_file *f, const model_st_tensor *t, const model_st_file *sf,
                            const model_st_tensor *s, const int block[2], void *dst, zo_dtype dt,
                            int transpose)
{
    int e4m3 = !strcmp(t->dtype_name, "F8_E4M3");
    if (!e4m3 && strcmp(t->dtype_name, "F8_E5M2"))
        return zo_error(ZO_ERR_INVALID, "%s: tensor \"%s\": dtype %s is not FP8", f->path, t->name, t->dtype_name);
    if (t->ndim != 2)
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": an FP8 weight must have 2 dimensions, has %d", f->path,
                        t->name, t->ndim);
    if (!block || block[0] < 1 || block[1] < 1)
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": the FP8 block size (weight_block_size) must be two "
                        "positive integers, is [%d, %d]", f->path, t->name, block ? block[0] : 0,
                        block ? block[1] : 0);
    uint64_t rows = (uint64_t)t->shape[0], cols = (uint64_t)t->shape[1];
    uint64_t srows = (rows + (uint64_t)block[0] - 1) / (uint64_t)block[0];
    uint64_t scols = (cols + (uint64_t)block[1] - 1) / (uint64_t)block[1];
    if (s->ndim != 2 || (uint64_t)s->shape[0] != srows || (uint64_t)s->shape[1] != scols)
        return zo_error(ZO_ERR_FORMAT,
                        "%s: tensor \"%s\": shape [%lld%s%lld] as the scales of %s's \"%s\" [%llu, %llu] "
                        "in blocks of [%d, %d] must be [%llu, %llu]",
                        sf->path, s->name, (long long)s->shape[0], s->ndim > 1 ? ", " : "",
                        s->ndim > 1 ? (long long)s->shape[1] : 0LL, f->path, t->name,
                        (unsigned long long)rows, (unsigned long long)cols, block[0], block[1],
                        (unsigned long long)srows, (unsigned long long)scols);
    if (s->dtype < 0)
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": dtype %s: FP8 scales must be F32, F16 or BF16",
                        sf->path, s->name, s->dtype_name);
    char what[224];
    tensor_what(what, sizeof what, t);
    uint64_t band = MODEL_ST_READ_CHUNK / (cols ? cols : 1);
    if (!band) band = 1;
    if (band > rows) band = rows;
    float *scale = malloc(srows && scols ? (size_t)(srows * scols) * sizeof *scale : 1);
    uint8_t *buf = malloc(band && cols ? (size_t)(band * cols) : 1);
    zo_status st = ZO_OK;
    if (!scale || !buf) {
        st = zo_error(ZO_ERR_NOMEM, "%s: %s: cannot allocate its %llu scales and a %llu-byte read buffer", f->path,
                      what, (unsigned long long)(srows * scols), (unsigned long long)(band * cols));
        goto out_free;
    }
    if ((st = model_st_read(sf, s, scale, ZO_DTYPE_F32, 0)) != ZO_OK) goto out_free;
    double value[256];
    for (int c = 0; c < 256; c++) value[c] = model_fp8_decode((uint8_t)c, e4m3);
    for (uint64_t r0 = 0; r0 < rows && st == ZO_OK; r0 += band) {
        uint64_t n = rows - r0 < band ? rows - r0 : band;
        if ((st = read_at(f, what, buf, (size_t)(n * cols), f->data_start + t->begin + r0 * cols)) != ZO_OK) break;
        for (uint64_t i = r0; i < r0 + n && st == ZO_OK; i++) {
            const uint8_t *x = buf + (i - r0) * cols;
            const float *si = scale + (i / (uint64_t)block[0]) * scols;
            for (uint64_t j = 0; j < cols; j++) {
                double p = value[x[j]] * (double)si[j / (uint64_t)block[1]]; /* exact: 4 x 24 bits */
                if (!isfinite(p)) {
                    st = zo_error(ZO_ERR_FORMAT,
                                  "%s: tensor \"%s\" element %llu (row %llu, column %llu): FP8 code 0x%02x (%g) "
                                  "times its scale %g (\"%s\") is %g: weights must be finite",
                                  f->path, t->name, (unsigned long long)(i * cols + j), (unsigned long long)i,
                                  (unsigned long long)j, x[j], value[x[j]], (double)si[j / (uint64_t)block[1]],
                                  s->name, p);
                    break;
                }
                store_rounded(dst, dt, (size_t)(transpose ? j * rows + i : i * cols + j), p);
            }
        }
    }
out_free:
    free(buf);
    free(scale);
    return st;
}

/* ---- MXFP4 (OCP Microscaling) weights ------------------------------------------- */

int model_mxfp4_shape(const model_st_tensor *b, int64_t shape[MODEL_ST_MAX_DIMS])
{
    int n = b->ndim - 1; /* [..., R, G, 16] -> [..., 32 G, R] */
    if (n < 2 || b->shape[n] != 16 || b->shape[n - 1] < 1 || b->shape[n - 2] < 1) return -1;
    for (int d = 0; d < n - 2; d++) shape[d] = b->shape[d];
    shape[n - 2] = b->shape[n - 1] * MODEL_MXFP4_BLOCK;
    shape[n - 1] = b->shape[n - 2];
    return n;
}

/* E2M1 code k's value: 0, 0.5, 1, 1.5, 2, 3, 4, 6, then the same negated. */
static const float e2m1_value[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* What a read decodes with: every (scale, code)'s value in dt's bits, and
 * which codes overflow dt under each scale. */
typedef struct mxfp4_table {
    uint32_t bits[255][16];
    uint16_t inf[255]; /* bit k: code k times 2^(s - 127) is past dt's largest */
} mxfp4_table;

static void mxfp4_table_init(mxfp4_table *tab, zo_dtype dt)
{
    for (int s = 0; s < 255; s++) {
        tab->inf[s] = 0;
        for (int k = 0; k < 16; k++) {
            float v = ldexpf(e2m1_value[k], s - 127); /* exact, or inf past 2^128 */
            uint32_t u = dt == ZO_DTYPE_F32    ? zo_f32_bits(v)
                         : dt == ZO_DTYPE_BF16 ? zo_f32_to_bf16(v)
                                               : zo_f32_to_f16(v);
            float back = dt == ZO_DTYPE_F32 ? v : dt == ZO_DTYPE_BF16 ? zo_bf16_to_f32((uint16_t)u)
                                                                       : zo_f16_to_f32((uint16_t)u);
            tab->bits[s][k] = u;
            if (isinf(back)) tab->inf[s] |= (uint16_t)(1u << k);
        }
    }
}

/* The refusal of element `at` of X (row r, column c of D [R, C] in matrix
 * p): its scale is NaN, or its code overflows dt. */
static zo_status mxfp4_bad(const model_st_file *f, const model_st_tensor *b, const model_st_tensor *s, zo_dtype dt,
                           uint64_t p, uint64_t r, uint64_t c, uint64_t R, uint64_t C, uint8_t scale, uint8_t code)
{
    uint64_t at = p * R * C + c * R + r;
    if (scale == 255)
        return zo_error(ZO_ERR_FORMAT,
                        "%s: tensor \"%s\" element %llu (of block %llu of row %llu): E8M0 scale 255 is NaN",
                        f->path, s->name, (unsigned long long)((p * R + r) * (C / MODEL_MXFP4_BLOCK) +
                                                               c / MODEL_MXFP4_BLOCK),
                        (unsigned long long)(c / MODEL_MXFP4_BLOCK), (unsigned long long)(p * R + r));
    return zo_error(ZO_ERR_FORMAT,
                    "%s: tensor \"%s\": element %llu of the weight it holds (row %llu, column %llu): E2M1 code "
                    "0x%x (%g) times 2^%d is past %s's largest: weights must be finite",
                    f->path, b->name, (unsigned long long)at, (unsigned long long)(p * C + c), (unsigned long long)r,
                    code, (double)e2m1_value[code], scale - 127, zo_dtype_name(dt));
}

zo_status model_st_read_mxfp4(const model_st_file *f, const model_st_tensor *b, const model_st_file *sf,
                              const model_st_tensor *s, uint64_t first, uint64_t count, void *dst, zo_dtype dt,
                              int transpose)
{
    int64_t xs[MODEL_ST_MAX_DIMS];
    int n = model_mxfp4_shape(b, xs);
    if (strcmp(b->dtype_name, "U8"))
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": dtype %s: MXFP4 blocks must be U8 (two E2M1 codes a byte)",
                        f->path, b->name, b->dtype_name);
    if (n < 0)
        return zo_error(ZO_ERR_FORMAT,
                        "%s: tensor \"%s\": %d dimensions, the last %lld: MXFP4 blocks must be [..., rows, columns / "
                        "32, 16]", f->path, b->name, b->ndim, b->ndim ? (long long)b->shape[b->ndim - 1] : 0LL);
    int same = s->ndim == n; /* [..., R, G] */
    for (int d = 0; same && d < n; d++) same = s->shape[d] == b->shape[d];
    if (!same || strcmp(s->dtype_name, "U8"))
        return zo_error(ZO_ERR_FORMAT,
                        "%s: tensor \"%s\": %s %s, %d dimensions: the scales of %s's \"%s\" must be U8 (E8M0) shaped "
                        "as its blocks less their last dimension (one a block of 32 values)",
                        sf->path, s->name, same ? "dtype" : "shape or dtype", s->dtype_name, s->ndim, f->path,
                        b->name);
    uint64_t R = (uint64_t)xs[n - 1], C = (uint64_t)xs[n - 2], G = C / MODEL_MXFP4_BLOCK, CR = C * R;
    uint64_t numel = b->numel * 2;
    if (first > numel || count > numel - first)
        return zo_error(ZO_ERR_INVALID, "%s: tensor \"%s\": elements %llu..%llu are outside its %llu", f->path,
                        b->name, (unsigned long long)first, (unsigned long long)(first + count),
                        (unsigned long long)numel);
    if (dt != ZO_DTYPE_F32 && dt != ZO_DTYPE_BF16 && dt != ZO_DTYPE_F16)
        return zo_error(ZO_ERR_INVALID, "%s: tensor \"%s\": MXFP4 dequantizes to F32, BF16 or F16", f->path,
                        b->name);
    if (!count) return ZO_OK;
    char what[224], swhat[224];
    tensor_what(what, sizeof what, b);
    tensor_what(swhat, sizeof swhat, s);
    /* bands of whole rows of D: at least a tile's 32, about MODEL_ST_READ_CHUNK bytes */
    uint64_t band = MODEL_ST_READ_CHUNK / (G * 16);
    band = band < 32 ? 32 : band / 32 * 32;
    if (band > R) band = R;
    size_t esz = zo_dtype_size(dt);
    mxfp4_table *tab = malloc(sizeof *tab);
    uint8_t *blk = malloc((size_t)(band * G * 16)), *sc = malloc((size_t)(band * G));
    zo_status st = ZO_OK;
    if (!tab || !blk || !sc) {
        st = zo_error(ZO_ERR_NOMEM, "%s: %s: cannot allocate a %llu-byte read buffer", f->path, what,
                      (unsigned long long)(band * G * 17));
        goto out_free;
    }
    mxfp4_table_init(tab, dt);
    uint64_t last = first + count; /* elements [first, last) of X (of D with transpose) */
    uint32_t tile[MODEL_MXFP4_BLOCK][32]; /* [column of the block][row of the band's 32] */
    for (uint64_t p = first / CR; p * CR < last && st == ZO_OK; p++) {
        /* this matrix's part of the range, and the columns of D (rows of X) it covers */
        uint64_t lo = first > p * CR ? first - p * CR : 0, hi = last - p * CR < CR ? last - p * CR : CR;
        uint64_t c_lo = transpose ? 0 : lo / R, c_hi = transpose ? C - 1 : (hi - 1) / R;
        uint64_t r_beg = transpose ? lo / C : 0, r_end = transpose ? (hi - 1) / C + 1 : R;
        for (uint64_t r0 = r_beg; r0 < r_end && st == ZO_OK; r0 += band) {
            uint64_t nr = r_end - r0 < band ? r_end - r0 : band, row0 = p * R + r0;
            if ((st = read_at(f, what, blk, (size_t)(nr * G * 16), f->data_start + b->begin + row0 * G * 16)) ||
                (st = read_at(sf, swhat, sc, (size_t)(nr * G), sf->data_start + s->begin + row0 * G)))
                break;
            for (uint64_t t0 = 0; t0 < nr && st == ZO_OK; t0 += 32) {
                uint64_t tr = nr - t0 < 32 ? nr - t0 : 32;
                for (uint64_t g = c_lo / MODEL_MXFP4_BLOCK; g <= c_hi / MODEL_MXFP4_BLOCK && st == ZO_OK; g++) {
                    /* decode the tile: block g of rows [r0 + t0, r0 + t0 + tr) */
                    for (uint64_t i = 0; i < tr; i++) {
                        uint8_t e = sc[(t0 + i) * G + g];
                        const uint8_t *q = blk + ((t0 + i) * G + g) * 16;
                        if (e == 255 || tab->inf[e]) {
                            for (int j = 0; j < 32 && st == ZO_OK; j++) {
                                uint8_t k = j & 1 ? q[j / 2] >> 4 : q[j / 2] & 15;
                                if (e == 255 || tab->inf[e] >> k & 1)
                                    st = mxfp4_bad(f, b, s, dt, p, r0 + t0 + i, g * 32 + (uint64_t)j, R, C, e, k);
                            }
                            if (st) break;
                        }
                        const uint32_t *v = tab->bits[e];
                        for (int j = 0; j < 16; j++) {
                            tile[2 * j][i] = v[q[j] & 15];
                            tile[2 * j + 1][i] = v[q[j] >> 4];
                        }
                    }
                    if (st) break;
                    uint64_t cb = g * 32 > c_lo ? g * 32 : c_lo, ce = g * 32 + 32 <= c_hi ? g * 32 + 32 : c_hi + 1;
                    for (uint64_t c = cb; c < ce; c++) {
                        /* D's column c (X's row c) for rows [ra, rb) of the tile, where in the range */
                        uint64_t r = r0 + t0, ra = 0, rb = tr;
                        if (transpose) {
                            for (uint64_t i = 0; i < tr; i++) {
                                uint64_t k = (r + i) * C + c;
                                if (k < lo || k >= hi) continue;
                                uint64_t o = p * CR + k - first;
                                if (esz == 4) ((uint32_t *)dst)[o] = tile[c - g * 32][i];
                                else ((uint16_t *)dst)[o] = (uint16_t)tile[c - g * 32][i];
                            }
                            continue;
                        }
                        if (c * R + r < lo) ra = lo - c * R - r;
                        if (c * R + r + rb > hi) rb = hi > c * R + r ? hi - c * R - r : 0;
                        if (ra >= rb) continue;
                        const uint32_t *from = &tile[c - g * 32][ra];
                        uint64_t o = p * CR + c * R + r + ra - first;
                        if (esz == 4) {
                            memcpy((uint32_t *)dst + o, from, (size_t)(rb - ra) * 4);
                        } else {
                            uint16_t *to = (uint16_t *)dst + o;
                            for (uint64_t i = 0; i < rb - ra; i++) to[i] = (uint16_t)from[i];
                        }
                    }
                }
            }
        }
    }
out_free:
    free(sc);
    free(blk);
    free(tab);
    return st;
}

/* ---- writing ------------------------------------------------------------------ */

#define WRITE_CHUNK_BYTES (4u << 20)

struct model_st_writer {
    zo_file_writer out;
    int n;
    uint64_t data_start;       /* 8 + padded header */
    uint64_t *begin, *numel;   /* [n] byte offset in the data, elements */
    size_t *esz;               /* [n] */
    const char **names;        /* [n] the caller's */
    uint64_t total, put;       /* data bytes: all of them, written so far */
};

static void writer_release(model_st_writer *w)
{
    free(w->begin);
    free(w->numel);
    free(w->esz);
    free(w->names);
    free(w);
}

zo_status model_st_writer_open(model_st_writer **wo, const char *path, const model_st_entry *entries,
                               int n)
{
    *wo = NULL;
    zo_status st = ZO_OK;
    char *header = NULL;
    model_st_writer *w = calloc(1, sizeof *w);
    cJSON *root = cJSON_CreateObject();
    if (!w || !root) goto out_nomem;
    w->n = n;
    size_t nn = n > 0 ? (size_t)n : 1;
    w->begin = calloc(nn, sizeof *w->begin);
    w->numel = calloc(nn, sizeof *w->numel);
    w->esz = calloc(nn, sizeof *w->esz);
    w->names = calloc(nn, sizeof *w->names);
    if (!w->begin || !w->numel || !w->esz || !w->names) goto out_nomem;
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    if (!meta || !cJSON_AddStringToObject(meta, "format", "pt")) goto out_nomem;
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const model_st_entry *e = &entries[i];
        if (e->ndim < 0 || e->ndim > MODEL_ST_MAX_DIMS || (unsigned)e->dtype >= ZO_DTYPE_COUNT) {
            st = zo_error(ZO_ERR_INVALID, "%s: tensor \"%s\": bad dtype or %d dimensions", path,
                          e->name, e->ndim);
            goto out_free;
        }
        uint64_t numel = 1;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] < 0 || (e->shape[d] && numel > UINT64_MAX / 8 / (uint64_t)e->shape[d])) {
                st = zo_error(ZO_ERR_INVALID, "%s: tensor \"%s\": dimension %d of %lld is negative or too large",
                              path, e->name, d, (long long)e->shape[d]);
                goto out_free;
            }
            numel *= (uint64_t)e->shape[d];
        }
        w->esz[i] = zo_dtype_size(e->dtype);
        w->numel[i] = numel;
        w->begin[i] = off;
        w->names[i] = e->name;
        uint64_t bytes = numel * w->esz[i];
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        if (!t || !cJSON_AddStringToObject(t, "dtype", st_dtype_name(e->dtype))) goto out_nomem;
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        if (!shape || !offs) goto out_nomem;
        for (int d = 0; d < e->ndim; d++)
            if (!cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[d])))
                goto out_nomem;
        if (!cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off)) ||
            !cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes))))
            goto out_nomem;
        off += bytes;
    }
    w->total = off;
    header = cJSON_PrintUnformatted(root);
    if (!header) goto out_nomem;
    size_t hlen = strlen(header);
    size_t padded = (hlen + 7) & ~(size_t)7; /* data starts 8-byte aligned */
    w->data_start = 8 + padded;
    if ((st = zo_file_create(&w->out, path)) != ZO_OK) goto out_free;
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    if ((st = zo_file_append(&w->out, lenbuf, 8)) != ZO_OK ||
        (st = zo_file_append(&w->out, header, hlen)) != ZO_OK ||
        (st = zo_file_append(&w->out, "       ", padded - hlen)) != ZO_OK) {
        zo_file_abort(&w->out);
        goto out_free;
    }
    free(header);
    cJSON_Delete(root);
    *wo = w;
    return ZO_OK;
out_nomem:
    st = zo_error(ZO_ERR_NOMEM, "%s: cannot build the header", path);
out_free:
    free(header);
    cJSON_Delete(root);
    if (w) writer_release(w);
    return st;
}

zo_status model_st_writer_put(model_st_writer *w, int index, uint64_t first, uint64_t count,
                              const void *src)
{
    if (index < 0 || index >= w->n || first > w->numel[index] || count > w->numel[index] - first)
        return zo_error(ZO_ERR_INVALID, "%s: elements %llu..%llu of tensor %d are outside it",
                        w->out.path, (unsigned long long)first, (unsigned long long)(first + count), index);
    uint64_t at = w->data_start + w->begin[index] + first * w->esz[index];
    size_t left = (size_t)(count * w->esz[index]);
    const char *p = src;
    while (left) {
        ssize_t r = pwrite(w->out.fd, p, left > (1u << 30) ? (1u << 30) : left, (off_t)at);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return zo_error(ZO_ERR_IO, "%s: tensor \"%s\": write at byte %llu: %s", w->out.tmp_path,
                            w->names[index], (unsigned long long)at, strerror(errno));
        p += r;
        at += (uint64_t)r;
        left -= (size_t)r;
        w->put += (uint64_t)r;
    }
    return ZO_OK;
}

zo_status model_st_writer_commit(model_st_writer *w)
{
    zo_status st;
    if (w->put != w->total) {
        st = zo_error(ZO_ERR_INTERNAL, "%s: %llu of %llu data bytes were written", w->out.path,
                      (unsigned long long)w->put, (unsigned long long)w->total);
        zo_file_abort(&w->out);
    } else {
        st = zo_file_commit(&w->out);
    }
    writer_release(w);
    return st;
}

void model_st_writer_abort(model_st_writer *w)
{
    if (!w) return;
    zo_file_abort(&w->out);
    writer_release(w);
}

zo_status model_st_write(const char *path, const model_st_entry *entries, int n,
                         model_st_fill_fn fill, void *ctx)
{
    for (int i = 0; i < n; i++)
        if (!entries[i].data && !fill)
            return zo_error(ZO_ERR_INVALID, "%s: tensor \"%s\": no data and no fill function", path,
                            entries[i].name);
    model_st_writer *w;
    zo_status st = model_st_writer_open(&w, path, entries, n);
    if (st != ZO_OK) return st;
    uint8_t *chunk = malloc(WRITE_CHUNK_BYTES);
    if (!chunk) {
        model_st_writer_abort(w);
        return zo_error(ZO_ERR_NOMEM, "%s: cannot allocate a write buffer", path);
    }
    for (int i = 0; i < n && st == ZO_OK; i++) {
        const model_st_entry *e = &entries[i];
        if (e->data) {
            st = model_st_writer_put(w, i, 0, w->numel[i], e->data);
            continue;
        }
        uint64_t per = WRITE_CHUNK_BYTES / w->esz[i];
        for (uint64_t first = 0; first < w->numel[i] && st == ZO_OK; first += per) {
            uint64_t count = w->numel[i] - first < per ? w->numel[i] - first : per;
            if ((st = fill(ctx, i, first, count, chunk)) != ZO_OK)
                zo_error_wrap(st, "%s: tensor \"%s\"", path, e->name);
            else
                st = model_st_writer_put(w, i, first, count, chunk);
        }
    }
    free(chunk);
    if (st != ZO_OK) {
        model_st_writer_abort(w);
        return st;
    }
    return model_st_writer_commit(w);
}

/* ---- checkpoints ------------------------------------------------------------- */

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp(((const model_ckpt_entry *)a)->name, ((const model_ckpt_entry *)b)->name);
}

static char *join_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Shard names from an index, deduplicated, in first-seen order. */
static zo_status read_index(const char *path, cJSON **root_out, char ***shards_out, int *n_out)
{
    zo_status st;
    char *text = NULL;
    size_t len = 0;
    if ((st = zo_file_read_all(path, 64u << 20, "a checkpoint index", &text, &len)) != ZO_OK)
        return st;
    cJSON *root;
    if ((st = zo_json_parse(text, len, path, &root)) != ZO_OK) goto out_free_text;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        st = zo_error(ZO_ERR_FORMAT, "%s: missing object \"weight_map\"", path);
        goto out_free_root;
    }
    int cap = cJSON_GetArraySize(wm);
    char **shards = calloc(cap ? (size_t)cap : 1, sizeof *shards);
    if (!shards) {
        st = zo_error(ZO_ERR_NOMEM, "%s: cannot allocate shard list", path);
        goto out_free_root;
    }
    int n = 0;
    for (const cJSON *e = wm->child; e; e = e->next) {
        /* a file beside the index: no absolute path, no way up out of its directory */
        if (!cJSON_IsString(e) || !e->valuestring[0] || e->valuestring[0] == '/' ||
            strstr(e->valuestring, "..")) {
            st = zo_error(ZO_ERR_FORMAT,
                          "%s: weight_map: tensor \"%s\": shard must be a file name beside the index "
                          "(no '/' at the start, no '..')",
                          path, e->string);
            goto out_free_shards;
        }
        int seen = 0;
        for (int i = 0; i < n && !seen; i++) seen = !strcmp(shards[i], e->valuestring);
        if (!seen) shards[n++] = e->valuestring; /* owned by root */
    }
    *root_out = root;
    *shards_out = shards;
    *n_out = n;
    free(text);
    return ZO_OK;
out_free_shards:
    free(shards);
out_free_root:
    cJSON_Delete(root);
out_free_text:
    free(text);
    return st;
}

static zo_status ckpt_build_entries(model_ckpt *c)
{
    int n = 0;
    for (int i = 0; i < c->n_files; i++) n += c->files[i].n_tensors;
    c->entries = calloc(n ? (size_t)n : 1, sizeof *c->entries);
    if (!c->entries) return zo_error(ZO_ERR_NOMEM, "%s: cannot index %d tensors", c->path, n);
    for (int i = 0; i < c->n_files; i++) {
        for (int j = 0; j < c->files[i].n_tensors; j++) {
            model_ckpt_entry *e = &c->entries[c->n_entries++];
            e->tensor = &c->files[i].tensors[j];
            e->name = e->tensor->name;
            e->file = i;
        }
    }
    qsort(c->entries, (size_t)n, sizeof *c->entries, cmp_entry_name);
    for (int i = 1; i < n; i++)
        if (!strcmp(c->entries[i - 1].name, c->entries[i].name))
            return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\" is in both %s and %s", c->path,
                            c->entries[i].name, c->files[c->entries[i - 1].file].path,
                            c->files[c->entries[i].file].path);
    return ZO_OK;
}

static zo_status ckpt_open_index(model_ckpt *c, const char *index)
{
    zo_status st;
    cJSON *root = NULL;
    char **shards = NULL;
    int n = 0;
    if ((st = read_index(index, &root, &shards, &n)) != ZO_OK) return st;
    char *dcopy = strdup(index);
    if (!dcopy) {
        st = zo_error(ZO_ERR_NOMEM, "%s: cannot copy the path", index);
        goto out_free_index;
    }
    const char *dir = dirname(dcopy);
    c->files = calloc(n ? (size_t)n : 1, sizeof *c->files);
    if (!c->files) {
        st = zo_error(ZO_ERR_NOMEM, "%s: cannot allocate %d shards", index, n);
        goto out_free_dir;
    }
    for (int i = 0; i < n; i++) {
        char *p = join_path(dir, shards[i]);
        if (!p) {
            st = zo_error(ZO_ERR_NOMEM, "%s: cannot build a shard path", index);
            goto out_free_dir;
        }
        st = model_st_open(&c->files[i], p);
        free(p);
        if (st) {
            zo_error_wrap(st, "%s: shard %d of %d", index, i + 1, n);
            goto out_free_dir;
        }
        c->n_files++;
    }
    if ((st = ckpt_build_entries(c)) != ZO_OK) goto out_free_dir;
    /* every tensor of the weight map is in the shard the map names */
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    for (const cJSON *e = wm->child; e; e = e->next) {
        const model_ckpt_entry *ce = model_ckpt_find(c, e->string);
        const char *base = ce ? strrchr(c->files[ce->file].path, '/') : NULL;
        base = base ? base + 1 : (ce ? c->files[ce->file].path : NULL);
        const char *want = strrchr(e->valuestring, '/');
        want = want ? want + 1 : e->valuestring;
        if (!ce || strcmp(base, want)) {
            st = zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": weight_map names shard %s, %s", index,
                          e->string, e->valuestring,
                          ce ? "but it is in another shard" : "which does not hold it");
            goto out_free_dir;
        }
    }
out_free_dir:
    free(dcopy);
out_free_index:
    free(shards);
    cJSON_Delete(root);
    return st;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

zo_status model_ckpt_open(model_ckpt *c, const char *path)
{
    zo_status st;
    memset(c, 0, sizeof *c);
    c->path = strdup(path);
    if (!c->path) return zo_error(ZO_ERR_NOMEM, "%s: cannot copy the path", path);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        st = zo_error(errno == ENOENT ? ZO_ERR_NOT_FOUND : ZO_ERR_IO, "%s: %s", path,
                      strerror(errno));
        goto out_close;
    }
    if (S_ISDIR(sb.st_mode)) {
        char *index = join_path(path, "model.safetensors.index.json");
        char *single = join_path(path, "model.safetensors");
        if (!index || !single) {
            free(index);
            free(single);
            st = zo_error(ZO_ERR_NOMEM, "%s: cannot build a path", path);
            goto out_close;
        }
        if (access(index, F_OK) == 0) {
            st = ckpt_open_index(c, index);
        } else if (access(single, F_OK) == 0) {
            c->files = calloc(1, sizeof *c->files);
            st = c->files ? model_st_open(&c->files[0], single)
                          : zo_error(ZO_ERR_NOMEM, "%s: cannot allocate", path);
            if (!st) {
                c->n_files = 1;
                st = ckpt_build_entries(c);
            }
        } else {
            st = zo_error(ZO_ERR_NOT_FOUND,
                          "%s: holds neither model.safetensors.index.json nor model.safetensors",
                          path);
        }
        free(index);
        free(single);
    } else if (ends_with(path, ".json")) {
        st = ckpt_open_index(c, path);
    } else {
        c->files = calloc(1, sizeof *c->files);
        st = c->files ? model_st_open(&c->files[0], path)
                      : zo_error(ZO_ERR_NOMEM, "%s: cannot allocate", path);
        if (!st) {
            c->n_files = 1;
            st = ckpt_build_entries(c);
        }
    }
    if (st) goto out_close;
    return ZO_OK;
out_close:
    model_ckpt_close(c);
    return st;
}

void model_ckpt_close(model_ckpt *c)
{
    for (int i = 0; i < c->n_files; i++) model_st_close(&c->files[i]);
    free(c->files);
    free(c->entries);
    free(c->path);
    memset(c, 0, sizeof *c);
}

const model_ckpt_entry *model_ckpt_find(const model_ckpt *c, const char *name)
{
    model_ckpt_entry key = {.name = name};
    return bsearch(&key, c->entries, (size_t)c->n_entries, sizeof *c->entries, cmp_entry_name);
}
