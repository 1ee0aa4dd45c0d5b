#include "unicode.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "unicode_tables.h" /* defines: uc_letters, uc_numbers, uc_ccc, uc_decomp, uc_compose */

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Hangul syllables: composed and decomposed by arithmetic (Unicode 3.12). */
enum {
    H_SBASE = 0xAC00, H_LBASE = 0x1100, H_VBASE = 0x1161, H_TBASE = 0x11A7,
    H_LCOUNT = 19, H_VCOUNT = 21, H_TCOUNT = 28, H_NCOUNT = H_VCOUNT * H_TCOUNT,
    H_SCOUNT = H_LCOUNT * H_NCOUNT,
};

const char *model_uc_version(void) { return UC_UNICODE_VERSION; }

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0]) hi = mid;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

static int is_white_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

static model_uc_class class_slow(uint32_t cp)
{
    if (is_white_space(cp)) return MODEL_UC_SPACE;
    if (in_ranges(uc_letters, N_OF(uc_letters), cp)) return MODEL_UC_LETTER;
    if (in_ranges(uc_numbers, N_OF(uc_numbers), cp)) return MODEL_UC_NUMBER;
    return MODEL_UC_OTHER;
}

/* The Basic Multilingual Plane as one byte per code point (64 KiB), built
 * once; the other planes by binary search. */
static uint8_t bmp_class[0x10000];
static pthread_once_t bmp_once = PTHREAD_ONCE_INIT;

static void bmp_build(void)
{
    for (uint32_t cp = 0; cp < 0x10000; cp++) bmp_class[cp] = (uint8_t)class_slow(cp);
}

model_uc_class model_uc_class_of(uint32_t cp)
{
    if (cp < 0x10000) {
        pthread_once(&bmp_once, bmp_build);
        return (model_uc_class)bmp_class[cp];
    }
    return class_slow(cp);
}

int model_utf8_put(uint32_t cp, char *out)
{
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | cp >> 6);
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12);
        o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | cp >> 18);
    o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

size_t model_utf8_check(const char *str, size_t n)
{
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0;
    while (i < n) {
        /* ASCII eight bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF; /* the second byte's range (Unicode Table 3-7) */
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;       /* overlong */
            else if (c == 0xED) hi = 0x9F;  /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;       /* overlong */
            else if (c == 0xF4) hi = 0x8F;  /* above U+10FFFF */
        } else {
            return i;
        }
        if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += len;
    }
    return n;
}

/* ---- NFC ------------------------------------------------------------------------ */

static int ccc_of(uint32_t cp)
{
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = N_OF(uc_ccc);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < uc_ccc[mid][0]) hi = mid;
        else if (cp > uc_ccc[mid][1]) lo = mid + 1;
        else return (int)uc_ccc[mid][2];
    }
    return 0;
}

static int unstable(uint32_t cp)
{
    return cp >= 0x300 && in_ranges(uc_nfc_unstable, N_OF(uc_nfc_unstable), cp);
}

int model_uc_nfc_quick(const char *str, size_t n)
{
    const uint8_t *s = (const uint8_t *)str;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0xCC) { /* below U+0300 */
            i += s[i] < 0x80 ? 1 : 2;
            continue;
        }
        uint32_t cp;
        i += (size_t)model_utf8_next(s + i, &cp);
        if (unstable(cp)) return 0;
    }
    return 1;
}

/* The full canonical decomposition of cp into out (room for 4 + the
 * longest table entry); returns the count. */
static int decompose(uint32_t cp, uint32_t *out)
{
    if (cp >= H_SBASE && cp < H_SBASE + H_SCOUNT) {
        uint32_t s = cp - H_SBASE, t = s % H_TCOUNT;
        out[0] = H_LBASE + s / H_NCOUNT;
        out[1] = H_VBASE + (s % H_NCOUNT) / H_TCOUNT;
        if (!t) return 2;
        out[2] = H_TBASE + t;
        return 3;
    }
    if (cp >= 0xC0) {
        size_t lo = 0, hi = N_OF(uc_decomp);
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (cp < uc_decomp[mid][0]) hi = mid;
            else if (cp > uc_decomp[mid][0]) lo = mid + 1;
            else {
                uint32_t off = uc_decomp[mid][1], len = uc_decomp[mid][2];
                memcpy(out, uc_decomp_pool + off, len * sizeof(uint32_t));
                return (int)len;
            }
        }
    }
    out[0] = cp;
    return 1;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= H_LBASE && a < H_LBASE + H_LCOUNT && b >= H_VBASE && b < H_VBASE + H_VCOUNT)
        return H_SBASE + ((a - H_LBASE) * H_VCOUNT + (b - H_VBASE)) * H_TCOUNT;
    if (a >= H_SBASE && a < H_SBASE + H_SCOUNT && (a - H_SBASE) % H_TCOUNT == 0 && b > H_TBASE &&
        b < H_TBASE + H_TCOUNT)
        return a + (b - H_TBASE);
    size_t lo = 0, hi = N_OF(uc_compose);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a < uc_compose[mid][0] || (a == uc_compose[mid][0] && b < uc_compose[mid][1])) hi = mid;
        else if (a > uc_compose[mid][0] || b > uc_compose[mid][1]) lo = mid + 1;
        else return uc_compose[mid][2];
    }
    return 0;
}

zo_status model_uc_nfc(const char *str, size_t n, char **out, size_t *out_n)
{
    const uint8_t *s = (const uint8_t *)str;
    /* decomposition: at most 4 code points per input byte (a Hangul
     * syllable is 3 bytes -> 3; table entries are at most 4 per 2 bytes) */
    uint32_t *cps = malloc((n * 4 + 8) * sizeof(uint32_t));
    int *cc = malloc((n * 4 + 8) * sizeof(int));
    char *o = malloc(n * 4 + 8); /* recomposed, never longer than decomposed */
    if (!cps || !cc || !o) {
        free(cps);
        free(cc);
        free(o);
        return zo_error(ZO_ERR_NOMEM, "NFC of %zu bytes: out of memory", n);
    }
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)model_utf8_next(s + i, &cp);
        m += (size_t)decompose(cp, cps + m);
    }
    for (size_t i = 0; i < m; i++) cc[i] = ccc_of(cps[i]);
    /* canonical ordering: a stable sort of each run of non-starters by class */
    for (size_t i = 0; i < m;) {
        if (!cc[i]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < m && cc[j]) j++;
        for (size_t a = i + 1; a < j; a++) /* insertion sort: runs are short */
            for (size_t b = a; b > i && cc[b - 1] > cc[b]; b--) {
                uint32_t t = cps[b];
                cps[b] = cps[b - 1];
                cps[b - 1] = t;
                int tc = cc[b];
                cc[b] = cc[b - 1];
                cc[b - 1] = tc;
            }
        i = j;
    }
    /* canonical composition (UAX #15's algorithm) */
    size_t w = 0;
    if (m) {
        size_t starter = 0;
        int last = cc[0] ? 256 : 0;
        w = 1;
        for (size_t i = 1; i < m; i++) {
            uint32_t ch = cps[i];
            int k = cc[i];
            uint32_t comp = compose(cps[starter], ch);
            if (comp && (last < k || last == 0)) { /* last == 0: ch follows the starter */
                cps[starter] = comp;
                continue;
            }
            if (k == 0) starter = w;
            last = k;
            cps[w++] = ch;
        }
    }
    size_t len = 0;
    for (size_t i = 0; i < w; i++) len += (size_t)model_utf8_put(cps[i], o + len);
    o[len] = 0;
    free(cps);
    free(cc);
    *out = o;
    *out_n = len;
    return ZO_OK;
}
