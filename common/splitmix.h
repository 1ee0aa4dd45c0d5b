/* splitmix64 (Steele, Lea, Flood 2014): a 64-bit counter stepped by the
 * golden-ratio increment, each step's value mixed to a full-period output.
 * Because the state is a counter, draw k of a stream starting at s is
 * zo_splitmix_mix(s + (k + 1) ZO_SPLITMIX_GOLDEN): the weights'
 * initialization fills elements in parallel from that, and skips the
 * draws of the experts outside a rank's window by adding to the state.
 * Used by the initialization, the data loader's offsets and generate's
 * sampling; the tests keep their own copies as references. */
#ifndef ZO_COMMON_SPLITMIX_H
#define ZO_COMMON_SPLITMIX_H

#include <stdint.h>

#define ZO_SPLITMIX_GOLDEN 0x9e3779b97f4a7c15ull

/* The output of the counter value z. */
static inline uint64_t zo_splitmix_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The next draw of the stream *s (which it steps). */
static inline uint64_t zo_splitmix_next(uint64_t *s) { return zo_splitmix_mix(*s += ZO_SPLITMIX_GOLDEN); }

/* The state n draws after s. */
static inline uint64_t zo_splitmix_skip(uint64_t s, uint64_t n) { return s + n * ZO_SPLITMIX_GOLDEN; }

#endif
