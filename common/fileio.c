/* Atomic writes, bounded whole-file reads, regular files only, and the
 * folders the runtime owns (removal without links, locks). */
#include "common/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

static int use_unnamed = 1;
static uint64_t (*draw_hook)(void);

void zo_file_test_hooks(int unnamed, uint64_t (*draw)(void))
{
    use_unnamed = unnamed;
    draw_hook = draw;
}

/* 64 random bits for a temporary name. Without entropy (getrandom failing
 * early at boot) a mix of the clock, the pid and a counter: exclusive
 * creation, not the name, is what keeps the write safe. */
static uint64_t draw_token(void)
{
    if (draw_hook) return draw_hook();
    uint64_t v;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) == (ssize_t)sizeof v) return v;
    static uint64_t count;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    v = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 32 ^ (uint64_t)getpid() << 16 ^
        __atomic_add_fetch(&count, 1, __ATOMIC_RELAXED) * 0x9e3779b97f4a7c15ull;
    v = (v ^ v >> 31) * 0xbf58476d1ce4e5b9ull; /* splitmix64's finish */
    return v ^ v >> 29;
}

/* A fresh temporary name for f: "<name>.tmp.<16 hex>", the name cut to 200
 * bytes so that it stays a valid file name. */
static void draw_name(zo_file_writer *f)
{
    snprintf(f->tmp_name, sizeof f->tmp_name, "%.200s.tmp.%016llx", f->name,
             (unsigned long long)draw_token());
}

static void writer_free(zo_file_writer *f)
{
    if (f->fd >= 0) close(f->fd);
    if (f->dirfd >= 0) close(f->dirfd);
    free(f->path);
    free(f->tmp_path);
    free(f->name);
    memset(f, 0, sizeof *f);
    f->fd = f->dirfd = -1;
}

/* f->tmp_path: what messages call the file: "<dir>/<tmp_name>", or "<path>
 * (unnamed, being written)". */
static zo_status name_tmp_path(zo_file_writer *f)
{
    size_t n = strlen(f->path) + sizeof f->tmp_name + 32;
    char *p = malloc(n);
    if (!p) return zo_error(ZO_ERR_NOMEM, "%s: cannot copy the path", f->path);
    size_t dir = strlen(f->path) - strlen(f->name);
    if (f->tmp_name[0]) snprintf(p, n, "%.*s%s", (int)dir, f->path, f->tmp_name);
    else snprintf(p, n, "%s (unnamed, being written)", f->path);
    free(f->tmp_path);
    f->tmp_path = p;
    return ZO_OK;
}

/* An unnamed file can be linked in through /proc/self/fd (linkat with
 * AT_SYMLINK_FOLLOW, open(2)'s way): 1 when that path leads to fd's file. */
static int linkable(int fd)
{
    char p[64];
    struct stat a, b;
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    return fstat(fd, &a) == 0 && stat(p, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

zo_status zo_file_create(zo_file_writer *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->fd = f->dirfd = -1;
    zo_status st;
    const char *slash = strrchr(path, '/');
    f->path = strdup(path);
    f->name = strdup(slash ? slash + 1 : path);
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!f->path || !f->name || !dir) {
        st = zo_error(ZO_ERR_NOMEM, "%s: cannot copy the path", path);
        goto out_free;
    }
    if (!f->name[0] || !strcmp(f->name, ".") || !strcmp(f->name, "..")) {
        st = zo_error(ZO_ERR_INVALID, "%s: cannot create: not a file name", path);
        goto out_free;
    }
    f->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (f->dirfd < 0) {
        st = zo_error(ZO_ERR_IO, "%s: cannot create a temporary file in %s: %s", path, dir, strerror(errno));
        goto out_free;
    }
    if (use_unnamed) {
        f->fd = openat(f->dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
        if (f->fd >= 0 && linkable(f->fd)) {
            f->unnamed = 1;
            free(dir);
            return name_tmp_path(f);
        }
        if (f->fd >= 0) close(f->fd); /* the file system has no O_TMPFILE, or no /proc: a named file */
        f->fd = -1;
    }
    for (int tries = 0; tries < ZO_FILE_TMP_TRIES && f->fd < 0; tries++) {
        draw_name(f);
        f->fd = openat(f->dirfd, f->tmp_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (f->fd < 0 && errno != EEXIST) {
            st = zo_error(ZO_ERR_IO, "%s: cannot create a temporary file in %s: %s", path, dir, strerror(errno));
            goto out_free;
        }
    }
    if (f->fd < 0) {
        f->tmp_name[0] = 0;
        st = zo_error(ZO_ERR_IO, "%s: cannot create a temporary file in %s: the %d names drawn all exist",
                      path, dir, ZO_FILE_TMP_TRIES);
        goto out_free;
    }
    free(dir);
    if ((st = name_tmp_path(f)) != ZO_OK) zo_file_abort(f);
    return st;
out_free:
    free(dir);
    writer_free(f);
    return st;
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

/* Link f's unnamed file into its folder under a fresh name (linkat never
 * replaces or follows what is at the new name: a name taken, another). */
static zo_status link_unnamed(zo_file_writer *f)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", f->fd);
    for (int tries = 0; tries < ZO_FILE_TMP_TRIES; tries++) {
        draw_name(f);
        if (linkat(AT_FDCWD, proc, f->dirfd, f->tmp_name, AT_SYMLINK_FOLLOW) == 0) return name_tmp_path(f);
        int e = errno;
        f->tmp_name[0] = 0;
        if (e != EEXIST)
            return zo_error(ZO_ERR_IO, "%s: cannot link the written file into its folder: %s", f->path, strerror(e));
    }
    return zo_error(ZO_ERR_IO, "%s: cannot link the written file into its folder: the %d temporary names drawn "
                    "all exist", f->path, ZO_FILE_TMP_TRIES);
}

zo_status zo_file_commit(zo_file_writer *f)
{
    zo_status st = ZO_OK;
    if (fsync(f->fd) != 0) {
        st = zo_error(ZO_ERR_IO, "%s: fsync: %s", f->tmp_path, strerror(errno));
        goto out_abort;
    }
    if (f->unnamed && (st = link_unnamed(f)) != ZO_OK) goto out_abort;
    int fd = f->fd;
    f->fd = -1;
    if (close(fd) != 0) {
        st = zo_error(ZO_ERR_IO, "%s: close: %s", f->tmp_path, strerror(errno));
        goto out_abort;
    }
    /* a link at the final name is replaced, never followed */
    if (renameat(f->dirfd, f->tmp_name, f->dirfd, f->name) != 0) {
        st = zo_error(ZO_ERR_IO, "rename %s -> %s: %s", f->tmp_path, f->path, strerror(errno));
        goto out_abort;
    }
    f->tmp_name[0] = 0;
    fsync(f->dirfd); /* make the rename itself durable */
    writer_free(f);
    return ZO_OK;
out_abort:
    zo_file_abort(f);
    return st;
}

void zo_file_abort(zo_file_writer *f)
{
    if (f->tmp_name[0] && f->dirfd >= 0) unlinkat(f->dirfd, f->tmp_name, 0); /* ours: made exclusively */
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

static const char *file_kind(mode_t m)
{
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISDIR(m)) return "a directory";
    return "not a file";
}

zo_status zo_file_open_regular(const char *path, const char *what, int *fd)
{
    *fd = -1;
    /* non-blocking: opening a FIFO for reading waits for a writer otherwise */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0) {
        int e = errno;
        return zo_error(e == ENOENT ? ZO_ERR_NOT_FOUND : ZO_ERR_IO, "%s: cannot open: %s", path,
                        strerror(e));
    }
    struct stat sb;
    if (fstat(f, &sb) != 0) {
        int e = errno;
        close(f);
        return zo_error(ZO_ERR_IO, "%s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        return zo_error(ZO_ERR_INVALID, "%s: not a regular file (%s): %s must be a regular file", path,
                        file_kind(sb.st_mode), what);
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(f);
        return zo_error(ZO_ERR_IO, "%s: fcntl: %s", path, strerror(e));
    }
    *fd = f;
    return ZO_OK;
}

zo_status zo_file_read_all(const char *path, size_t limit, const char *what, char **out,
                           size_t *len)
{
    *out = NULL;
    if (len) *len = 0;
    int fd;
    zo_status st = zo_file_open_regular(path, what, &fd);
    if (st == ZO_ERR_NOT_FOUND) return ZO_ERR_IO; /* the message names the reason */
    if (st != ZO_OK) return st;
    char *buf = NULL;
    size_t cap = 1 << 16, n = 0; /* buf holds cap bytes, the last for the NUL */
    struct stat sb;
    if (fstat(fd, &sb) == 0) {
        if ((uint64_t)sb.st_size > limit) {
            st = zo_error(ZO_ERR_FORMAT, "%s: %lld bytes is too large for %s (at most %zu)", path,
                          (long long)sb.st_size, what, limit);
            goto out_close;
        }
        cap = (size_t)sb.st_size + 1; /* the whole file, unless it grows */
    }
    if (cap > limit + 1) cap = limit + 1; /* a file growing: never read past the limit */
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

/* ---- folders the runtime owns ------------------------------------------------------ */

zo_status zo_dir_remove_at(int dirfd, const char *name)
{
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) return ZO_OK;
        if (e == ELOOP || e == ENOTDIR)
            return zo_error(ZO_ERR_INVALID, "%s: not a directory (a link or a file): left alone", name);
        return zo_error(ZO_ERR_IO, "%s: open: %s", name, strerror(e));
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return zo_error(ZO_ERR_IO, "%s: fdopendir: %s", name, strerror(e));
    }
    /* entries relative to the directory opened above: a link put in its
     * place meanwhile changes nothing */
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        struct stat sb;
        if (fstatat(fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(sb.st_mode)) continue;
        unlinkat(fd, de->d_name, 0); /* a link itself, never its target */
    }
    closedir(d);
    if (unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        return zo_error(ZO_ERR_IO, "%s: cannot remove: %s", name, strerror(errno));
    return ZO_OK;
}

/* The pid holding an flock on the file open as fd, from /proc/locks (a
 * holder on this host, in this pid namespace); 0 when none is listed. */
static long flock_holder_pid(int fd)
{
    struct stat sb;
    FILE *f = fstat(fd, &sb) == 0 ? fopen("/proc/locks", "re") : NULL;
    if (!f) return 0;
    char line[256];
    long found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        char type[16];
        long pid;
        unsigned maj, mnr;
        unsigned long long ino;
        /* "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF"; a waiter's line has "->" */
        if (strstr(line, "->") ||
            sscanf(line, "%*d: %15s %*s %*s %ld %x:%x:%llu", type, &pid, &maj, &mnr, &ino) != 5)
            continue;
        if (!strcmp(type, "FLOCK") && pid > 0 && ino == (unsigned long long)sb.st_ino &&
            maj == major(sb.st_dev) && mnr == minor(sb.st_dev))
            found = pid;
    }
    fclose(f);
    return found;
}

/* Who holds the lock open as fd: "pid P on host H" (this host's, from
 * /proc/locks), else what the lock file records: "pid P on host H (as the
 * lock file records)" (a holder elsewhere, or one that could not write its
 * name: the file may name an earlier holder), or "pid unknown". */
static void lock_holder(int fd, char *out, size_t len)
{
    char buf[320], host[256] = "unknown";
    long pid = flock_holder_pid(fd);
    if (pid) {
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = 0;
        snprintf(out, len, "pid %ld on host %s", pid, host);
        return;
    }
    ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
    buf[r > 0 ? r : 0] = 0;
    if (sscanf(buf, "pid %ld host %255s", &pid, host) == 2)
        snprintf(out, len, "pid %ld on host %s, as the lock file records", pid, host);
    else
        snprintf(out, len, "pid unknown");
}

zo_status zo_dir_lock_take(const char *dir, const char *what, zo_dir_lock *out)
{
    out->fd = -1;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        int e = errno;
        return zo_error(e == ENOENT ? ZO_ERR_NOT_FOUND : ZO_ERR_IO, "%s: %s: cannot open: %s", dir,
                        what, strerror(e));
    }
    struct stat ds;
    if (fstat(dfd, &ds) != 0) {
        int e = errno;
        close(dfd);
        return zo_error(ZO_ERR_IO, "%s: fstat: %s", dir, strerror(e));
    }
    /* writable, to record the holder; another user's lock file (or a
     * read-only one) is locked read-only: flock needs no write access */
    int writable = 1;
    int fd = openat(dfd, ZO_DIR_LOCK_NAME, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0664);
    int e = errno;
    if (fd < 0 && (e == EACCES || e == EPERM || e == EROFS)) {
        fd = openat(dfd, ZO_DIR_LOCK_NAME, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0 && errno != ENOENT) e = errno; /* absent: it could not be created (e) */
        writable = 0;
    }
    close(dfd);
    if (fd < 0)
        return zo_error(ZO_ERR_IO, "%s/%s: cannot open the lock of %s: %s", dir, ZO_DIR_LOCK_NAME,
                        what, e == ELOOP ? "it is a symbolic link" : strerror(e));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return zo_error(ZO_ERR_IO, "%s/%s: the lock of %s is not a regular file", dir,
                        ZO_DIR_LOCK_NAME, what);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        e = errno;
        char holder[360];
        lock_holder(fd, holder, sizeof holder);
        close(fd);
        if (e == EWOULDBLOCK)
            return zo_error(ZO_ERR_BUSY, "%s: %s is in use by another run (%s; lock %s/%s)", dir,
                            what, holder, dir, ZO_DIR_LOCK_NAME);
        return zo_error(ZO_ERR_IO, "%s/%s: flock: %s", dir, ZO_DIR_LOCK_NAME, strerror(e));
    }
    if (writable) { /* who holds it, for the message a second run elsewhere prints (best effort) */
        char host[256] = "unknown", text[320];
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = 0;
        for (char *p = host; *p; p++)
            if (*p == ' ' || *p == '\n') *p = '_';
        int n = snprintf(text, sizeof text, "pid %ld host %s\n", (long)getpid(), host);
        if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n) { /* the lock holds anyway */ }
    }
    out->fd = fd;
    out->dev = (uint64_t)ds.st_dev;
    out->ino = (uint64_t)ds.st_ino;
    return ZO_OK;
}

int zo_dir_lock_holds(const zo_dir_lock *l, const char *dir)
{
    struct stat sb;
    return l->fd >= 0 && stat(dir, &sb) == 0 && (uint64_t)sb.st_dev == l->dev &&
           (uint64_t)sb.st_ino == l->ino;
}

void zo_dir_lock_release(zo_dir_lock *l)
{
    if (l->fd >= 0) close(l->fd); /* closing the last descriptor releases the flock */
    l->fd = -1;
}
