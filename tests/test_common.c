/* Tests for common/: status messages, dtype conversions, size parsing, file I/O. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <immintrin.h>

#include "common/dtype.h"
#include "common/fileio.h"
#include "common/json.h"
#include "common/status.h"
#include "common/units.h"
#include "tests/support/scratch.h" /* defines: scratch_path */

static zo_status failing_call(void) { return zo_error(ZO_ERR_IO, "open x.bin: No such file"); }

static void test_status_check(void **state)
{
    (void)state;
    zo_clear_error();
    zo_status st = ZO_CHECK(failing_call());
    assert_int_equal(st, ZO_ERR_IO);
    const char *msg = zo_last_error();
    assert_non_null(strstr(msg, "failing_call()"));
    assert_non_null(strstr(msg, "test_status_check"));
    assert_non_null(strstr(msg, "open x.bin: No such file"));
    assert_int_equal(ZO_CHECK(ZO_OK), ZO_OK);
    assert_string_equal(zo_status_name(ZO_ERR_CAPACITY), "ZO_ERR_CAPACITY");
}

/* Round-to-nearest-even of fp32 to bf16, computed independently in double. */
static uint16_t bf16_ref(float f)
{
    uint32_t u = zo_f32_bits(f);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    double dlo = fabs((double)zo_bits_f32(lo)), dhi = fabs((double)zo_bits_f32(hi));
    double d = fabs((double)f);
    if ((lo & 0x7fffffffu) == 0x7f7f0000u && d - dlo >= (dlo - fabs((double)zo_bits_f32(lo - 0x10000u))) / 2)
        return (uint16_t)((u >> 16) + ((d - dlo > (dlo - fabs((double)zo_bits_f32(lo - 0x10000u))) / 2 ||
                                        ((u >> 16) & 1)) ? 1 : 0));
    if (isinf(dhi)) dhi = 2 * dlo - fabs((double)zo_bits_f32(lo - 0x10000u));
    if (d - dlo < dhi - d) return (uint16_t)(lo >> 16);
    if (d - dlo > dhi - d) return (uint16_t)(hi >> 16);
    return (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

static void test_bf16_rounding(void **state)
{
    (void)state;
    assert_int_equal(zo_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(zo_f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(zo_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(zo_f32_to_bf16(-INFINITY), 0xff80);
    assert_true(isnan(zo_bf16_to_f32(zo_f32_to_bf16(NAN))));
    /* ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> even (1.0) */
    assert_int_equal(zo_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(zo_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    /* largest finite rounds up to inf */
    assert_int_equal(zo_f32_to_bf16(3.4028235e38f), 0x7f80);
    uint64_t bad = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += 4093) {
        float f = zo_bits_f32((uint32_t)u);
        if (isnan(f) || (u & 0x7fffffffu) >= 0x7f7f0000u) continue;
        if (zo_f32_to_bf16(f) != bf16_ref(f)) bad++;
    }
    assert_int_equal(bad, 0);
}

/* Stochastic rounding to bf16 (issue 30's --master stochastic): over all
 * 2^16 values of the random bits, f rounds up to the bf16 above exactly as
 * often as its distance from the one below says, in double: (f - lo) /
 * (hi - lo) of the time, so the mean is f; a bf16 value never moves; nan
 * stays nan. */
static void test_bf16_stochastic(void **state)
{
    (void)state;
    uint64_t bad = 0, checked = 0;
    for (uint64_t u = 1; u < 0x100000000ull; u += 999983) {
        float f = zo_bits_f32((uint32_t)u);
        if (isnan(f) || isinf(f) || (u & 0x7fffffffu) >= 0x7f7f0000u) continue;
        uint32_t lo = (uint32_t)u & 0xffff0000u;
        double dlo = (double)zo_bits_f32(lo), dhi = (double)zo_bits_f32(lo + 0x10000u);
        uint32_t ups = 0;
        for (uint32_t r = 0; r < 65536; r++) {
            uint16_t b = zo_f32_to_bf16_sr(f, r);
            if (b == (uint16_t)((lo >> 16) + 1)) ups++;
            else if (b != (uint16_t)(lo >> 16)) bad++;
        }
        double want = ((double)f - dlo) / (dhi - dlo) * 65536.0;
        if (fabs((double)ups - want) > 1e-6) bad++;
        checked++;
    }
    assert_true(checked > 3000);
    assert_int_equal(bad, 0);
    for (uint32_t r = 0; r < 65536; r += 257) {
        assert_int_equal(zo_f32_to_bf16_sr(1.0f, r), 0x3f80);
        assert_int_equal(zo_f32_to_bf16_sr(-0.5f, r), 0xbf00);
        assert_true(isnan(zo_bf16_to_f32(zo_f32_to_bf16_sr(NAN, r))));
    }
}

/* The bf16 an fp32 pattern must round to: bf16_ref, with nan, inf and the
 * top of the range (where bf16_ref's neighbours run out) written out. */
static uint16_t bf16_want(uint32_t u)
{
    uint32_t a = u & 0x7fffffffu, sign = (u >> 16) & 0x8000u;
    if (a > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    if (a >= 0x7f7f0000u) { /* the largest bf16 0x7f7f, or inf from its tie up */
        uint32_t low = a & 0xffffu;
        return (uint16_t)(sign | (a == 0x7f800000u || low >= 0x8000u ? 0x7f80u : 0x7f7fu));
    }
    return bf16_ref(zo_bits_f32(u));
}

/* zo_bf16_to_f32_row and zo_f32_to_bf16_row (and zo_convert through them),
 * on the AVX2 path where the CPU has it and on the scalar loops: every bf16
 * widened to its bits shifted up; every fp32 high half with the low halves
 * around a tie (below, at, above it, 0 and all ones) rounded as bf16_want
 * says; rows of 0 to 40 elements at 4 alignments (each side of the 8- and
 * 16-element vectors), the elements past the row untouched; narrowed in
 * place. */
static void test_bf16_rows(void **state)
{
    (void)state;
    const size_t all = 65536, lows = 5;
    static const uint32_t low[5] = {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
    uint16_t *h = malloc(all * lows * sizeof *h);
    float *f = malloc(all * lows * sizeof *f);
    assert_non_null(h);
    assert_non_null(f);
#if defined(__x86_64__)
    __builtin_cpu_init();
    int have = __builtin_cpu_supports("avx2") ? 1 : 0;
#else
    int have = 0;
#endif
    assert_int_equal(zo_convert_simd(1), have);
    for (int simd = have; simd >= 0; simd--) {
        zo_convert_simd(simd);
        uint64_t bad = 0;
        for (size_t i = 0; i < all; i++) h[i] = (uint16_t)i;
        zo_bf16_to_f32_row(f, h, all);
        for (size_t i = 0; i < all; i++) bad += zo_f32_bits(f[i]) != (uint32_t)i << 16;
        for (size_t i = 0; i < all * lows; i++) f[i] = zo_bits_f32((uint32_t)(i / lows) << 16 | low[i % lows]);
        zo_f32_to_bf16_row(h, f, all * lows);
        for (size_t i = 0; i < all * lows; i++) bad += h[i] != bf16_want(zo_f32_bits(f[i]));
        /* in place: the same bytes */
        uint16_t *inplace = (uint16_t *)f;
        zo_f32_to_bf16_row(inplace, f, all * lows);
        for (size_t i = 0; i < all * lows; i++) bad += inplace[i] != h[i];
        /* lengths and alignments, guards past the row */
        uint32_t x = 12345u;
        for (size_t n = 0; n <= 40; n++)
            for (size_t off = 0; off < 4; off++) {
                float src[48], wide[48];
                uint16_t nar[48], back[48];
                for (size_t i = 0; i < 48; i++) {
                    x = x * 1664525u + 1013904223u;
                    src[i] = zo_bits_f32(x);
                    nar[i] = back[i] = 0xbeefu;
                    wide[i] = -7.0f;
                }
                zo_f32_to_bf16_row(nar + off, src + off, n);
                for (size_t i = 0; i < 48; i++)
                    bad += i >= off && i < off + n ? nar[i] != bf16_want(zo_f32_bits(src[i])) : nar[i] != 0xbeefu;
                for (size_t i = 0; i < 48; i++) back[i] = (uint16_t)(x >> (i % 16));
                zo_bf16_to_f32_row(wide + off, back + off, n);
                for (size_t i = 0; i < 48; i++)
                    bad += i >= off && i < off + n ? zo_f32_bits(wide[i]) != (uint32_t)back[i] << 16
                                                   : wide[i] != -7.0f;
                /* zo_convert: the same rows, and fp32 to fp32 a copy */
                uint16_t conv[48];
                float copy[48];
                zo_convert(conv, ZO_DTYPE_BF16, src + off, ZO_DTYPE_F32, n);
                for (size_t i = 0; i < n; i++) bad += conv[i] != nar[off + i];
                zo_convert(copy, ZO_DTYPE_F32, src + off, ZO_DTYPE_F32, n);
                bad += n && memcmp(copy, src + off, n * sizeof(float)) != 0;
            }
        printf("  %s: %llu elements wrong\n", simd ? "AVX2" : "scalar", (unsigned long long)bad);
        assert_int_equal(bad, 0);
    }
    zo_convert_simd(1);
    free(h);
    free(f);
}

__attribute__((target("f16c"))) static uint16_t f16_hw(float f)
{
    return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0);
}

__attribute__((target("f16c"))) static float f16_hw_up(uint16_t h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16((short)h)));
}

static void test_f16_against_hardware(void **state)
{
    (void)state;
    if (!__builtin_cpu_supports("f16c")) skip();
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float a = zo_f16_to_f32((uint16_t)h), b = f16_hw_up((uint16_t)h);
        if (isnan(b)) assert_true(isnan(a));
        else assert_int_equal(zo_f32_bits(a), zo_f32_bits(b));
    }
    uint64_t bad = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += 257) {
        float f = zo_bits_f32((uint32_t)u);
        uint16_t a = zo_f32_to_f16(f), b = f16_hw(f);
        if (isnan(f)) { bad += (a & 0x7c00) != 0x7c00 || !(a & 0x3ff); continue; }
        if (a != b) {
            if (bad < 5) print_error("f=%a (0x%08x): got 0x%04x want 0x%04x\n", f, (unsigned)u, a, b);
            bad++;
        }
    }
    assert_int_equal(bad, 0);
}

static void test_f16_edges(void **state)
{
    (void)state;
    assert_int_equal(zo_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(zo_f32_to_f16(65520.0f), 0x7c00);      /* tie rounds to even = inf */
    assert_int_equal(zo_f32_to_f16(65519.99f), 0x7bff);
    assert_int_equal(zo_f32_to_f16(0x1p-24f), 0x0001);     /* smallest subnormal */
    assert_int_equal(zo_f32_to_f16(0x1p-25f), 0x0000);     /* tie to even zero */
    assert_int_equal(zo_f32_to_f16(0x1.8p-25f), 0x0001);
    assert_int_equal(zo_f32_to_f16(-0.0f), 0x8000);
    assert_true(zo_f16_to_f32(0x0001) == 0x1p-24f);
}

static void test_parse_size(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(zo_parse_size("80GB", "--gpu-mem", 0, &v), ZO_OK);
    assert_int_equal(v, 80000000000ull);
    assert_int_equal(zo_parse_size("80GiB", "--gpu-mem", 0, &v), ZO_OK);
    assert_int_equal(v, 80ull << 30);
    assert_int_equal(zo_parse_size("1.5TB", "--nvme", 0, &v), ZO_OK);
    assert_int_equal(v, 1500000000000ull);
    assert_int_equal(zo_parse_size("4096", "x", 0, &v), ZO_OK);
    assert_int_equal(v, 4096);
    assert_int_equal(zo_parse_size("2 mib", "x", 0, &v), ZO_OK);
    assert_int_equal(v, 2ull << 20);
    assert_int_equal(zo_parse_size("0", "--nvme", 0, &v), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "--nvme"));
    assert_int_equal(zo_parse_size("0", "--nvme", 1, &v), ZO_OK);
    assert_int_equal(zo_parse_size("-5GB", "x", 0, &v), ZO_ERR_INVALID);
    assert_int_equal(zo_parse_size("5XB", "x", 0, &v), ZO_ERR_INVALID);
    assert_int_equal(zo_parse_size("", "x", 0, &v), ZO_ERR_INVALID);
    assert_int_equal(zo_parse_size("1e30", "x", 0, &v), ZO_ERR_INVALID);
}

static void test_parse_count(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(zo_parse_count("7.5e9", "--params", &v), ZO_OK);
    assert_int_equal(v, 7500000000ull);
    assert_int_equal(zo_parse_count("175B", "--params", &v), ZO_OK);
    assert_int_equal(v, 175000000000ull);
    assert_int_equal(zo_parse_count("1T", "--params", &v), ZO_OK);
    assert_int_equal(v, 1000000000000ull);
    assert_int_equal(zo_parse_count("0", "--params", &v), ZO_ERR_INVALID);
    assert_int_equal(zo_parse_count("12Q", "--params", &v), ZO_ERR_INVALID);
    long i;
    assert_int_equal(zo_parse_int("8", "--tp", 1, 1 << 20, &i), ZO_OK);
    assert_int_equal(i, 8);
    assert_int_equal(zo_parse_int("0", "--tp", 1, 1 << 20, &i), ZO_ERR_INVALID);
    assert_int_equal(zo_parse_int("4x", "--tp", 1, 1 << 20, &i), ZO_ERR_INVALID);
}

static void test_format(void **state)
{
    (void)state;
    char b[32];
    assert_string_equal(zo_format_bytes(80ull << 30, b, sizeof b), "80.00 GiB");
    assert_string_equal(zo_format_bytes(512, b, sizeof b), "512 B");
    assert_string_equal(zo_format_count(13015864320ull, b, sizeof b), "13.02B");
}

/* ---- file I/O -------------------------------------------------------------------------- */

static char *temp_dir(void)
{
    static char dir[64];
    scratch_path(dir, sizeof dir, "zo_test_fileio_XXXXXX");
    assert_non_null(mkdtemp(dir));
    return dir;
}

static void remove_dir(const char *dir)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* Whatever is left in dir besides `keep` (a temporary file would be). */
static int stray_files(const char *dir, const char *keep)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s | grep -vx '%s')\"", dir, keep);
    return system(cmd) != 0;
}

/* unnamed: 1 with unnamed temporary files (O_TMPFILE), 0 with named ones */
static void file_write_read(int unnamed)
{
    zo_file_test_hooks(unnamed, NULL);
    char *dir = temp_dir(), path[128];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    const char text[] = "line one\nline two\n";
    assert_int_equal(zo_file_write_all(path, text, strlen(text)), ZO_OK);
    char *got;
    size_t n;
    assert_int_equal(zo_file_read_all(path, 1 << 20, "a test file", &got, &n), ZO_OK);
    assert_int_equal(n, strlen(text));
    assert_string_equal(got, text);
    free(got);
    assert_false(stray_files(dir, "out.txt"));

    /* a streamed write replaces the file only when committed */
    zo_file_writer w;
    assert_int_equal(zo_file_create(&w, path), ZO_OK);
    assert_int_equal(zo_file_append(&w, "new", 3), ZO_OK);
    assert_int_equal(zo_file_read_all(path, 1 << 20, "a test file", &got, NULL), ZO_OK);
    assert_string_equal(got, text); /* not yet */
    free(got);
    zo_file_abort(&w);
    assert_false(stray_files(dir, "out.txt"));
    assert_int_equal(zo_file_create(&w, path), ZO_OK);
    assert_int_equal(zo_file_append(&w, "new", 3), ZO_OK);
    assert_int_equal(zo_file_commit(&w), ZO_OK);
    assert_int_equal(zo_file_read_all(path, 1 << 20, "a test file", &got, &n), ZO_OK);
    assert_string_equal(got, "new");
    free(got);

    /* an empty file reads as "" */
    assert_int_equal(zo_file_write_all(path, "", 0), ZO_OK);
    assert_int_equal(zo_file_read_all(path, 1 << 20, "a test file", &got, &n), ZO_OK);
    assert_int_equal(n, 0);
    assert_string_equal(got, "");
    free(got);
    assert_false(stray_files(dir, "out.txt"));
    remove_dir(dir);
    zo_file_test_hooks(1, NULL);
}

static void test_file_write_read(void **state)
{
    (void)state;
    file_write_read(1);
    file_write_read(0);
}

static void test_file_errors(void **state)
{
    (void)state;
    char *dir = temp_dir(), path[128];
    char *got = (char *)1;

    /* a missing file names itself and the system's reason */
    snprintf(path, sizeof path, "%s/absent.json", dir);
    assert_int_equal(zo_file_read_all(path, 100, "a test file", &got, NULL), ZO_ERR_IO);
    assert_null(got);
    assert_non_null(strstr(zo_last_error(), "absent.json: cannot open"));

    /* one byte over the limit: refused before reading, naming the size and the limit */
    snprintf(path, sizeof path, "%s/big.json", dir);
    char big[101];
    memset(big, 'x', sizeof big);
    assert_int_equal(zo_file_write_all(path, big, sizeof big), ZO_OK);
    assert_int_equal(zo_file_read_all(path, 100, "a test file", &got, NULL), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "101 bytes is too large for a test file (at most 100)"));
    assert_int_equal(zo_file_read_all(path, 101, "a test file", &got, NULL), ZO_OK);
    free(got);

    /* a FIFO (nobody writing) and other files that are not regular are
     * refused at once, naming the file; before, opening the FIFO waited
     * for a writer forever (the alarm fails the test then) */
    char fifo[128], cmd[256];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(cmd, sizeof cmd, "mkfifo %s", fifo);
    assert_int_equal(system(cmd), 0);
    alarm(20);
    assert_int_equal(zo_file_read_all(fifo, 4999, "a test file", &got, NULL), ZO_ERR_INVALID);
    assert_null(got);
    assert_non_null(strstr(zo_last_error(), "fifo: not a regular file (a FIFO): a test file must be"));
    int fd = 7;
    assert_int_equal(zo_file_open_regular(fifo, "a token file", &fd), ZO_ERR_INVALID);
    assert_int_equal(fd, -1);
    assert_int_equal(zo_file_open_regular(dir, "a token file", &fd), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "(a directory)"));
    assert_int_equal(zo_file_open_regular("/dev/null", "a token file", &fd), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "/dev/null: not a regular file (a character device)"));
    alarm(0);
    /* a link to a regular file is followed; the descriptor blocks again */
    char link[128];
    snprintf(link, sizeof link, "%s/link.json", dir);
    assert_int_equal(symlink(path, link), 0);
    assert_int_equal(zo_file_open_regular(link, "a token file", &fd), ZO_OK);
    assert_int_equal(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s/absent", dir);
    assert_int_equal(zo_file_open_regular(cmd, "x", &fd), ZO_ERR_NOT_FOUND);

    /* a directory that does not exist: nothing is written, the message names the file */
    snprintf(path, sizeof path, "%s/no/such/dir/out.json", dir);
    assert_int_equal(zo_file_write_all(path, "x", 1), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "out.json: cannot create a temporary file in "));
    assert_non_null(strstr(zo_last_error(), "no/such/dir: No such file or directory"));
    remove_dir(dir);
}

/* The temporary file of an atomic write takes no name that exists: a link
 * planted at the name writers used to take ("<file>.tmp.<pid>") or at a name
 * the writer draws (the test seam fixes the draws) is neither followed nor
 * replaced, and nothing outside the folder changes; with unnamed temporary
 * files (O_TMPFILE, linked in at commit) and with named ones. */
static uint64_t draws[3];
static int n_draws;
static uint64_t next_draw(void) { return draws[n_draws < 2 ? n_draws++ : 2]; }

static void read_equal(const char *path, const char *want)
{
    char *got;
    if (zo_file_read_all(path, 100, "a test file", &got, NULL) != ZO_OK) fail_msg("%s", zo_last_error());
    assert_string_equal(got, want);
    free(got);
}

static void test_file_write_no_follow(void **state)
{
    (void)state;
    char dir[64], away[64], victim[128], path[128], guess[160], old[160], cmd[400];
    snprintf(away, sizeof away, "%s", temp_dir()); /* outside the folder written in */
    snprintf(dir, sizeof dir, "%s", temp_dir());
    snprintf(victim, sizeof victim, "%s/victim", away);
    snprintf(path, sizeof path, "%s/out.json", dir);
    snprintf(old, sizeof old, "%s.tmp.%ld", path, (long)getpid());
    snprintf(guess, sizeof guess, "%s.tmp.%016llx", path, 1ull);
    for (int unnamed = 1; unnamed >= 0; unnamed--) {
        assert_int_equal(zo_file_write_all(victim, "precious", 8), ZO_OK);
        unlink(old);
        unlink(guess);
        unlink(path);
        assert_int_equal(symlink(victim, old), 0);
        assert_int_equal(symlink(victim, guess), 0);
        /* the first name drawn is taken: the writer draws another */
        draws[0] = 1, draws[1] = draws[2] = 2, n_draws = 0;
        zo_file_test_hooks(unnamed, next_draw);
        assert_int_equal(zo_file_write_all(path, "new", 3), ZO_OK);
        read_equal(victim, "precious");
        read_equal(path, "new");
        struct stat sb;
        assert_int_equal(lstat(path, &sb), 0);
        assert_true(S_ISREG(sb.st_mode));
        assert_int_equal(lstat(old, &sb), 0); /* the links stay, as they were */
        assert_true(S_ISLNK(sb.st_mode));
        assert_int_equal(lstat(guess, &sb), 0);
        assert_true(S_ISLNK(sb.st_mode));
        snprintf(cmd, sizeof cmd, "test \"$(ls -A %s | LC_ALL=C sort | tr '\\n' ' ')\" = \"out.json out.json.tmp.%016llx "
                 "out.json.tmp.%ld \"", dir, 1ull, (long)getpid());
        if (system(cmd) != 0) fail_msg("unnamed %d: stray files in %s", unnamed, dir);
        snprintf(cmd, sizeof cmd, "test \"$(ls -A %s)\" = victim", away);
        assert_int_equal(system(cmd), 0);
        /* every name drawn is taken: refused, naming the file; nothing changes */
        draws[0] = draws[1] = draws[2] = 1, n_draws = 0;
        assert_int_equal(zo_file_write_all(path, "newer", 5), ZO_ERR_IO);
        assert_non_null(strstr(zo_last_error(), path));
        assert_non_null(strstr(zo_last_error(), "temporary"));
        read_equal(path, "new");
        read_equal(victim, "precious");
    }
    zo_file_test_hooks(1, NULL);
    remove_dir(dir);
    remove_dir(away);
}

/* Removing a folder the runtime made: a link named like it is left alone
 * (its target untouched); links inside are removed, never what they point
 * to; a subdirectory inside stays, and so does the folder. */
static void test_dir_remove(void **state)
{
    (void)state;
    char *dir = temp_dir(), p[600], q[256];
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    assert_true(dfd >= 0);
    /* the user's own folder and file, reachable through links */
    snprintf(p, sizeof p, "%s/mine", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/mine/keep.txt", dir);
    assert_int_equal(zo_file_write_all(p, "precious", 8), ZO_OK);
    snprintf(q, sizeof q, "%s/step-00000001", dir);
    snprintf(p, sizeof p, "%s/mine", dir);
    assert_int_equal(symlink(p, q), 0);
    assert_int_equal(zo_dir_remove_at(dfd, "step-00000001"), ZO_ERR_INVALID);
    snprintf(p, sizeof p, "%s/mine/keep.txt", dir);
    assert_int_equal(access(p, F_OK), 0);
    assert_int_equal(access(q, F_OK), 0); /* the link itself stays too */
    /* a folder of ours holding a file and a link to the user's file */
    snprintf(q, sizeof q, "%s/ours", dir);
    assert_int_equal(mkdir(q, 0755), 0);
    snprintf(q, sizeof q, "%s/ours/state.json", dir);
    assert_int_equal(zo_file_write_all(q, "{}", 2), ZO_OK);
    snprintf(q, sizeof q, "%s/ours/model.safetensors", dir);
    assert_int_equal(symlink(p, q), 0);
    assert_int_equal(zo_dir_remove_at(dfd, "ours"), ZO_OK);
    snprintf(q, sizeof q, "%s/ours", dir);
    assert_int_not_equal(access(q, F_OK), 0);
    char *got;
    assert_int_equal(zo_file_read_all(p, 100, "x", &got, NULL), ZO_OK);
    assert_string_equal(got, "precious");
    free(got);
    /* a subdirectory is not descended into */
    snprintf(q, sizeof q, "%s/ours2/sub", dir);
    snprintf(p, sizeof p, "mkdir -p %s && touch %s/f", q, q);
    assert_int_equal(system(p), 0);
    assert_int_equal(zo_dir_remove_at(dfd, "ours2"), ZO_ERR_IO);
    snprintf(p, sizeof p, "%s/f", q);
    assert_int_equal(access(p, F_OK), 0);
    assert_int_equal(zo_dir_remove_at(dfd, "absent"), ZO_OK);
    close(dfd);
    remove_dir(dir);
}

/* A folder lock: a second holder, in this process or another, is refused
 * naming the folder and the holder; released, it can be taken again. */
static void test_dir_lock(void **state)
{
    (void)state;
    char *dir = temp_dir(), want[64];
    zo_dir_lock a, b;
    assert_int_equal(zo_dir_lock_take(dir, "the checkpoint folder", &a), ZO_OK);
    assert_true(zo_dir_lock_holds(&a, dir));
    assert_int_equal(zo_dir_lock_take(dir, "the checkpoint folder", &b), ZO_ERR_BUSY);
    assert_int_equal(b.fd, -1);
    snprintf(want, sizeof want, "pid %ld on host ", (long)getpid());
    assert_non_null(strstr(zo_last_error(), dir));
    assert_non_null(strstr(zo_last_error(), "the checkpoint folder is in use by another run"));
    assert_non_null(strstr(zo_last_error(), want));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(zo_dir_lock_take(dir, "x", &b) == ZO_ERR_BUSY ? 0 : 1);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    zo_dir_lock_release(&a);
    assert_int_equal(zo_dir_lock_take(dir, "x", &b), ZO_OK);
    zo_dir_lock_release(&b);
    /* a link planted as the lock file is not followed */
    char lk[128], victim[128];
    snprintf(lk, sizeof lk, "%s/" ZO_DIR_LOCK_NAME, dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    assert_int_equal(zo_file_write_all(victim, "v", 1), ZO_OK);
    assert_int_equal(unlink(lk), 0);
    assert_int_equal(symlink(victim, lk), 0);
    assert_int_equal(zo_dir_lock_take(dir, "x", &b), ZO_ERR_IO);
    char *got;
    assert_int_equal(zo_file_read_all(victim, 10, "x", &got, NULL), ZO_OK);
    assert_string_equal(got, "v");
    free(got);
    remove_dir(dir);
}

/* zo_dir_lock_take on `dir` in a child process as another user (uid, gid:
 * when the test runs as root; as itself otherwise): 0 when its status is
 * `want` (ZO_ERR_BUSY naming the holder `holder_pid`), 77 when the child
 * cannot become that user, 1 otherwise (the message on stderr). */
static int lock_as(const char *dir, uid_t uid, gid_t gid, zo_status want, pid_t holder_pid)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (geteuid() == 0 && (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0)) _exit(77);
        zo_dir_lock l;
        zo_status st = zo_dir_lock_take(dir, "the checkpoint folder", &l);
        char who[64];
        snprintf(who, sizeof who, "pid %ld on host ", (long)holder_pid);
        int ok = st == want && (want != ZO_ERR_BUSY || (strstr(zo_last_error(), "is in use by another run") &&
                                                        strstr(zo_last_error(), who)));
        if (!ok) fprintf(stderr, "as uid %d: %s: %s\n", (int)getuid(), zo_status_name(st), zo_last_error());
        _exit(ok ? 0 : 1);
    }
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 1;
}

/* A shared checkpoint folder whose lock file another user of the group left
 * (mode 0644, theirs): the lock is taken without write access to the file
 * (flock needs none), and a run holding it is named to the other user.
 * Run as root, the other user is a child that drops to uid 65534; run as a
 * user, the lock file is the user's own, made read-only (0444). Before, the
 * lock file was opened for writing: "Permission denied". */
static void test_dir_lock_other_user(void **state)
{
    (void)state;
    char *dir = temp_dir(), lk[128];
    const uid_t left_by = 65533, user = 65534;
    const gid_t group = 65534;
    snprintf(lk, sizeof lk, "%s/" ZO_DIR_LOCK_NAME, dir);
    int fd = open(lk, O_WRONLY | O_CREAT | O_EXCL, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "pid 1 host elsewhere\n", 21), 21);
    close(fd);
    if (geteuid() == 0) { /* a folder of the group, a lock file of another member */
        assert_int_equal(chown(dir, left_by, group), 0);
        assert_int_equal(chmod(dir, 02775), 0);
        assert_int_equal(chown(lk, left_by, group), 0);
    } else {
        assert_int_equal(chmod(lk, 0444), 0);
    }
    int rc = lock_as(dir, user, group, ZO_OK, 0);
    if (rc == 77) {
        remove_dir(dir);
        skip();
    }
    assert_int_equal(rc, 0);
    /* this process holds it: the other user is refused, told which run holds it */
    zo_dir_lock l;
    if (zo_dir_lock_take(dir, "the checkpoint folder", &l) != ZO_OK) fail_msg("%s", zo_last_error());
    assert_int_equal(lock_as(dir, user, group, ZO_ERR_BUSY, getpid()), 0);
    zo_dir_lock_release(&l);
    /* the other user holds it, unable to write its name into the file (which
     * names this process, its last writer): this process is told the holder's
     * pid all the same (/proc/locks) */
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid_t holder = fork();
    assert_true(holder >= 0);
    if (holder == 0) {
        char c = 0;
        close(up[0]);
        close(down[1]); /* the parent's end: closed there, read sees the end */
        if (geteuid() == 0 && (setgroups(0, NULL) != 0 || setgid(group) != 0 || setuid(user) != 0)) _exit(77);
        zo_dir_lock h;
        if (zo_dir_lock_take(dir, "the checkpoint folder", &h) != ZO_OK) _exit(1);
        if (write(up[1], &c, 1) != 1 || read(down[0], &c, 1) < 0) _exit(1); /* held until told */
        _exit(0);
    }
    char c;
    close(up[1]);
    close(down[0]);
    assert_int_equal(read(up[0], &c, 1), 1);
    assert_int_equal(zo_dir_lock_take(dir, "the checkpoint folder", &l), ZO_ERR_BUSY);
    char who[64];
    snprintf(who, sizeof who, "(pid %ld on host ", (long)holder);
    if (!strstr(zo_last_error(), who)) fail_msg("not named: %s", zo_last_error());
    close(down[1]);
    int ws;
    assert_int_equal(waitpid(holder, &ws, 0), holder);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    close(up[0]);
    struct stat sb;
    assert_int_equal(stat(lk, &sb), 0); /* the other member's file, as it was */
    assert_int_equal(sb.st_uid, geteuid() == 0 ? left_by : geteuid());
    remove_dir(dir);
}

/* One rule for keys given twice, at any depth: refused, naming the key. */
static void test_json_duplicates(void **state)
{
    (void)state;
    struct {
        const char *text, *key;
    } bad[] = {
        {"{\"n_embd\": 768, \"n_embd\": 1024}", "\"n_embd\""},
        {"{\"a\": {\"b\": 1, \"c\": 2, \"b\": 3}}", "\"a.b\""},
        {"{\"x\": [{\"k\": 1}, {\"k\": 1, \"k\": 2}]}", "\"x[1].k\""},
        {"{\"k0\":0,\"k1\":1,\"k2\":2,\"k3\":3,\"k4\":4,\"k5\":5,\"k6\":6,\"k7\":7,\"k8\":8,\"k3\":9}",
         "\"k3\""},
    };
    cJSON *doc;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(zo_json_parse(bad[i].text, strlen(bad[i].text), "c.json", &doc), ZO_ERR_FORMAT);
        assert_null(doc);
        assert_non_null(strstr(zo_last_error(), "c.json: key "));
        assert_non_null(strstr(zo_last_error(), bad[i].key));
        assert_non_null(strstr(zo_last_error(), "appears twice"));
    }
    const char *ok = "{\"a\": {\"b\": 1}, \"b\": [{\"a\": 1}, {\"a\": 2}]}  \n";
    assert_int_equal(zo_json_parse(ok, strlen(ok), "c.json", &doc), ZO_OK);
    assert_int_equal(cJSON_GetObjectItem(doc, "a")->child->valueint, 1);
    cJSON_Delete(doc);
    const char *trailing = "{\"a\": 1}\n x";
    assert_int_equal(zo_json_parse(trailing, strlen(trailing), "c.json", &doc), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "c.json:2:2: malformed JSON"));
}

/* zo_copy_team copies every byte once, whatever the team, at sizes around
 * its pieces and with unaligned ends, and touches nothing past them. */
static void test_copy_team(void **state)
{
    (void)state;
    const size_t P = ZO_COPY_PIECE;
    size_t sizes[] = {0, 1, 63, P - 1, P, P + 1, 2 * P - 1, 2 * P, 2 * P + 3, 5 * P + 7, 17 * P + 4095};
    int teams[] = {0, 1, 2, 3, 7, 64};
    size_t most = 17 * P + 4095 + 64;
    unsigned char *src = malloc(most), *dst = malloc(most);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < most; i++) src[i] = (unsigned char)(i * 2654435761u >> 13);
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t t = 0; t < sizeof teams / sizeof *teams; t++)
            for (size_t off = 0; off < 2; off++) { /* 0 and 3: aligned and unaligned */
                size_t o = off * 3, n = sizes[a];
                memset(dst, 0xA5, most);
                zo_copy_team(dst + o, src + 5, n, teams[t]);
                for (size_t i = 0; i < o; i++) assert_int_equal(dst[i], 0xA5);
                for (size_t i = 0; i < n; i++)
                    if (dst[o + i] != src[5 + i])
                        fail_msg("size %zu team %d offset %zu: byte %zu is %u, not %u", n, teams[t], o, i,
                                 dst[o + i], src[5 + i]);
                for (size_t i = o + n; i < o + n + 64 && i < most; i++) assert_int_equal(dst[i], 0xA5);
            }
    free(src);
    free(dst);
}

/* zo_memset_team sets every byte once and zo_convert_team writes
 * zo_convert's bytes, whatever the team, at sizes around their pieces, and
 * neither touches anything past them. */
static void test_memset_convert_team(void **state)
{
    (void)state;
    const size_t P = ZO_COPY_PIECE, E = ZO_COPY_PIECE / 4;
    size_t bytes[] = {0, 1, 63, P - 1, P, P + 1, 2 * P + 3, 5 * P + 7};
    size_t elems[] = {0, 1, 7, E - 1, E, E + 1, 2 * E + 3, 5 * E + 7};
    int teams[] = {0, 1, 2, 3, 7, 64};
    size_t most = 5 * P + 7 + 64;
    unsigned char *buf = malloc(most);
    float *src = malloc((5 * E + 7) * sizeof(float));
    uint16_t *want = malloc((5 * E + 7 + 32) * 2), *got = malloc((5 * E + 7 + 32) * 2);
    assert_non_null(buf);
    assert_non_null(src);
    assert_non_null(want);
    assert_non_null(got);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < 5 * E + 7; i++) { /* every bit pattern class: normals, subnormals, inf, nan */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        src[i] = zo_bits_f32((uint32_t)(x >> 17));
    }
    for (size_t a = 0; a < sizeof bytes / sizeof *bytes; a++)
        for (size_t t = 0; t < sizeof teams / sizeof *teams; t++) {
            size_t n = bytes[a];
            memset(buf, 0xA5, most);
            zo_memset_team(buf + 3, 0x3c, n, teams[t]);
            for (size_t i = 0; i < 3; i++) assert_int_equal(buf[i], 0xA5);
            for (size_t i = 0; i < n; i++)
                if (buf[3 + i] != 0x3c) fail_msg("memset size %zu team %d: byte %zu is %u", n, teams[t], i, buf[3 + i]);
            for (size_t i = 3 + n; i < 3 + n + 64 && i < most; i++) assert_int_equal(buf[i], 0xA5);
        }
    zo_dtype to[] = {ZO_DTYPE_BF16, ZO_DTYPE_F16};
    for (size_t d = 0; d < 2; d++)
        for (size_t a = 0; a < sizeof elems / sizeof *elems; a++)
            for (size_t t = 0; t < sizeof teams / sizeof *teams; t++) {
                size_t n = elems[a];
                memset(got, 0xA5, (n + 32) * 2);
                zo_convert(want, to[d], src, ZO_DTYPE_F32, n);
                zo_convert_team(got, to[d], src, ZO_DTYPE_F32, n, teams[t]);
                for (size_t i = 0; i < n; i++)
                    if (got[i] != want[i])
                        fail_msg("convert to %s, %zu elements, team %d: element %zu is 0x%04x, not 0x%04x",
                                 zo_dtype_name(to[d]), n, teams[t], i, got[i], want[i]);
                for (size_t i = n; i < n + 32; i++) assert_int_equal(got[i], 0xA5A5);
            }
    free(buf);
    free(src);
    free(want);
    free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_check),     cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_bf16_stochastic),   cmocka_unit_test(test_bf16_rows),
        cmocka_unit_test(test_f16_against_hardware), cmocka_unit_test(test_f16_edges),
        cmocka_unit_test(test_parse_size),       cmocka_unit_test(test_parse_count),
        cmocka_unit_test(test_format),           cmocka_unit_test(test_file_write_read),
        cmocka_unit_test(test_file_errors),      cmocka_unit_test(test_file_write_no_follow),
        cmocka_unit_test(test_dir_remove),       cmocka_unit_test(test_copy_team),
        cmocka_unit_test(test_memset_convert_team),
        cmocka_unit_test(test_dir_lock),         cmocka_unit_test(test_dir_lock_other_user),         cmocka_unit_test(test_json_duplicates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
