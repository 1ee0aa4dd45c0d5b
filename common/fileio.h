/* Whole files in and out: a file written under a temporary name and renamed
 * into place (so a reader never sees half of it and a failure leaves the old
 * file untouched), a bounded read of a whole small file, inputs that must be
 * regular files, and the folders the runtime owns: removed without following
 * links, locked for the life of a run. Messages name the file and the call
 * that failed. */
#ifndef ZO_COMMON_FILEIO_H
#define ZO_COMMON_FILEIO_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/status.h" /* defines: zo_status */

/* A file being written next to its final path, under no name that existed
 * before: an unnamed file in the final path's folder (O_TMPFILE) where the
 * file system has them, linked in at commit under a fresh random name
 * "<name>.tmp.<16 hex digits>"; elsewhere a file created at such a name
 * exclusively (O_CREAT | O_EXCL | O_NOFOLLOW). A name that exists, a link
 * planted there included, is never opened, followed or replaced: another
 * name is drawn (ZO_FILE_TMP_TRIES at most). */
#define ZO_FILE_TMP_TRIES 64
typedef struct zo_file_writer {
    char *path;         /* final name */
    char *tmp_path;     /* the file being written, as messages name it */
    char *name;         /* the final name's last component */
    char tmp_name[256]; /* the temporary name in the folder; "" while unnamed */
    int fd;
    int dirfd;          /* the final name's folder */
    int unnamed;        /* 1: an O_TMPFILE file, linked in at commit */
    uint64_t written;
} zo_file_writer;

/* Create the temporary file for writing. */
zo_status zo_file_create(zo_file_writer *f, const char *path);
/* Write all of buf (retrying short writes and EINTR). */
zo_status zo_file_append(zo_file_writer *f, const void *buf, size_t len);
/* fsync, (link an unnamed file in,) close, rename over `path`, fsync the
 * directory; frees f. On failure the temporary file is removed. */
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

/* Test seam: whether unnamed temporary files are tried (1, the default), and
 * what draws the temporary names' 64 random bits (NULL, the default:
 * getrandom). Not thread-safe; for tests only. */
void zo_file_test_hooks(int use_unnamed, uint64_t (*draw)(void));

/* Read the whole of `path`, a regular file (see zo_file_open_regular), into
 * a NUL-terminated buffer the caller frees; *len (may be NULL) gets its
 * bytes. More than `limit` bytes is ZO_ERR_FORMAT, "<path>: N bytes is too
 * large for <what> (at most <limit>)"; a file that cannot be opened or read
 * is ZO_ERR_IO with the system's reason. */
zo_status zo_file_read_all(const char *path, size_t limit, const char *what, char **out,
                           size_t *len);

/* Open `path` read-only when it is a regular file (a symbolic link to one is
 * followed). Anything else, a FIFO, a socket, a device or a directory, is
 * refused with ZO_ERR_INVALID, "<path>: not a regular file (a FIFO): <what>
 * must be a regular file", and never blocks: the open is non-blocking (a
 * FIFO with no writer would otherwise wait forever), then made blocking
 * again. A file that cannot be opened is ZO_ERR_NOT_FOUND (ENOENT) or
 * ZO_ERR_IO with the system's reason. *fd: O_RDONLY | O_CLOEXEC. */
zo_status zo_file_open_regular(const char *path, const char *what, int *fd);

/* ---- folders the runtime owns ------------------------------------------------- */

/* Remove the directory `name` inside the directory open as `dirfd`, one
 * level deep, never through a symbolic link: `name` must be a directory
 * itself (a link named so is left alone: ZO_ERR_INVALID); its entries that
 * are not directories are unlinked (a link inside is removed, never what it
 * points to; a subdirectory is left, and so is `name` then: ZO_ERR_IO).
 * `name` missing is ZO_OK. */
zo_status zo_dir_remove_at(int dirfd, const char *name);

/* An exclusive lock on a folder for as long as it is held: flock(2) on
 * <dir>/.zo-lock (created 0664, less the umask, if missing; never through a
 * link). The file is opened for writing where it can be, to record "pid
 * <pid> host <host>" of the holder; a lock file another user left in a
 * shared folder (or one made read-only) is opened read-only and locked all
 * the same, as flock needs no write access. Held elsewhere, by another
 * process or another zo_dir_lock of this one, it is ZO_ERR_BUSY: "<dir>:
 * <what> is in use by another run (pid P on host H; lock <dir>/.zo-lock)",
 * the holder as /proc/locks names it on this host, else as the file records
 * it (", as the lock file records": a holder on another host, or one that
 * could not write its name). The lock goes with the process (a killed run
 * holds nothing), and the file stays (removing it would race with a new
 * holder). */
#define ZO_DIR_LOCK_NAME ".zo-lock"
typedef struct zo_dir_lock {
    int fd;      /* -1: not held */
    uint64_t dev, ino; /* the folder's identity */
} zo_dir_lock;

zo_status zo_dir_lock_take(const char *dir, const char *what, zo_dir_lock *out);
/* 1 when `dir` is the folder `l` holds. */
int zo_dir_lock_holds(const zo_dir_lock *l, const char *dir);
void zo_dir_lock_release(zo_dir_lock *l);

#endif
