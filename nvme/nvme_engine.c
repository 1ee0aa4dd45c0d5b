/* io_uring engine: transfers split into block-size requests, kept
 * queue_depth deep, every completion handled. See nvme_engine.h. */
#include "nvme_engine.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#define NVME_MAX_BUFS 64
#define NVME_MAX_FIXED_BUF (1ull << 30) /* the kernel's limit for one fixed buffer */
#define NVME_MAX_RETRIES 100000         /* consecutive -EAGAIN/-EINTR of one request */

/* One block-size piece of a transfer (or an fdatasync), attached to its SQE
 * with io_uring_sqe_set_data. */
typedef struct nvme_req {
    nvme_io *io;
    nvme_op_kind kind;
    uint64_t offset;     /* file offset of the piece */
    char *buf;
    size_t len;
    size_t done;         /* bytes of the piece already transferred */
    unsigned retries;
    int used_direct;     /* the last submission went to the O_DIRECT descriptor */
    struct nvme_req *next; /* free list / retry queue */
} nvme_req;

typedef struct nvme_file {
    int open;
    int fd_direct;       /* -1 when O_DIRECT is not used */
    int fd_buf;
    int direct;          /* aligned requests go to fd_direct */
    int fixed;           /* both descriptors registered at slots 2*fid, 2*fid+1 */
    char *path;
} nvme_file;

typedef struct nvme_buf {
    char *base;
    size_t len;
    int fixed;           /* registered at index = position in e->bufs */
} nvme_buf;

struct nvme_engine {
    struct io_uring ring;
    unsigned qd;
    size_t bs;
    int buffered;
    int registration;    /* 1 while registering buffers/files works */
    nvme_fault_fn fault;
    void *fault_user;

    nvme_req *reqs;      /* qd of them */
    nvme_req *free_reqs;
    nvme_req *retry_head, *retry_tail;
    unsigned inflight;   /* requests submitted, completion not yet seen */
    unsigned unsubmitted;/* SQEs prepared but not submitted */

    nvme_io *pend_head, *pend_tail; /* transfers with pieces left to hand out */
    unsigned busy;       /* transfers not done */

    int wake_fd;
    int wake_armed;
    char wake_tag;       /* its address is the wakeup poll's user data */

    nvme_file files[NVME_MAX_FILES];
    nvme_buf bufs[NVME_MAX_BUFS];
    int files_registered, bufs_registered;

    nvme_engine_stats stats;
    char notes[512];
    int noted_direct, noted_register;
};

static void engine_note(nvme_engine_t *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void engine_note(nvme_engine_t *e, const char *fmt, ...)
{
    size_t used = strlen(e->notes);
    if (used + 2 >= sizeof e->notes) return;
    if (used) e->notes[used++] = '\n';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->notes + used, sizeof e->notes - used, fmt, ap);
    va_end(ap);
}

static int is_aligned(uint64_t v) { return (v & (NVME_ALIGN - 1)) == 0; }

/* ---- init / free ----------------------------------------------------------- */

static void wake_arm(nvme_engine_t *e)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
    if (!sqe) return; /* SQ full: armed on the next progress call */
    io_uring_prep_poll_multishot(sqe, e->wake_fd, POLLIN);
    io_uring_sqe_set_data(sqe, &e->wake_tag);
    e->unsubmitted++;
    e->wake_armed = 1;
}

zo_status nvme_engine_init(nvme_engine_t **out, const nvme_engine_config *cfg)
{
    nvme_engine_config def = {0};
    if (!cfg) cfg = &def;
    *out = NULL;
    unsigned qd = cfg->queue_depth ? cfg->queue_depth : NVME_DEFAULT_QUEUE_DEPTH;
    size_t bs = cfg->block_size ? cfg->block_size : NVME_DEFAULT_BLOCK;
    if (qd > 4096)
        return zo_error(ZO_ERR_INVALID, "nvme engine: queue_depth %u out of range 1..4096", qd);
    if (bs % NVME_ALIGN || bs > (1u << 30))
        return zo_error(ZO_ERR_INVALID,
                        "nvme engine: block_size %zu must be a multiple of %u and at most 1 GiB",
                        bs, NVME_ALIGN);
    zo_status st;
    nvme_engine_t *e = calloc(1, sizeof *e);
    if (!e) return zo_error(ZO_ERR_NOMEM, "nvme engine: out of memory");
    e->qd = qd;
    e->bs = bs;
    e->buffered = cfg->buffered;
    e->fault = cfg->fault;
    e->fault_user = cfg->fault_user;
    e->reqs = calloc(qd, sizeof *e->reqs);
    if (!e->reqs) {
        st = zo_error(ZO_ERR_NOMEM, "nvme engine: out of memory for %u requests", qd);
        goto out_free_engine;
    }
    for (unsigned i = 0; i < qd; i++) {
        e->reqs[i].next = e->free_reqs;
        e->free_reqs = &e->reqs[i];
    }
    /* qd requests + the wakeup poll + one spare for re-arming it. */
    int ret = io_uring_queue_init(qd + 2, &e->ring, 0);
    if (ret < 0) {
        st = zo_error(ret == -ENOSYS || ret == -EPERM ? ZO_ERR_UNSUPPORTED : ZO_ERR_IO,
                      "nvme engine: io_uring_queue_init(%u) failed: %s (errno %d)", qd + 2,
                      strerror(-ret), -ret);
        goto out_free_reqs;
    }
    e->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->wake_fd < 0) {
        st = zo_error(ZO_ERR_IO, "nvme engine: eventfd failed: %s (errno %d)", strerror(errno),
                      errno);
        goto out_exit_ring;
    }
    for (int i = 0; i < NVME_MAX_FILES; i++) e->files[i].fd_direct = e->files[i].fd_buf = -1;
    e->registration = !cfg->no_register;
    if (e->registration) {
        if (io_uring_register_files_sparse(&e->ring, 2 * NVME_MAX_FILES) == 0)
            e->files_registered = 1;
        if (io_uring_register_buffers_sparse(&e->ring, NVME_MAX_BUFS) == 0)
            e->bufs_registered = 1;
        if (!e->files_registered || !e->bufs_registered) {
            engine_note(e, "io_uring: registered %s unavailable; using plain requests",
                        !e->files_registered ? "files" : "buffers");
            e->noted_register = 1;
        }
    }
    wake_arm(e);
    *out = e;
    return ZO_OK;

out_exit_ring:
    io_uring_queue_exit(&e->ring);
out_free_reqs:
    free(e->reqs);
out_free_engine:
    free(e);
    return st;
}

void nvme_engine_free(nvme_engine_t *e)
{
    if (!e) return;
    /* Let requests still in flight finish: their buffers belong to callers. */
    if (e->unsubmitted) io_uring_submit(&e->ring);
    while (e->inflight > 0) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&e->ring, &cqe) < 0) break;
        if (io_uring_cqe_get_data(cqe) != &e->wake_tag) e->inflight--;
        io_uring_cqe_seen(&e->ring, cqe);
    }
    for (int i = 0; i < NVME_MAX_FILES; i++)
        if (e->files[i].open) nvme_file_close(e, i);
    for (int i = 0; i < NVME_MAX_BUFS; i++) free(e->bufs[i].base);
    io_uring_queue_exit(&e->ring);
    close(e->wake_fd);
    free(e->reqs);
    free(e);
}

size_t nvme_engine_block_size(const nvme_engine_t *e) { return e->bs; }
unsigned nvme_engine_queue_depth(const nvme_engine_t *e) { return e->qd; }
const char *nvme_engine_notes(const nvme_engine_t *e) { return e->notes; }
void nvme_engine_get_stats(const nvme_engine_t *e, nvme_engine_stats *out) { *out = e->stats; }
unsigned nvme_engine_busy(const nvme_engine_t *e) { return e->busy; }

void nvme_engine_wakeup(nvme_engine_t *e)
{
    uint64_t one = 1;
    /* EAGAIN means the counter is already non-zero: a wakeup is pending. */
    ssize_t r = write(e->wake_fd, &one, sizeof one);
    (void)r;
}

/* ---- files ------------------------------------------------------------------ */

static zo_status check_fid(const nvme_engine_t *e, int fid, const char *what)
{
    if (fid < 0 || fid >= NVME_MAX_FILES || !e->files[fid].open)
        return zo_error(ZO_ERR_INVALID, "%s: file id %d is not open", what, fid);
    return ZO_OK;
}

/* A descriptor of its own (O_RDWR | extra) on the file `fd` is open on:
 * reopened through /proc/self/fd (the same file whatever its name leads to
 * now), else by name without following a link, and kept only when it is
 * that file. */
static int reopen_same(int fd, const char *path, int extra)
{
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    int d = open(self, O_RDWR | O_CLOEXEC | extra);
    if (d < 0 && (errno == ENOENT || errno == EACCES))
        d = open(path, O_RDWR | O_CLOEXEC | extra | O_NOFOLLOW);
    if (d < 0) return -1;
    struct stat a, b;
    if (fstat(fd, &a) != 0 || fstat(d, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        close(d);
        errno = EXDEV;
        return -1;
    }
    return d;
}

zo_status nvme_file_open_fd(nvme_engine_t *e, int fd, const char *path, int *fid)
{
    int id = -1;
    for (int i = 0; i < NVME_MAX_FILES; i++)
        if (!e->files[i].open) {
            id = i;
            break;
        }
    if (id < 0)
        return zo_error(ZO_ERR_CAPACITY, "nvme_file_open %s: more than %d files open", path,
                        NVME_MAX_FILES);
    zo_status st;
    nvme_file *f = &e->files[id];
    /* not a dup: a lock the caller holds on fd stays its own (a ring's
     * registered files outlive a killed process for a while) */
    f->fd_buf = reopen_same(fd, path, 0);
    if (f->fd_buf < 0)
        return zo_error(ZO_ERR_IO, "nvme_file_open %s: reopen: %s", path, strerror(errno));
    f->path = strdup(path);
    if (!f->path) {
        st = zo_error(ZO_ERR_NOMEM, "nvme_file_open %s: out of memory", path);
        goto out_close_buf;
    }
    f->fd_direct = -1;
    f->direct = 0;
    if (!e->buffered) {
        f->fd_direct = reopen_same(f->fd_buf, path, O_DIRECT);
        if (f->fd_direct >= 0) {
            f->direct = 1;
        } else if (!e->noted_direct) {
            int err = errno;
            engine_note(e, "O_DIRECT refused for %s: %s (errno %d); using buffered I/O with "
                        "fdatasync", path, strerror(err), err);
            e->noted_direct = 1;
        }
    }
    f->fixed = 0;
    if (e->files_registered) {
        int fds[2] = {f->fd_direct, f->fd_buf};
        if (io_uring_register_files_update(&e->ring, 2 * id, fds, 2) == 2) f->fixed = 1;
    }
    f->open = 1;
    *fid = id;
    return ZO_OK;

out_close_buf:
    close(f->fd_buf);
    f->fd_buf = -1;
    return st;
}

zo_status nvme_file_open(nvme_engine_t *e, const char *path, int flags, int *fid)
{
    int oflags = O_RDWR | O_CLOEXEC | ((flags & NVME_FILE_CREATE) ? O_CREAT : 0) |
                 ((flags & NVME_FILE_TRUNC) ? O_TRUNC : 0) |
                 ((flags & NVME_FILE_EXCL) ? O_CREAT | O_EXCL | O_NOFOLLOW : 0);
    int fd = open(path, oflags, 0600);
    if (fd < 0) {
        int err = errno;
        return zo_error(err == ENOENT ? ZO_ERR_NOT_FOUND : ZO_ERR_IO,
                        "nvme_file_open: open(%s) failed: %s (errno %d)", path, strerror(err),
                        err);
    }
    zo_status st = nvme_file_open_fd(e, fd, path, fid);
    close(fd); /* the engine holds its own descriptor */
    return st;
}

zo_status nvme_file_close(nvme_engine_t *e, int fid)
{
    zo_status st = check_fid(e, fid, "nvme_file_close");
    if (st != ZO_OK) return st;
    nvme_file *f = &e->files[fid];
    if (f->fixed) {
        int fds[2] = {-1, -1};
        io_uring_register_files_update(&e->ring, 2 * fid, fds, 2);
    }
    if (f->fd_direct >= 0) close(f->fd_direct);
    close(f->fd_buf);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd_direct = f->fd_buf = -1;
    return ZO_OK;
}

const char *nvme_file_path(const nvme_engine_t *e, int fid)
{
    if (fid < 0 || fid >= NVME_MAX_FILES || !e->files[fid].open) return "?";
    return e->files[fid].path;
}

int nvme_file_is_direct(const nvme_engine_t *e, int fid)
{
    return fid >= 0 && fid < NVME_MAX_FILES && e->files[fid].open && e->files[fid].direct;
}

zo_status nvme_file_allocate(nvme_engine_t *e, int fid, uint64_t size)
{
    zo_status st = check_fid(e, fid, "nvme_file_allocate");
    if (st != ZO_OK) return st;
    nvme_file *f = &e->files[fid];
    if (fallocate(f->fd_buf, 0, 0, (off_t)size) == 0) return ZO_OK;
    int err = errno;
    if (err == EOPNOTSUPP) return ZO_OK; /* the file grows as it is written */
    return zo_error(err == ENOSPC || err == EDQUOT || err == EFBIG ? ZO_ERR_CAPACITY : ZO_ERR_IO,
                    "nvme_file_allocate: reserving %llu bytes for %s failed: %s (errno %d)",
                    (unsigned long long)size, f->path, strerror(err), err);
}

zo_status nvme_file_size(nvme_engine_t *e, int fid, uint64_t *size)
{
    zo_status st = check_fid(e, fid, "nvme_file_size");
    if (st != ZO_OK) return st;
    struct stat sb;
    if (fstat(e->files[fid].fd_buf, &sb) != 0)
        return zo_error(ZO_ERR_IO, "nvme_file_size: fstat(%s) failed: %s (errno %d)",
                        e->files[fid].path, strerror(errno), errno);
    *size = (uint64_t)sb.st_size;
    return ZO_OK;
}

/* ---- buffers ---------------------------------------------------------------- */

zo_status nvme_buf_alloc(nvme_engine_t *e, size_t size, void **out)
{
    *out = NULL;
    if (size == 0) return zo_error(ZO_ERR_INVALID, "nvme_buf_alloc: size 0");
    size_t len = (size + NVME_ALIGN - 1) & ~(size_t)(NVME_ALIGN - 1);
    int slot = -1;
    for (int i = 0; i < NVME_MAX_BUFS; i++)
        if (!e->bufs[i].base) {
            slot = i;
            break;
        }
    if (slot < 0)
        return zo_error(ZO_ERR_CAPACITY, "nvme_buf_alloc: more than %d buffers", NVME_MAX_BUFS);
    void *p = NULL;
    if (posix_memalign(&p, NVME_ALIGN, len) != 0)
        return zo_error(ZO_ERR_NOMEM, "nvme_buf_alloc: cannot allocate %zu aligned bytes", len);
    memset(p, 0, len);
    nvme_buf *b = &e->bufs[slot];
    b->base = p;
    b->len = len;
    b->fixed = 0;
    if (e->bufs_registered && len <= NVME_MAX_FIXED_BUF) {
        struct iovec iov = {p, len};
        int ret = io_uring_register_buffers_update_tag(&e->ring, (unsigned)slot, &iov, NULL, 1);
        if (ret == 1) {
            b->fixed = 1;
        } else if (!e->noted_register) {
            engine_note(e, "io_uring: registering a %zu-byte buffer failed: %s; using plain "
                        "requests", len, strerror(-ret));
            e->noted_register = 1;
        }
    }
    *out = p;
    return ZO_OK;
}

void nvme_buf_free(nvme_engine_t *e, void *p)
{
    if (!p) return;
    for (int i = 0; i < NVME_MAX_BUFS; i++) {
        nvme_buf *b = &e->bufs[i];
        if (b->base != p) continue;
        if (b->fixed) {
            struct iovec iov = {NULL, 0};
            io_uring_register_buffers_update_tag(&e->ring, (unsigned)i, &iov, NULL, 1);
        }
        free(b->base);
        memset(b, 0, sizeof *b);
        return;
    }
}

/* Index of the registered buffer holding [p, p+len), or -1. */
static int fixed_index(const nvme_engine_t *e, const char *p, size_t len)
{
    for (int i = 0; i < NVME_MAX_BUFS; i++) {
        const nvme_buf *b = &e->bufs[i];
        if (b->fixed && p >= b->base && p + len <= b->base + b->len) return i;
    }
    return -1;
}

/* ---- transfers ---------------------------------------------------------------- */

static const char *op_name(nvme_op_kind k)
{
    return k == NVME_OP_READ ? "read" : k == NVME_OP_WRITE ? "write" : "fdatasync";
}

static void pending_push(nvme_engine_t *e, nvme_io *io)
{
    io->next_pending_ = NULL;
    if (e->pend_tail) e->pend_tail->next_pending_ = io;
    else e->pend_head = io;
    e->pend_tail = io;
}

static void pending_remove(nvme_engine_t *e, nvme_io *io)
{
    nvme_io *prev = NULL;
    for (nvme_io *it = e->pend_head; it; prev = it, it = it->next_pending_) {
        if (it != io) continue;
        if (prev) prev->next_pending_ = it->next_pending_;
        else e->pend_head = it->next_pending_;
        if (e->pend_tail == it) e->pend_tail = prev;
        it->next_pending_ = NULL;
        return;
    }
}

zo_status nvme_io_submit(nvme_engine_t *e, nvme_io *io)
{
    zo_status st = check_fid(e, io->fid, "nvme_io_submit");
    if (st != ZO_OK) return st;
    if (io->op != NVME_OP_READ && io->op != NVME_OP_WRITE)
        return zo_error(ZO_ERR_INVALID, "nvme_io_submit: op must be read or write");
    if (!io->buf && io->len)
        return zo_error(ZO_ERR_INVALID, "nvme_io_submit: NULL buffer for %zu bytes", io->len);
    /* Pieces are handed out before any completes: a range past the largest
     * file offset would fail on one piece while another, its offset wrapped,
     * went to the start of the file. */
    if (io->offset > (uint64_t)INT64_MAX || (uint64_t)io->len > (uint64_t)INT64_MAX - io->offset)
        return zo_error(ZO_ERR_INVALID, "nvme_io_submit: %zu bytes at offset %llu of %s pass the "
                        "largest file offset", io->len, (unsigned long long)io->offset,
                        e->files[io->fid].path);
    io->status = ZO_OK;
    io->error[0] = '\0';
    io->bytes_done = 0;
    io->next_ = 0;
    io->inflight_ = 0;
    io->buffered_write_ = 0;
    if (io->len == 0) {
        io->state_ = 3;
        return ZO_OK;
    }
    io->state_ = 1;
    e->busy++;
    pending_push(e, io);
    return ZO_OK;
}

int nvme_io_done(const nvme_io *io) { return io->state_ == 3 || io->state_ == 0; }

static void io_fail(nvme_engine_t *e, nvme_io *io, zo_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void io_fail(nvme_engine_t *e, nvme_io *io, zo_status st, const char *fmt, ...)
{
    if (io->status == ZO_OK) {
        io->status = st;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(io->error, sizeof io->error, fmt, ap);
        va_end(ap);
    }
    /* Hand out no more pieces; the ones in flight still complete. */
    if (io->next_ < io->len || io->state_ == 2) pending_remove(e, io);
    io->next_ = io->len;
}

/* A transfer whose pieces are all accounted for is done, after an fdatasync
 * when it wrote through the page cache. */
static void io_maybe_finish(nvme_engine_t *e, nvme_io *io)
{
    if (io->inflight_ > 0 || io->next_ < io->len || io->state_ == 3) return;
    if (io->status == ZO_OK && io->buffered_write_ && io->state_ == 1) {
        io->state_ = 2; /* the fdatasync is handed out by engine_fill */
        pending_push(e, io);
        return;
    }
    if (io->state_ == 2 && io->status != ZO_OK) pending_remove(e, io);
    io->state_ = 3;
    e->busy--;
}

static void req_release(nvme_engine_t *e, nvme_req *r)
{
    nvme_io *io = r->io;
    io->inflight_--;
    r->io = NULL;
    r->next = e->free_reqs;
    e->free_reqs = r;
    io_maybe_finish(e, io);
}

static void retry_push(nvme_engine_t *e, nvme_req *r)
{
    r->next = NULL;
    if (e->retry_tail) e->retry_tail->next = r;
    else e->retry_head = r;
    e->retry_tail = r;
}

/* Prepare one SQE for the rest of request r. */
static void req_prep(nvme_engine_t *e, nvme_req *r, struct io_uring_sqe *sqe)
{
    nvme_file *f = &e->files[r->io->fid];
    if (r->kind == NVME_OP_FSYNC) {
        int fd = f->fixed ? 2 * r->io->fid + 1 : f->fd_buf;
        io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
        if (f->fixed) sqe->flags |= IOSQE_FIXED_FILE;
        r->used_direct = 0;
    } else {
        char *p = r->buf + r->done;
        size_t n = r->len - r->done;
        uint64_t off = r->offset + r->done;
        int direct = f->direct && is_aligned(off) && is_aligned(n) && is_aligned((uintptr_t)p);
        int fd = f->fixed ? 2 * r->io->fid + (direct ? 0 : 1) : (direct ? f->fd_direct : f->fd_buf);
        int bi = fixed_index(e, p, n);
        if (r->kind == NVME_OP_READ) {
            if (bi >= 0) io_uring_prep_read_fixed(sqe, fd, p, (unsigned)n, off, bi);
            else io_uring_prep_read(sqe, fd, p, (unsigned)n, off);
        } else {
            if (bi >= 0) io_uring_prep_write_fixed(sqe, fd, p, (unsigned)n, off, bi);
            else io_uring_prep_write(sqe, fd, p, (unsigned)n, off);
            if (!direct) r->io->buffered_write_ = 1;
        }
        if (f->fixed) sqe->flags |= IOSQE_FIXED_FILE;
        if (bi >= 0) e->stats.fixed_requests++;
        if (!direct) e->stats.buffered_requests++;
        r->used_direct = direct;
    }
    io_uring_sqe_set_data(sqe, r);
    e->stats.requests++;
}

/* Hand pieces to free request slots (retries first) and submit them in one
 * batch. */
static zo_status engine_fill(nvme_engine_t *e)
{
    if (!e->wake_armed) wake_arm(e);
    for (;;) {
        /* Pieces of transfers that already failed are dropped, not resent. */
        while (e->retry_head && e->retry_head->io->status != ZO_OK) {
            nvme_req *r = e->retry_head;
            e->retry_head = r->next;
            if (!e->retry_head) e->retry_tail = NULL;
            req_release(e, r);
        }
        if (!e->retry_head && !(e->free_reqs && e->pend_head)) break;
        struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
        if (!sqe) break;
        nvme_req *r;
        if (e->retry_head) {
            r = e->retry_head;
            e->retry_head = r->next;
            if (!e->retry_head) e->retry_tail = NULL;
        } else {
            nvme_io *io = e->pend_head;
            r = e->free_reqs;
            e->free_reqs = r->next;
            r->io = io;
            r->done = 0;
            r->retries = 0;
            io->inflight_++;
            if (io->state_ == 2) {
                r->kind = NVME_OP_FSYNC;
                r->offset = 0;
                r->buf = NULL;
                r->len = 0;
                pending_remove(e, io);
            } else {
                size_t n = io->len - io->next_;
                /* Keep pieces on block boundaries of the file so that an
                 * unaligned start costs one buffered piece, not all of them. */
                uint64_t off = io->offset + io->next_;
                size_t to_boundary = e->bs - (size_t)(off % e->bs);
                if (n > to_boundary) n = to_boundary;
                r->kind = io->op;
                r->offset = off;
                r->buf = (char *)io->buf + io->next_;
                r->len = n;
                io->next_ += n;
                if (io->next_ == io->len) pending_remove(e, io);
            }
        }
        req_prep(e, r, sqe);
        e->unsubmitted++;
        e->inflight++;
    }
    if (e->unsubmitted) {
        int ret = io_uring_submit(&e->ring);
        if (ret >= 0) {
            e->unsubmitted -= (unsigned)ret < e->unsubmitted ? (unsigned)ret : e->unsubmitted;
            e->stats.submits++;
        } else if (ret != -EAGAIN && ret != -EBUSY && ret != -EINTR) {
            return zo_error(ZO_ERR_IO, "nvme engine: io_uring_submit failed: %s (errno %d)",
                            strerror(-ret), -ret);
        }
    }
    return ZO_OK;
}

static void handle_cqe(nvme_engine_t *e, struct io_uring_cqe *cqe)
{
    void *data = io_uring_cqe_get_data(cqe);
    if (data == &e->wake_tag) {
        uint64_t v;
        ssize_t r = read(e->wake_fd, &v, sizeof v); /* reset the eventfd counter */
        (void)r;
        if (!(cqe->flags & IORING_CQE_F_MORE)) e->wake_armed = 0; /* re-armed by engine_fill */
        return;
    }
    nvme_req *r = data;
    nvme_io *io = r->io;
    nvme_file *f = &e->files[io->fid];
    e->inflight--;
    int res = cqe->res;
    size_t want = r->len - r->done;
    uint64_t off = r->offset + r->done;
    if (e->fault) {
        nvme_fault_info info = {r->kind, io->fid, f->path, off, want};
        res = e->fault(e->fault_user, &info, res);
    }
    if (io->status != ZO_OK) { /* the transfer failed elsewhere: drop the piece */
        req_release(e, r);
        return;
    }
    if (res == -EAGAIN || res == -EINTR) {
        e->stats.retries++;
        if (++r->retries > NVME_MAX_RETRIES) {
            io_fail(e, io, ZO_ERR_IO, "%s of %zu bytes at offset %llu of %s: still %s after %u "
                    "retries", op_name(r->kind), want, (unsigned long long)off, f->path,
                    strerror(-res), NVME_MAX_RETRIES);
            req_release(e, r);
            return;
        }
        retry_push(e, r);
        return;
    }
    if (res == -EINVAL && r->used_direct && f->direct) {
        /* The file system accepted O_DIRECT at open but refuses it for I/O. */
        f->direct = 0;
        if (!e->noted_direct) {
            engine_note(e, "O_DIRECT I/O refused for %s (EINVAL); using buffered I/O with "
                        "fdatasync", f->path);
            e->noted_direct = 1;
        }
        retry_push(e, r);
        return;
    }
    if (res < 0) {
        io_fail(e, io, ZO_ERR_IO, "%s of %zu bytes at offset %llu of %s failed: %s (errno %d)",
                op_name(r->kind), want, (unsigned long long)off, f->path, strerror(-res), -res);
        req_release(e, r);
        return;
    }
    if (r->kind == NVME_OP_FSYNC) {
        req_release(e, r);
        return;
    }
    if (res == 0) {
        if (r->kind == NVME_OP_READ)
            io_fail(e, io, ZO_ERR_IO, "read of %zu bytes at offset %llu of %s: unexpected end "
                    "of file (the file is shorter than expected: truncated?)", want,
                    (unsigned long long)off, f->path);
        else
            io_fail(e, io, ZO_ERR_IO, "write of %zu bytes at offset %llu of %s wrote nothing",
                    want, (unsigned long long)off, f->path);
        req_release(e, r);
        return;
    }
    if ((size_t)res > want) res = (int)want; /* a fault hook's mistake; never overrun */
    r->done += (size_t)res;
    io->bytes_done += (size_t)res;
    if (r->done < r->len) { /* short transfer: advance and requeue the rest */
        e->stats.short_requeues++;
        r->retries = 0;
        retry_push(e, r);
        return;
    }
    req_release(e, r);
}

static zo_status engine_reap(nvme_engine_t *e, int wait)
{
    struct io_uring_cqe *cqe;
    int ret;
    if (wait) {
        do ret = io_uring_wait_cqe(&e->ring, &cqe);
        while (ret == -EINTR);
        if (ret < 0)
            return zo_error(ZO_ERR_IO, "nvme engine: io_uring_wait_cqe failed: %s (errno %d)",
                            strerror(-ret), -ret);
    }
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&e->ring, head, cqe) {
        handle_cqe(e, cqe);
        seen++;
    }
    io_uring_cq_advance(&e->ring, seen);
    return ZO_OK;
}

zo_status nvme_engine_progress(nvme_engine_t *e, int wait)
{
    zo_status st = engine_fill(e);
    if (st != ZO_OK) return st;
    if ((st = engine_reap(e, wait)) != ZO_OK) return st;
    return engine_fill(e);
}

zo_status nvme_io_wait(nvme_engine_t *e, nvme_io *io)
{
    while (!nvme_io_done(io)) {
        zo_status st = nvme_engine_progress(e, 1);
        if (st != ZO_OK) return st;
    }
    if (io->status != ZO_OK) return zo_error(io->status, "%s", io->error);
    return ZO_OK;
}

static zo_status sync_io(nvme_engine_t *e, nvme_op_kind op, int fid, void *buf, size_t len,
                         uint64_t offset)
{
    nvme_io io = {.fid = fid, .op = op, .buf = buf, .len = len, .offset = offset};
    zo_status st = nvme_io_submit(e, &io);
    if (st != ZO_OK) return st;
    return nvme_io_wait(e, &io);
}

zo_status nvme_read(nvme_engine_t *e, int fid, void *buf, size_t len, uint64_t offset)
{
    return sync_io(e, NVME_OP_READ, fid, buf, len, offset);
}

zo_status nvme_write(nvme_engine_t *e, int fid, const void *buf, size_t len, uint64_t offset)
{
    return sync_io(e, NVME_OP_WRITE, fid, (void *)buf, len, offset);
}
