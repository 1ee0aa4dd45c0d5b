/* The swap store: named tensors in files on one or more drives.
 *
 * A store owns one file per directory given (<dir>/<prefix>-<16 hex
 * digits>.<k>.swap; a directory may be named twice for two files on it).
 * The hex digits are random, so runs sharing a directory never share a
 * file, not even runs in separate pid namespaces; each file is created
 * exclusively (never over a file, never through a link planted under its
 * name), locked (flock) for the store's life, and removed when the store is
 * freed. A run that was killed leaves its files behind, unlocked: the next
 * store with the same prefix in the directory removes them at init (a live
 * run's files are locked and left alone). The store's address
 * space is striped over the files in `stripe_size` units, so a large tensor
 * is read from every drive at once. Tensors start at NVME_ALIGN-aligned
 * addresses.
 *
 * Every `checksum_block` bytes of a tensor carry an xxHash (XXH3-64) computed
 * when the tensor is written and verified when it is read; a mismatch is
 * ZO_ERR_CHECKSUM naming the tensor, the block, the file and the offset.
 * Checksums live in memory: the store holds swap for the life of a process,
 * not a checkpoint.
 *
 * Capacity is checked when tensors are added, for all of them at once: the
 * free space of each file system (and the process's file-size limit) against
 * what its files must grow by, with a message naming the directory, what is
 * needed and what is free. With `preallocate` the space is reserved then
 * (fallocate), so later writes cannot run out of it.
 *
 * A failed write (ENOSPC, EIO, ...) is returned with the tensor's name and
 * the errno; the tensor is then marked unwritten (reading it is an error until
 * a write succeeds) and the store stays usable. */
#ifndef ZO_NVME_STORE_H
#define ZO_NVME_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h" // defines: zo_status
#include "nvme_engine.h"   // defines: nvme_engine_t, nvme_io

typedef struct nvme_store nvme_store_t;

typedef struct nvme_store_config {
    const char *const *dirs;  /* one file per entry; at least one */
    int ndirs;
    const char *prefix;       /* file name prefix; NULL = "zo-swap" */
    size_t stripe_size;       /* 0 = the engine's block size; a multiple of NVME_ALIGN */
    size_t checksum_block;    /* 0 = stripe_size; a multiple of NVME_ALIGN */
    int preallocate;          /* reserve disk space when tensors are added */
    int keep_files;           /* do not delete the files at nvme_store_free (unlocked
                                 then: the next store's sweep removes them) */
} nvme_store_config;

zo_status nvme_store_init(nvme_store_t **out, nvme_engine_t *engine, const nvme_store_config *cfg);
/* Swap files of dead runs removed by nvme_store_init. */
int nvme_store_stale_removed(const nvme_store_t *s);
/* Remove <dir>/<prefix>-<16 hex>.<k>.swap files that no process holds
 * locked (their run died), when they are regular files of this user; any
 * other name, a link, a live run's file is left alone. *removed (may be
 * NULL) counts them. */
zo_status nvme_store_remove_stale(const char *dir, const char *prefix, int *removed);
/* Closes (and unless keep_files removes) the files; no op may be in flight. */
void nvme_store_free(nvme_store_t *s);

/* Add n tensors at once; ids[i] receives each one's id. Names must be unique
 * (at most 127 bytes). On ZO_ERR_CAPACITY nothing is added. */
zo_status nvme_store_add(nvme_store_t *s, size_t n, const char *const *names,
                         const size_t *nbytes, int *ids);
zo_status nvme_store_find(const nvme_store_t *s, const char *name, int *id);
const char *nvme_store_name(const nvme_store_t *s, int id);
size_t nvme_store_nbytes(const nvme_store_t *s, int id);
/* Bytes the store's address space spans (what the files hold together). */
uint64_t nvme_store_footprint(const nvme_store_t *s);
int nvme_store_nfiles(const nvme_store_t *s);
/* Engine file id of file k, and the file and offset of a tensor's byte. */
int nvme_store_file_id(const nvme_store_t *s, int k);
void nvme_store_locate(const nvme_store_t *s, int id, uint64_t byte, int *file_k,
                       uint64_t *file_offset);
nvme_engine_t *nvme_store_engine(const nvme_store_t *s);

/* An asynchronous whole-tensor read or write. */
typedef struct nvme_store_op {
    int id;
    nvme_op_kind op;
    void *buf;
    size_t nios;
    nvme_io *ios;          /* one per stripe piece; a read's also cut every few
                              checksum blocks (NVME_STORE_READ_PIECES) */
    uint64_t *sums;        /* checksums of a write, committed when it succeeds */
    size_t arrived_io;     /* a read: ios [0, arrived_io) completed, in order */
    size_t verified;       /* a read: checksum blocks [0, verified) checked */
    int mismatch;          /* a read: block `verified` did not match (finish reports it) */
} nvme_store_op;

/* A read is cut into at most this many pieces of whole checksum blocks (and
 * at stripe boundaries), so that nvme_store_wait checks the blocks that have
 * arrived while the rest are still on their way: the hashing overlaps the
 * disk instead of following it. */
#define NVME_STORE_READ_PIECES 64

/* Queue the transfer of tensor `id` to or from buf (nbytes of it; an aligned
 * buffer from nvme_buf_alloc goes straight to the disk). A write computes
 * the checksums now; buf must not change until the op is finished. */
zo_status nvme_store_submit(nvme_store_t *s, int id, nvme_op_kind op, void *buf,
                            nvme_store_op *o);
/* 1 when every piece of the op has completed (drive the engine meanwhile). */
int nvme_store_op_complete(const nvme_store_op *o);
/* For a complete op: verify a read's checksums, or commit a write's; release
 * the op. Returns the op's status with a message naming the tensor. */
zo_status nvme_store_finish(nvme_store_t *s, nvme_store_op *o);
/* Drive the engine until the op is complete, then finish it. A read's
 * checksums are checked piece by piece as the pieces arrive (in order),
 * the disk still reading the rest; finish checks what is left. */
zo_status nvme_store_wait(nvme_store_t *s, nvme_store_op *o);

/* Synchronous forms. */
zo_status nvme_store_write(nvme_store_t *s, int id, const void *buf);
zo_status nvme_store_read(nvme_store_t *s, int id, void *buf);

#endif
