/* File helpers shared inside model/: atomic writes (temporary name, fsync,
 * rename), small whole-file reads, and dtype conversion of row blocks. */
#ifndef ZO_MODEL_IO_H
#define ZO_MODEL_IO_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"  /* defines: zo_dtype */
#include "common/status.h" /* defines: zo_status */

/* A file being written under a temporary name next to its final path. */
typedef struct model_io_file {
    char *path;     /* final name */
    char *tmp_path; /* "<path>.tmp.<pid>" */
    int fd;
    uint64_t written;
} model_io_file;

/* Create "<path>.tmp.<pid>" for writing. */
zo_status model_io_create(model_io_file *f, const char *path);
/* Write all of buf (retrying short writes and EINTR). */
zo_status model_io_append(model_io_file *f, const void *buf, size_t len);
/* fsync, close, rename over `path`, fsync the directory; frees f. On failure
 * the temporary file is removed. */
zo_status model_io_commit(model_io_file *f);
/* Close and remove the temporary file; frees f. */
void model_io_abort(model_io_file *f);

/* Read a whole file of at most `limit` bytes into a NUL-terminated buffer
 * the caller frees. */
zo_status model_io_read_small(const char *path, size_t limit, char **out, size_t *len);

/* Convert rows x cols elements of sdt at src (any alignment) to dt at dst;
 * with `transpose`, src [rows, cols] lands as dst [cols, rows]. */
zo_status model_io_convert_rows(void *dst, zo_dtype dt, const uint8_t *src, zo_dtype sdt,
                                uint64_t rows, uint64_t cols, int transpose);

#endif
