/* Atomic writes and bounded whole-file reads. */
#include "common/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void writer_free(zo_file_writer *f)
{
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    free(f->tmp_path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

zo_status zo_file_create(zo_file_writer *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    size_t n = strlen(path) + 32;
    f->path = strdup(path);
    f->tmp_path = malloc(n);
    if (!f->path || !f->tmp_path) {
        writer_free(f);
        return zo_error(ZO_ERR_NOMEM, "%s: cannot copy the path", path);
    }
    snprintf(f->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    f->fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        zo_status st = zo_error(ZO_ERR_IO, "%s: cannot create: %s", f->tmp_path, strerror(errno));
        writer_free(f);
        return st;
    }
    return ZO_OK;
}

zo_status zo_file_append(zo_file_writer *f, const void *buf, size_t len)
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

zo_status zo_file_commit(zo_file_writer *f)
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
    writer_free(f);
    return ZO_OK;
out_abort:
    zo_file_abort(f);
    return st;
}

void zo_file_abort(zo_file_writer *f)
{
    if (f->tmp_path) unlink(f->tmp_path);
    writer_free(f);
}

zo_status zo_file_write_all(const char *path, const void *buf, size_t len)
{
    zo_file_writer f;
    zo_status st = zo_file_create(&f, path);
    if (st != ZO_OK) return st;
    if ((st = zo_file_append(&f, buf, len)) != ZO_OK) {
        zo_file_abort(&f);
        return st;
    }
    return zo_file_commit(&f);
}

zo_status zo_file_write_json(const char *path, const cJSON *doc)
{
    char *text = doc ? cJSON_Print(doc) : NULL;
    if (!text) return zo_error(ZO_ERR_NOMEM, "%s: out of memory building JSON", path);
    size_t n = strlen(text);
    text[n] = '\n'; /* replaces the NUL: the file ends with a newline */
    zo_status st = zo_file_write_all(path, text, n + 1);
    free(text);
    return st;
}

/* read(2) retried on EINTR: bytes read, 0 at the end, -1 on error. */
static ssize_t read_some(int fd, void *buf, size_t len)
{
    for (;;) {
        ssize_t r = read(fd, buf, len);
        if (r >= 0 || errno != EINTR) return r;
    }
}

zo_status zo_file_read_all(const char *path, size_t limit, const char *what, char **out,
                           size_t *len)
{
    *out = NULL;
    if (len) *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zo_error(ZO_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    zo_status st = ZO_OK;
    char *buf = NULL;
    size_t cap = 1 << 16, n = 0; /* buf holds cap bytes, the last for the NUL */
    struct stat sb;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
        if ((uint64_t)sb.st_size > limit) {
            st = zo_error(ZO_ERR_FORMAT, "%s: %lld bytes is too large for %s (at most %zu)", path,
                          (long long)sb.st_size, what, limit);
            goto out_close;
        }
        cap = (size_t)sb.st_size + 1; /* the whole file, unless it grows */
    }
    if (cap > limit + 1) cap = limit + 1; /* a pipe: never read past the limit */
    if (!(buf = malloc(cap))) goto out_nomem;
    for (;;) {
        if (n + 1 == cap) { /* full: one more byte says whether the file goes on */
            char probe;
            ssize_t r = read_some(fd, &probe, 1);
            if (r < 0) goto out_read_error;
            if (r == 0) break;
            if (n + 1 > limit) {
                st = zo_error(ZO_ERR_FORMAT, "%s: more than %zu bytes is too large for %s", path,
                              limit, what);
                goto out_free;
            }
            size_t ncap = cap > limit / 2 ? limit + 1 : 2 * cap;
            char *nb = realloc(buf, ncap);
            if (!nb) goto out_nomem;
            buf = nb;
            cap = ncap;
            buf[n++] = probe;
            continue;
        }
        ssize_t r = read_some(fd, buf + n, cap - 1 - n);
        if (r < 0) goto out_read_error;
        if (r == 0) break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    goto out_close;
out_read_error:
    st = zo_error(ZO_ERR_IO, "%s: read: %s", path, strerror(errno));
    goto out_free;
out_nomem:
    st = zo_error(ZO_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, cap);
out_free:
    free(buf);
out_close:
    close(fd);
    return st;
}
