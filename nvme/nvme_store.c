/* Swap store: striped files, per-block xxHash, capacity checked up front.
 * See nvme_store.h. */
#include "nvme_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/units.h" // defines: zo_format_bytes

typedef struct store_tensor {
    char name[128];
    uint64_t start;   /* address in the store, NVME_ALIGN aligned */
    size_t nbytes;
    size_t nblocks;   /* checksum blocks */
    uint64_t *sums;   /* nblocks XXH3-64 values of the last successful write */
    int valid;        /* a write has succeeded since the last failed one */
    int busy;         /* an op is in flight */
} store_tensor;

struct nvme_store {
    nvme_engine_t *e;
    int nfiles;
    int *fids;
    int *lock_fds;       /* each file's flock, held for the store's life */
    char **paths;
    char **dirs;
    uint64_t *file_len;  /* bytes of each file the layout uses (and reserved) */
    size_t stripe;
    size_t cblock;
    int preallocate;
    int keep_files;
    int stale_removed;   /* swap files of dead runs removed at init */
    uint64_t end;        /* first free address */
    store_tensor *t;
    size_t nt, cap;
    int *htab;           /* open-addressing index of names: tensor id or -1 */
    size_t hcap;         /* power of two, at least twice nt */
};

/* Slot of `name` in a table of ids (-1 = empty) whose names come from `t`:
 * the slot holding it, or the empty slot where it belongs. */
static size_t name_slot(const int *tab, size_t cap, const store_tensor *t, const char *name)
{
    size_t h = (size_t)XXH3_64bits(name, strlen(name)) & (cap - 1);
    while (tab[h] >= 0 && strcmp(t[tab[h]].name, name) != 0) h = (h + 1) & (cap - 1);
    return h;
}

static zo_status index_grow(nvme_store_t *s, size_t want)
{
    if (2 * want <= s->hcap) return ZO_OK;
    size_t cap = 64;
    while (cap < 2 * want) cap *= 2;
    int *tab = malloc(cap * sizeof *tab);
    if (!tab) return zo_error(ZO_ERR_NOMEM, "swap store: out of memory for the name index");
    for (size_t i = 0; i < cap; i++) tab[i] = -1;
    for (size_t i = 0; i < s->nt; i++) tab[name_slot(tab, cap, s->t, s->t[i].name)] = (int)i;
    free(s->htab);
    s->htab = tab;
    s->hcap = cap;
    return ZO_OK;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* End of the store's address space: aligned, and a file offset (off_t). */
#define STORE_MAX_ADDR ((uint64_t)INT64_MAX & ~(uint64_t)(NVME_ALIGN - 1))

/* ---- swap files: unique, exclusive, locked ------------------------------------------- */

/* 64 random bits: the kernel's, else a hash of the time, the pid and a
 * counter (unique enough with O_EXCL retrying). */
static uint64_t random_token(void)
{
    uint64_t v;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) == (ssize_t)sizeof v) return v;
    static uint64_t count;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t mix[4] = {(uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, (uint64_t)getpid(),
                       __atomic_add_fetch(&count, 1, __ATOMIC_RELAXED)};
    return XXH3_64bits(mix, sizeof mix);
}

/* "<prefix>-<16 hex digits>.<k>.swap" exactly: 1 when `name` is such a
 * swap file of `prefix`. */
static int swap_name_match(const char *name, const char *prefix)
{
    size_t p = strlen(prefix);
    if (strncmp(name, prefix, p) || name[p] != '-') return 0;
    const char *h = name + p + 1;
    if (strspn(h, "0123456789abcdef") != 16 || h[16] != '.') return 0;
    const char *k = h + 17;
    size_t nd = strspn(k, "0123456789");
    if (!nd || nd > 9 || (nd > 1 && k[0] == '0')) return 0;
    return !strcmp(k + nd, ".swap");
}

zo_status nvme_store_remove_stale(const char *dir, const char *prefix, int *removed)
{
    if (removed) *removed = 0;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return zo_error(ZO_ERR_IO, "swap directory %s: %s", dir, strerror(errno));
    int dfd2 = dup(dfd);
    DIR *d = dfd2 >= 0 ? fdopendir(dfd2) : NULL;
    if (!d) {
        int e = errno;
        if (dfd2 >= 0) close(dfd2);
        close(dfd);
        return zo_error(ZO_ERR_IO, "swap directory %s: %s", dir, strerror(e));
    }
    rewinddir(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!swap_name_match(de->d_name, prefix)) continue;
        int fd = openat(dfd, de->d_name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat a, b;
        /* ours to remove: a regular file of this user that no live run holds
         * locked, still under that name */
        if (fstat(fd, &a) == 0 && S_ISREG(a.st_mode) && a.st_uid == geteuid() &&
            flock(fd, LOCK_EX | LOCK_NB) == 0 &&
            fstatat(dfd, de->d_name, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino && unlinkat(dfd, de->d_name, 0) == 0 && removed)
            (*removed)++;
        close(fd);
    }
    closedir(d);
    close(dfd);
    return ZO_OK;
}

/* Create <dir>/<prefix>-<token>.<k>.swap: a name no other run (in any pid
 * namespace) has, made exclusively (never over a file or through a link
 * planted there), locked for the store's life so that a sweep of another
 * run leaves it alone, and still under its name once locked (a sweep that
 * got to it first, between the create and the lock, removed it: another
 * name then). *fd: the locked descriptor. */
static zo_status create_swap(const char *dir, const char *prefix, int k, char **path_out, int *fd_out)
{
    size_t len = strlen(dir) + strlen(prefix) + 48;
    char *path = malloc(len);
    if (!path) return zo_error(ZO_ERR_NOMEM, "nvme_store_init: out of memory");
    for (int tries = 0; tries < 16; tries++) {
        snprintf(path, len, "%s/%s-%016llx.%d.swap", dir, prefix, (unsigned long long)random_token(), k);
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno == EEXIST) continue;
        if (fd < 0) {
            int e = errno;
            zo_status st = zo_error(e == ENOENT ? ZO_ERR_NOT_FOUND : ZO_ERR_IO,
                                    "nvme_store_init: create %s: %s (errno %d)", path, strerror(e), e);
            free(path);
            return st;
        }
        struct stat a, b;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &a) == 0 && lstat(path, &b) == 0 &&
            a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            *path_out = path;
            *fd_out = fd;
            return ZO_OK;
        }
        close(fd); /* a sweep holds or removed it: it removes it */
    }
    zo_status st = zo_error(ZO_ERR_IO, "nvme_store_init: no free swap file name in %s", dir);
    free(path);
    return st;
}

zo_status nvme_store_init(nvme_store_t **out, nvme_engine_t *engine, const nvme_store_config *cfg)
{
    *out = NULL;
    if (!cfg || cfg->ndirs < 1 || !cfg->dirs)
        return zo_error(ZO_ERR_INVALID, "nvme_store_init: at least one directory is needed");
    size_t stripe = cfg->stripe_size ? cfg->stripe_size : nvme_engine_block_size(engine);
    size_t cblock = cfg->checksum_block ? cfg->checksum_block : stripe;
    if (stripe % NVME_ALIGN || cblock % NVME_ALIGN)
        return zo_error(ZO_ERR_INVALID, "nvme_store_init: stripe_size %zu and checksum_block %zu "
                        "must be multiples of %u", stripe, cblock, NVME_ALIGN);
    const char *prefix = cfg->prefix ? cfg->prefix : "zo-swap";
    zo_status st;
    nvme_store_t *s = calloc(1, sizeof *s);
    if (!s) return zo_error(ZO_ERR_NOMEM, "nvme_store_init: out of memory");
    s->e = engine;
    s->stripe = stripe;
    s->cblock = cblock;
    s->preallocate = cfg->preallocate;
    s->keep_files = cfg->keep_files;
    s->fids = malloc(sizeof *s->fids * (size_t)cfg->ndirs);
    s->lock_fds = malloc(sizeof *s->lock_fds * (size_t)cfg->ndirs);
    s->paths = calloc((size_t)cfg->ndirs, sizeof *s->paths);
    s->dirs = calloc((size_t)cfg->ndirs, sizeof *s->dirs);
    s->file_len = calloc((size_t)cfg->ndirs, sizeof *s->file_len);
    if (!s->fids || !s->lock_fds || !s->paths || !s->dirs || !s->file_len) {
        st = zo_error(ZO_ERR_NOMEM, "nvme_store_init: out of memory");
        goto out_free_store;
    }
    for (int k = 0; k < cfg->ndirs; k++) {
        const char *dir = cfg->dirs[k];
        struct stat sb;
        int bad = stat(dir, &sb) != 0;
        if (bad || !S_ISDIR(sb.st_mode)) {
            st = zo_error(ZO_ERR_NOT_FOUND, "nvme_store_init: swap directory %s: %s", dir,
                          bad ? strerror(errno) : "not a directory");
            goto out_close_files;
        }
        s->dirs[k] = strdup(dir);
        if (!s->dirs[k]) {
            st = zo_error(ZO_ERR_NOMEM, "nvme_store_init: out of memory");
            goto out_close_files;
        }
        /* files of runs that died (killed: nothing removed them) go first */
        int stale = 0;
        if ((st = nvme_store_remove_stale(dir, prefix, &stale)) != ZO_OK) goto out_close_files;
        s->stale_removed += stale;
        int fd = -1;
        if ((st = create_swap(dir, prefix, k, &s->paths[k], &fd)) != ZO_OK) goto out_close_files;
        /* the lock stays on fd, out of the ring: a killed run's lock goes at once */
        s->lock_fds[k] = fd;
        st = nvme_file_open_fd(engine, fd, s->paths[k], &s->fids[k]);
        if (st != ZO_OK) {
            unlink(s->paths[k]);
            close(fd);
            zo_error_wrap(st, "nvme_store_init");
            goto out_close_files;
        }
        s->nfiles = k + 1;
    }
    *out = s;
    return ZO_OK;

out_close_files:
    for (int k = 0; k < s->nfiles; k++) {
        unlink(s->paths[k]); /* while its lock is held: the name is still ours */
        nvme_file_close(engine, s->fids[k]);
        close(s->lock_fds[k]);
    }
    for (int k = 0; k < cfg->ndirs; k++) {
        free(s->paths[k]);
        free(s->dirs[k]);
    }
out_free_store:
    free(s->fids);
    free(s->lock_fds);
    free(s->paths);
    free(s->dirs);
    free(s->file_len);
    free(s);
    return st;
}

void nvme_store_free(nvme_store_t *s)
{
    if (!s) return;
    for (int k = 0; k < s->nfiles; k++) {
        if (!s->keep_files) unlink(s->paths[k]); /* while its lock is held: the name is still ours */
        nvme_file_close(s->e, s->fids[k]);
        close(s->lock_fds[k]);
        free(s->paths[k]);
        free(s->dirs[k]);
    }
    for (size_t i = 0; i < s->nt; i++) free(s->t[i].sums);
    free(s->t);
    free(s->htab);
    free(s->fids);
    free(s->lock_fds);
    free(s->paths);
    free(s->dirs);
    free(s->file_len);
    free(s);
}

/* Bytes of file k that addresses [0, end) occupy. */
static uint64_t file_bytes_for(const nvme_store_t *s, int k, uint64_t end)
{
    uint64_t S = s->stripe, nf = (uint64_t)s->nfiles;
    uint64_t full = end / S, rem = end % S;
    uint64_t n = (full / nf + ((uint64_t)k < full % nf ? 1 : 0)) * S;
    if ((uint64_t)k == full % nf) n += rem;
    return n;
}

static void locate_addr(const nvme_store_t *s, uint64_t addr, int *k, uint64_t *off)
{
    uint64_t S = s->stripe, stripe = addr / S;
    *k = (int)(stripe % (uint64_t)s->nfiles);
    *off = (stripe / (uint64_t)s->nfiles) * S + addr % S;
}

/* Check that every file system can hold what its files must grow by to reach
 * address `end`, and that no file passes RLIMIT_FSIZE. */
static zo_status check_capacity(const nvme_store_t *s, uint64_t end)
{
    char b1[32], b2[32];
    struct rlimit rl;
    int have_rl = getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY;
    for (int k = 0; k < s->nfiles; k++) {
        uint64_t need = file_bytes_for(s, k, end);
        if (have_rl && need > (uint64_t)rl.rlim_cur)
            return zo_error(ZO_ERR_CAPACITY, "swap store: %s would grow to %s, beyond this "
                            "process's file-size limit (ulimit -f) of %s", s->paths[k],
                            zo_format_bytes(need, b1, sizeof b1),
                            zo_format_bytes((uint64_t)rl.rlim_cur, b2, sizeof b2));
    }
    /* Files on the same file system share its free space. */
    for (int k = 0; k < s->nfiles; k++) {
        struct stat sk;
        if (stat(s->dirs[k], &sk) != 0)
            return zo_error(ZO_ERR_IO, "swap store: stat(%s) failed: %s (errno %d)", s->dirs[k],
                            strerror(errno), errno);
        uint64_t grow = 0;
        int nthere = 0, first = 1;
        for (int j = 0; j < s->nfiles; j++) {
            struct stat sj;
            if (stat(s->dirs[j], &sj) != 0 || sj.st_dev != sk.st_dev) continue;
            if (j < k) first = 0; /* counted with an earlier directory */
            uint64_t need = file_bytes_for(s, j, end);
            if (need > s->file_len[j]) grow += need - s->file_len[j];
            nthere++;
        }
        if (!first || grow == 0) continue;
        struct statvfs vfs;
        if (statvfs(s->dirs[k], &vfs) != 0)
            return zo_error(ZO_ERR_IO, "swap store: statvfs(%s) failed: %s (errno %d)",
                            s->dirs[k], strerror(errno), errno);
        uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
        if (grow > avail)
            return zo_error(ZO_ERR_CAPACITY, "swap store: %s needs %s more for its %d swap "
                            "file(s) (store of %s striped over %d file(s)) but its file system "
                            "has only %s free", s->dirs[k], zo_format_bytes(grow, b1, sizeof b1),
                            nthere, zo_format_bytes(end, b2, sizeof b2), s->nfiles,
                            zo_format_bytes(avail, (char[32]){0}, 32));
    }
    return ZO_OK;
}

zo_status nvme_store_add(nvme_store_t *s, size_t n, const char *const *names,
                         const size_t *nbytes, int *ids)
{
    uint64_t end = s->end;
    for (size_t i = 0; i < n; i++) {
        if (!names[i] || strlen(names[i]) >= sizeof s->t[0].name)
            return zo_error(ZO_ERR_INVALID, "nvme_store_add: tensor name %zu missing or longer "
                            "than 127 bytes", i);
        if (nbytes[i] == 0)
            return zo_error(ZO_ERR_INVALID, "nvme_store_add: tensor %s has 0 bytes", names[i]);
        /* Addresses (and so file offsets) stay below 2^63: larger sums
         * would wrap to a small footprint with overlapping tensors. */
        uint64_t at = align_up(end, NVME_ALIGN);
        if ((uint64_t)nbytes[i] > STORE_MAX_ADDR - at)
            return zo_error(ZO_ERR_CAPACITY, "nvme_store_add: tensor %s of %zu bytes at store "
                            "address %llu passes the largest file offset", names[i], nbytes[i],
                            (unsigned long long)at);
        end = at + nbytes[i];
    }
    zo_status st;
    if (s->nt + n > s->cap) {
        size_t cap = s->cap ? s->cap : 16;
        while (cap < s->nt + n) cap *= 2;
        store_tensor *t = realloc(s->t, cap * sizeof *t);
        if (!t) return zo_error(ZO_ERR_NOMEM, "nvme_store_add: out of memory for %zu tensors", cap);
        s->t = t;
        s->cap = cap;
    }
    if ((st = index_grow(s, s->nt + n)) != ZO_OK) return st;
    /* Names: unique among the store's and the batch's (the batch is entered in
     * the index tentatively and taken out again on any failure). */
    size_t entered = 0;
    for (; entered < n; entered++) {
        store_tensor *t = &s->t[s->nt + entered];
        snprintf(t->name, sizeof t->name, "%s", names[entered]);
        size_t h = name_slot(s->htab, s->hcap, s->t, t->name);
        if (s->htab[h] >= 0) {
            st = zo_error(ZO_ERR_INVALID, "nvme_store_add: tensor %s already exists", t->name);
            goto out_unindex;
        }
        s->htab[h] = (int)(s->nt + entered);
    }
    end = align_up(end, NVME_ALIGN);
    if ((st = check_capacity(s, end)) != ZO_OK) goto out_unindex;
    for (int k = 0; k < s->nfiles; k++) {
        uint64_t need = file_bytes_for(s, k, end);
        if (need <= s->file_len[k]) continue;
        if (s->preallocate) {
            st = nvme_file_allocate(s->e, s->fids[k], need);
            if (st != ZO_OK) {
                zo_error_wrap(st, "swap store: reserving space");
                goto out_unindex;
            }
        }
        s->file_len[k] = need;
    }
    uint64_t addr = s->end;
    for (size_t i = 0; i < n; i++) {
        store_tensor *t = &s->t[s->nt];
        t->start = align_up(addr, NVME_ALIGN);
        t->nbytes = nbytes[i];
        t->nblocks = (nbytes[i] + s->cblock - 1) / s->cblock;
        t->sums = NULL;
        t->valid = 0;
        t->busy = 0;
        addr = t->start + nbytes[i];
        ids[i] = (int)s->nt++;
    }
    s->end = end;
    return ZO_OK;

out_unindex:
    /* Rebuild the index without the batch (linear probing has no delete). */
    for (size_t i = 0; i < s->hcap; i++) s->htab[i] = -1;
    for (size_t i = 0; i < s->nt; i++) s->htab[name_slot(s->htab, s->hcap, s->t, s->t[i].name)] = (int)i;
    return st;
}

zo_status nvme_store_find(const nvme_store_t *s, const char *name, int *id)
{
    if (s->hcap) {
        size_t h = name_slot(s->htab, s->hcap, s->t, name);
        if (s->htab[h] >= 0) {
            *id = s->htab[h];
            return ZO_OK;
        }
    }
    return zo_error(ZO_ERR_NOT_FOUND, "swap store: no tensor named %s", name);
}

const char *nvme_store_name(const nvme_store_t *s, int id)
{
    return id >= 0 && (size_t)id < s->nt ? s->t[id].name : "?";
}

size_t nvme_store_nbytes(const nvme_store_t *s, int id)
{
    return id >= 0 && (size_t)id < s->nt ? s->t[id].nbytes : 0;
}

uint64_t nvme_store_footprint(const nvme_store_t *s) { return s->end; }
int nvme_store_nfiles(const nvme_store_t *s) { return s->nfiles; }
int nvme_store_stale_removed(const nvme_store_t *s) { return s->stale_removed; }
int nvme_store_file_id(const nvme_store_t *s, int k) { return s->fids[k]; }
nvme_engine_t *nvme_store_engine(const nvme_store_t *s) { return s->e; }

void nvme_store_locate(const nvme_store_t *s, int id, uint64_t byte, int *file_k,
                       uint64_t *file_offset)
{
    locate_addr(s, s->t[id].start + byte, file_k, file_offset);
}

static zo_status check_id(const nvme_store_t *s, int id, const char *what)
{
    if (id < 0 || (size_t)id >= s->nt)
        return zo_error(ZO_ERR_INVALID, "%s: no tensor with id %d", what, id);
    return ZO_OK;
}

static void op_release(nvme_store_op *o)
{
    free(o->ios);
    free(o->sums);
    o->ios = NULL;
    o->sums = NULL;
    o->nios = 0;
}

zo_status nvme_store_submit(nvme_store_t *s, int id, nvme_op_kind op, void *buf,
                            nvme_store_op *o)
{
    memset(o, 0, sizeof *o);
    zo_status st = check_id(s, id, "nvme_store_submit");
    if (st != ZO_OK) return st;
    store_tensor *t = &s->t[id];
    if (op != NVME_OP_READ && op != NVME_OP_WRITE)
        return zo_error(ZO_ERR_INVALID, "tensor %s: op must be read or write", t->name);
    if (t->busy)
        return zo_error(ZO_ERR_INVALID, "tensor %s: another transfer of it is in flight", t->name);
    if (op == NVME_OP_READ && !t->valid)
        return zo_error(ZO_ERR_NOT_FOUND, "tensor %s has no data on disk: it was never written "
                        "or its last write failed", t->name);
    o->id = id;
    o->op = op;
    o->buf = buf;
    /* One transfer per stripe piece; one for the whole tensor with one file.
     * A read's pieces are also cut every `unit` bytes (whole checksum
     * blocks), so that its first blocks can be checked while the disk reads
     * the rest (nvme_store_wait) */
    size_t unit = op == NVME_OP_READ ? (t->nblocks + NVME_STORE_READ_PIECES - 1) / NVME_STORE_READ_PIECES * s->cblock
                                     : 0;
    size_t max = (s->nfiles == 1 ? 1 : t->nbytes / s->stripe + 2) + (unit ? t->nbytes / unit + 1 : 0);
    o->ios = calloc(max, sizeof *o->ios);
    if (!o->ios) return zo_error(ZO_ERR_NOMEM, "tensor %s: out of memory for %zu transfers",
                                 t->name, max);
    if (op == NVME_OP_WRITE) {
        o->sums = malloc(t->nblocks * sizeof *o->sums);
        if (!o->sums) {
            st = zo_error(ZO_ERR_NOMEM, "tensor %s: out of memory for checksums", t->name);
            goto out_release;
        }
        for (size_t b = 0; b < t->nblocks; b++) {
            size_t off = b * s->cblock;
            size_t len = t->nbytes - off < s->cblock ? t->nbytes - off : s->cblock;
            o->sums[b] = XXH3_64bits((const char *)buf + off, len);
        }
    }
    size_t pos = 0;
    while (pos < t->nbytes) {
        int k;
        uint64_t foff;
        locate_addr(s, t->start + pos, &k, &foff);
        size_t len = t->nbytes - pos;
        if (s->nfiles > 1) {
            size_t to_end = s->stripe - (size_t)((t->start + pos) % s->stripe);
            if (len > to_end) len = to_end;
        }
        if (unit && len > unit - pos % unit) len = unit - pos % unit;
        nvme_io *io = &o->ios[o->nios++];
        io->fid = s->fids[k];
        io->op = op;
        io->buf = (char *)buf + pos;
        io->len = len;
        io->offset = foff;
        pos += len;
    }
    for (size_t i = 0; i < o->nios; i++) {
        st = nvme_io_submit(s->e, &o->ios[i]);
        if (st != ZO_OK) { /* only on a bad file id: nothing was queued before it */
            zo_error_wrap(st, "tensor %s", t->name);
            goto out_release;
        }
    }
    t->busy = 1;
    return ZO_OK;

out_release:
    op_release(o);
    return st;
}

int nvme_store_op_complete(const nvme_store_op *o)
{
    for (size_t i = 0; i < o->nios; i++)
        if (!nvme_io_done(&o->ios[i])) return 0;
    return 1;
}

/* The checksum of tensor t's block b in buf. */
static uint64_t block_sum(const nvme_store_t *s, const store_tensor *t, const void *buf, size_t b)
{
    size_t off = b * s->cblock;
    size_t len = t->nbytes - off < s->cblock ? t->nbytes - off : s->cblock;
    return XXH3_64bits((const char *)buf + off, len);
}

/* A read in flight: check the blocks of the pieces that have arrived in
 * order from its start, up to the first piece still reading (or failed)
 * and the first block that does not match (nvme_store_finish reports
 * both). */
static void verify_arrived(const nvme_store_t *s, nvme_store_op *o)
{
    if (o->op != NVME_OP_READ || o->mismatch) return;
    const store_tensor *t = &s->t[o->id];
    while (o->arrived_io < o->nios && nvme_io_done(&o->ios[o->arrived_io]) &&
           o->ios[o->arrived_io].status == ZO_OK)
        o->arrived_io++;
    size_t upto = o->arrived_io < o->nios ? (size_t)((char *)o->ios[o->arrived_io].buf - (char *)o->buf)
                                          : t->nbytes;
    size_t blocks = upto >= t->nbytes ? t->nblocks : upto / s->cblock;
    for (; o->verified < blocks; o->verified++)
        if (block_sum(s, t, o->buf, o->verified) != t->sums[o->verified]) {
            o->mismatch = 1;
            return;
        }
}

zo_status nvme_store_finish(nvme_store_t *s, nvme_store_op *o)
{
    zo_status st = check_id(s, o->id, "nvme_store_finish");
    if (st != ZO_OK) return st;
    if (!nvme_store_op_complete(o))
        return zo_error(ZO_ERR_INTERNAL, "tensor %s: finish before the transfer completed",
                        s->t[o->id].name);
    store_tensor *t = &s->t[o->id];
    t->busy = 0;
    for (size_t i = 0; i < o->nios; i++) {
        if (o->ios[i].status == ZO_OK) continue;
        st = zo_error(o->ios[i].status, "tensor %s: %s", t->name, o->ios[i].error);
        if (o->op == NVME_OP_WRITE) t->valid = 0; /* the disk holds a mix of old and new */
        goto out_release;
    }
    if (o->op == NVME_OP_WRITE) {
        free(t->sums);
        t->sums = o->sums;
        o->sums = NULL;
        t->valid = 1;
        goto out_release;
    }
    /* the blocks nvme_store_wait has not checked yet */
    for (size_t b = o->verified; b < t->nblocks; b++) {
        uint64_t got = block_sum(s, t, o->buf, b);
        if (got == t->sums[b]) continue;
        size_t off = b * s->cblock;
        size_t len = t->nbytes - off < s->cblock ? t->nbytes - off : s->cblock;
        int k;
        uint64_t foff;
        locate_addr(s, t->start + off, &k, &foff);
        st = zo_error(ZO_ERR_CHECKSUM, "tensor %s block %zu (bytes %zu..%zu, %s offset %llu): "
                      "checksum mismatch, written %016llx, read back %016llx", t->name, b, off,
                      off + len - 1, s->paths[k], (unsigned long long)foff,
                      (unsigned long long)t->sums[b], (unsigned long long)got);
        goto out_release;
    }

out_release:
    op_release(o);
    return st;
}

zo_status nvme_store_wait(nvme_store_t *s, nvme_store_op *o)
{
    while (!nvme_store_op_complete(o)) {
        zo_status st = nvme_engine_progress(s->e, 1);
        if (st != ZO_OK) return st; /* the ring failed: the op cannot complete */
        verify_arrived(s, o);
    }
    return nvme_store_finish(s, o);
}

zo_status nvme_store_write(nvme_store_t *s, int id, const void *buf)
{
    nvme_store_op o;
    zo_status st = nvme_store_submit(s, id, NVME_OP_WRITE, (void *)buf, &o);
    if (st != ZO_OK) return st;
    return nvme_store_wait(s, &o);
}

zo_status nvme_store_read(nvme_store_t *s, int id, void *buf)
{
    nvme_store_op o;
    zo_status st = nvme_store_submit(s, id, NVME_OP_READ, buf, &o);
    if (st != ZO_OK) return st;
    return nvme_store_wait(s, &o);
}
