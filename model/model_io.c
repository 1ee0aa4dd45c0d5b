#include "model_io.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void io_file_free(model_io_file *f)
{
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    free(f->tmp_path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

zo_status model_io_create(model_io_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    size_t n = strlen(path) + 32;
    f->path = strdup(path);
    f->tmp_path = malloc(n);
    if (!f->path || !f->tmp_path) {
        io_file_free(f);
        return zo_error(ZO_ERR_NOMEM, "%s: cannot copy the path", path);
    }
    snprintf(f->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    f->fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        zo_status st = zo_error(ZO_ERR_IO, "%s: cannot create: %s", f->tmp_path, strerror(errno));
        io_file_free(f);
        return st;
    }
    return ZO_OK;
}

zo_status model_io_append(model_io_file *f, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t w = write(f->fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return zo_error(ZO_ERR_IO, "%s: write at byte %llu: %s", f->tmp_path,
                            (unsigned long long)f->written, strerror(errno));
        }
        p += w;
        len -= (size_t)w;
        f->written += (uint64_t)w;
    }
    return ZO_OK;
}

zo_status model_io_commit(model_io_file *f)
{
    zo_status st = ZO_OK;
    if (fsync(f->fd) != 0) {
        st = zo_error(ZO_ERR_IO, "%s: fsync: %s", f->tmp_path, strerror(errno));
        goto out_abort;
    }
    int fd = f->fd;
    f->fd = -1;
    if (close(fd) != 0) {
        st = zo_error(ZO_ERR_IO, "%s: close: %s", f->tmp_path, strerror(errno));
        goto out_abort;
    }
    if (rename(f->tmp_path, f->path) != 0) {
        st = zo_error(ZO_ERR_IO, "rename %s -> %s: %s", f->tmp_path, f->path, strerror(errno));
        goto out_abort;
    }
    /* make the rename itself durable */
    char *dcopy = strdup(f->path);
    if (dcopy) {
        int dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(dcopy);
    }
    io_file_free(f);
    return ZO_OK;
out_abort:
    model_io_abort(f);
    return st;
}

void model_io_abort(model_io_file *f)
{
    if (f->tmp_path) unlink(f->tmp_path);
    io_file_free(f);
}

zo_status model_io_read_small(const char *path, size_t limit, char **out, size_t *len)
{
    zo_status st = ZO_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zo_error(errno == ENOENT ? ZO_ERR_NOT_FOUND : ZO_ERR_IO, "%s: cannot open: %s",
                        path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = zo_error(ZO_ERR_IO, "%s: fstat: %s", path, strerror(errno));
        goto out_close;
    }
    if ((uint64_t)sb.st_size > limit) {
        st = zo_error(ZO_ERR_FORMAT, "%s: %lld bytes is larger than the %zu allowed", path,
                      (long long)sb.st_size, limit);
        goto out_close;
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        st = zo_error(ZO_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, n + 1);
        goto out_close;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            st = r < 0 ? zo_error(ZO_ERR_IO, "%s: read: %s", path, strerror(errno))
                       : zo_error(ZO_ERR_IO, "%s: short read: %zu of %zu bytes", path, got, n);
            free(buf);
            goto out_close;
        }
        got += (size_t)r;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
out_close:
    close(fd);
    return st;
}

/* One element of type t at byte pointer p (possibly unaligned), as fp32. */
static inline float load_any(const uint8_t *p, zo_dtype t)
{
    if (t == ZO_DTYPE_F32) {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return t == ZO_DTYPE_F16 ? zo_f16_to_f32(h) : zo_bf16_to_f32(h);
}

zo_status model_io_convert_rows(void *dst, zo_dtype dt, const uint8_t *src, zo_dtype sdt,
                                uint64_t rows, uint64_t cols, int transpose)
{
    size_t ssz = zo_dtype_size(sdt), dsz = zo_dtype_size(dt);
    uint64_t n = rows * cols;
    if (!transpose) {
        if (sdt == dt) {
            memcpy(dst, src, (size_t)(n * ssz));
        } else if (((uintptr_t)src % ssz) == 0) {
            zo_convert(dst, dt, src, sdt, (size_t)n);
        } else {
            for (uint64_t i = 0; i < n; i++) zo_store_f32(dst, dt, (size_t)i, load_any(src + i * ssz, sdt));
        }
        return ZO_OK;
    }
    /* src [rows, cols] -> dst [cols, rows], in 32 x 32 tiles so both sides
     * stay in cache; each dst row segment is written in order */
    uint8_t *d = dst;
    for (uint64_t r0 = 0; r0 < rows; r0 += 32) {
        uint64_t r1 = r0 + 32 < rows ? r0 + 32 : rows;
        for (uint64_t c0 = 0; c0 < cols; c0 += 32) {
            uint64_t c1 = c0 + 32 < cols ? c0 + 32 : cols;
            for (uint64_t c = c0; c < c1; c++) {
                const uint8_t *s = src + c * ssz;
                uint8_t *drow = d + c * rows * dsz;
                if (sdt == dt && dsz == 4) {
                    for (uint64_t r = r0; r < r1; r++) {
                        uint32_t v;
                        memcpy(&v, s + r * cols * 4, 4);
                        memcpy(drow + r * 4, &v, 4);
                    }
                } else if (sdt == dt) {
                    for (uint64_t r = r0; r < r1; r++) {
                        uint16_t v;
                        memcpy(&v, s + r * cols * 2, 2);
                        memcpy(drow + r * 2, &v, 2);
                    }
                } else {
                    for (uint64_t r = r0; r < r1; r++)
                        zo_store_f32(dst, dt, (size_t)(c * rows + r), load_any(s + r * cols * ssz, sdt));
                }
            }
        }
    }
    return ZO_OK;
}
