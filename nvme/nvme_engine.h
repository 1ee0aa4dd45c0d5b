/* The io_uring I/O engine under the NVMe swap store.
 *
 * One engine owns one io_uring and a table of files. A transfer (nvme_io) is
 * any byte range of one file; the engine splits it into block-size requests
 * and keeps up to `queue_depth` of them in flight across every queued
 * transfer, submitting in batches (one io_uring_submit per refill). Every
 * completion is handled: -EAGAIN/-EINTR are resubmitted, short transfers are
 * advanced and requeued, other errors end the transfer with a status whose
 * message carries the errno, the file and the offset.
 *
 * Files are opened with O_DIRECT. Requests whose offset, length and buffer are
 * not 4 KiB aligned, and every request on a file system that refuses
 * O_DIRECT, go through a second, buffered descriptor of the same file, and a
 * buffered write is followed by fdatasync before the transfer counts as done
 * (so a full disk or a write-back error is reported, not lost). The engine
 * notes the fallback once (nvme_engine_notes); it never prints.
 *
 * Buffers from nvme_buf_alloc are 4 KiB aligned and registered with the ring
 * (fixed buffers, pinned by the kernel) when the kernel allows; files are
 * registered too. Both are optimisations: the engine works without them.
 *
 * Threading: an engine is used by one thread at a time. nvme_engine_wakeup is
 * the exception: any thread may call it to end another thread's
 * nvme_engine_progress(e, 1) wait. No thread is created per request. */
#ifndef ZO_NVME_ENGINE_H
#define ZO_NVME_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h" // defines: zo_status

#define NVME_ALIGN 4096u                    /* O_DIRECT alignment of offsets, lengths, buffers */
#define NVME_DEFAULT_BLOCK (1u << 20)       /* request size */
#define NVME_DEFAULT_QUEUE_DEPTH 32u
#define NVME_MAX_FILES 128

typedef struct nvme_engine nvme_engine_t;

typedef enum nvme_op_kind {
    NVME_OP_READ = 0,
    NVME_OP_WRITE,
    NVME_OP_FSYNC,
} nvme_op_kind;

/* Test seam: called with every completion before the engine looks at it;
 * returns the result the engine should see instead of `res` (e.g. half of it
 * for a short transfer, -EAGAIN, -EIO, -ENOSPC). The real I/O has happened;
 * only its reported outcome changes. */
typedef struct nvme_fault_info {
    nvme_op_kind op;
    int fid;
    const char *path;
    uint64_t offset;
    size_t len;
} nvme_fault_info;
typedef int (*nvme_fault_fn)(void *user, const nvme_fault_info *info, int res);

typedef struct nvme_engine_config {
    unsigned queue_depth;   /* requests in flight; 0 = NVME_DEFAULT_QUEUE_DEPTH; 1..4096 */
    size_t block_size;      /* request size; 0 = NVME_DEFAULT_BLOCK; a multiple of NVME_ALIGN */
    int buffered;           /* 1: never use O_DIRECT (as if the file system refused it) */
    int no_register;        /* 1: do not register buffers and files */
    nvme_fault_fn fault;    /* (optional) test seam */
    void *fault_user;
} nvme_engine_config;

/* A transfer. The caller fills the first five fields and keeps the struct
 * alive (and the buffer untouched) until nvme_io_done() says it finished. */
typedef struct nvme_io {
    int fid;
    nvme_op_kind op;     /* NVME_OP_READ or NVME_OP_WRITE */
    void *buf;
    size_t len;
    uint64_t offset;
    /* filled by the engine */
    zo_status status;    /* ZO_OK, or the first error */
    char error[320];     /* message for status != ZO_OK */
    size_t bytes_done;
    /* private */
    size_t next_;        /* bytes handed to requests so far */
    unsigned inflight_;
    int state_;          /* 0 idle, 1 queued, 2 syncing, 3 done */
    int buffered_write_; /* a request went through the buffered descriptor */
    struct nvme_io *next_pending_;
} nvme_io;

/* Counters since init (for benchmarks and tests). */
typedef struct nvme_engine_stats {
    uint64_t requests;      /* requests submitted, retries included */
    uint64_t retries;       /* -EAGAIN/-EINTR resubmissions */
    uint64_t short_requeues;
    uint64_t submits;       /* io_uring_submit calls */
    uint64_t fixed_requests;/* requests that used a registered buffer */
    uint64_t buffered_requests;
} nvme_engine_stats;

zo_status nvme_engine_init(nvme_engine_t **out, const nvme_engine_config *cfg);
void nvme_engine_free(nvme_engine_t *e);
size_t nvme_engine_block_size(const nvme_engine_t *e);
unsigned nvme_engine_queue_depth(const nvme_engine_t *e);
/* One-time notes (O_DIRECT refused, registration unavailable), "" if none;
 * programs print them, the library does not. */
const char *nvme_engine_notes(const nvme_engine_t *e);
void nvme_engine_get_stats(const nvme_engine_t *e, nvme_engine_stats *out);

/* Files. NVME_FILE_CREATE creates the file (mode 0600) if missing;
 * NVME_FILE_TRUNC empties it; NVME_FILE_EXCL creates it, and it must not
 * exist before (a link in its place is not followed: an error, as is any
 * file there). */
enum { NVME_FILE_CREATE = 1, NVME_FILE_TRUNC = 2, NVME_FILE_EXCL = 4 };
zo_status nvme_file_open(nvme_engine_t *e, const char *path, int flags, int *fid);
/* A file the caller has open (read-write) as `fd`, named `path` in
 * messages: the engine opens descriptors of its own on that same file
 * (through /proc/self/fd, else the name, checked to lead to the same file),
 * never on another one that the name leads to meanwhile. A flock the caller
 * holds on fd stays the caller's: it goes when the caller closes fd, at
 * once, even when the process is killed (the ring's references to its own
 * descriptors are dropped later). */
zo_status nvme_file_open_fd(nvme_engine_t *e, int fd, const char *path, int *fid);
zo_status nvme_file_close(nvme_engine_t *e, int fid);
const char *nvme_file_path(const nvme_engine_t *e, int fid);
int nvme_file_is_direct(const nvme_engine_t *e, int fid);
/* Reserve [0, size) on disk (fallocate; ENOSPC is ZO_ERR_CAPACITY). */
zo_status nvme_file_allocate(nvme_engine_t *e, int fid, uint64_t size);
zo_status nvme_file_size(nvme_engine_t *e, int fid, uint64_t *size);

/* Aligned host buffers, registered with the ring when possible. A buffer is
 * zero-filled. */
zo_status nvme_buf_alloc(nvme_engine_t *e, size_t size, void **out);
void nvme_buf_free(nvme_engine_t *e, void *p);

/* Asynchronous transfers: queue, then drive the engine until done. */
zo_status nvme_io_submit(nvme_engine_t *e, nvme_io *io);
int nvme_io_done(const nvme_io *io);
/* Refill the queue, submit, and handle completions; with wait=1 blocks until
 * at least one completion (or a wakeup) arrived. ZO_OK unless the ring itself
 * failed: transfer errors are in each nvme_io. */
zo_status nvme_engine_progress(nvme_engine_t *e, int wait);
/* Drive until `io` is done; returns its status (message recorded). */
zo_status nvme_io_wait(nvme_engine_t *e, nvme_io *io);
/* Number of transfers queued or in flight. */
unsigned nvme_engine_busy(const nvme_engine_t *e);

/* Thread-safe: make a concurrent nvme_engine_progress(e, 1) return. */
void nvme_engine_wakeup(nvme_engine_t *e);

/* Synchronous helpers: one transfer, waited for. */
zo_status nvme_read(nvme_engine_t *e, int fid, void *buf, size_t len, uint64_t offset);
zo_status nvme_write(nvme_engine_t *e, int fid, const void *buf, size_t len, uint64_t offset);

#endif
