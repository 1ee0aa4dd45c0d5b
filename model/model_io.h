/* Helpers shared inside model/: dtype conversion of row blocks. (Atomic
 * writes and whole-file reads are common/fileio.h's.) */
#ifndef ZO_MODEL_IO_H
#define ZO_MODEL_IO_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"  /* defines: zo_dtype */
#include "common/status.h" /* defines: zo_status */

/* Convert rows x cols elements of sdt at src (any alignment) to dt at dst;
 * with `transpose`, src [rows, cols] lands as the first rows columns of dst
 * [cols, ld] (ld >= rows: a band of rows of a larger matrix; ld is not used
 * without transpose). */
zo_status model_io_convert_rows(void *dst, zo_dtype dt, const uint8_t *src, zo_dtype sdt,
                                uint64_t rows, uint64_t cols, uint64_t ld, int transpose);

#endif
