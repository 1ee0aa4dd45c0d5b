/* Whole files in and out: a file written under a temporary name and renamed
 * into place (so a reader never sees half of it and a failure leaves the old
 * file untouched), and a bounded read of a whole small file. Messages name
 * the file and the call that failed. */
#ifndef ZO_COMMON_FILEIO_H
#define ZO_COMMON_FILEIO_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/status.h" /* defines: zo_status */

/* A file being written as "<path>.tmp.<pid>", next to its final path. */
typedef struct zo_file_writer {
    char *path;     /* final name */
    char *tmp_path; /* "<path>.tmp.<pid>" */
    int fd;
    uint64_t written;
} zo_file_writer;

/* Create the temporary file for writing. */
zo_status zo_file_create(zo_file_writer *f, const char *path);
/* Write all of buf (retrying short writes and EINTR). */
zo_status zo_file_append(zo_file_writer *f, const void *buf, size_t len);
/* fsync, close, rename over `path`, fsync the directory; frees f. On failure
 * the temporary file is removed. */
zo_status zo_file_commit(zo_file_writer *f);
/* Close and remove the temporary file; frees f. */
void zo_file_abort(zo_file_writer *f);

/* `len` bytes of buf as the whole of `path`, atomically (create, append,
 * commit). */
zo_status zo_file_write_all(const char *path, const void *buf, size_t len);

/* doc as cJSON prints it, and a newline, as the whole of `path`
 * (zo_file_write_all); a NULL doc (one that could not be built) or no memory
 * to print it is ZO_ERR_NOMEM. */
zo_status zo_file_write_json(const char *path, const cJSON *doc);

/* Read the whole of `path` (a regular file, a pipe or a device) into a
 * NUL-terminated buffer the caller frees; *len (may be NULL) gets its bytes.
 * More than `limit` bytes is ZO_ERR_FORMAT, "<path>: N bytes is too large
 * for <what> (at most <limit>)"; a file that cannot be opened or read is
 * ZO_ERR_IO with the system's reason. */
zo_status zo_file_read_all(const char *path, size_t limit, const char *what, char **out,
                           size_t *len);

#endif
