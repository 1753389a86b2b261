/* fuzz_util.h — what the fuzzers in tests/fuzz share: a seeded splitmix64 generator (the
 * seed is fixed so a failure reproduces; MEDLEY_FUZZ_SEED overrides it), the round count
 * (MEDLEY_FUZZ_ITERS, default 4000), exact-size heap copies (ASan then sees a read one past
 * the end), a reader that touches every byte, and the byte mutations the harnesses apply
 * (a flipped bit or a random byte, random bytes inserted, a range deleted).
 *
 * Header-only and static: each harness is a program of its own. */
#ifndef MEDLEY_TESTS_FUZZ_UTIL_H
#define MEDLEY_TESTS_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline uint64_t *fuzz_rng_state(void) {
    static uint64_t state;
    return &state;
}

/* Seed the generator: MEDLEY_FUZZ_SEED (decimal or 0x hex) when set, else default_seed. */
static inline void fuzz_seed(uint64_t default_seed) {
    const char *s = getenv("MEDLEY_FUZZ_SEED");
    *fuzz_rng_state() = s ? strtoull(s, NULL, 0) : default_seed;
}

static inline uint64_t fuzz_rnd(void) { /* splitmix64 */
    uint64_t z = (*fuzz_rng_state() += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform-enough in [0, n); 0 when n is 0. */
static inline size_t fuzz_below(size_t n) {
    return n ? (size_t)(fuzz_rnd() % n) : 0;
}

/* Random rounds per mutator family. */
static inline long fuzz_iters(void) {
    const char *s = getenv("MEDLEY_FUZZ_ITERS");
    long n = s ? atol(s) : 0;
    return n > 0 ? n : 4000;
}

/* Read every byte of p[0..n) (so ASan checks each read); the sum goes nowhere. */
static inline void fuzz_touch(const void *p, size_t n) {
    static volatile unsigned sink;
    unsigned acc = 0;
    for (size_t i = 0; i < n; i++)
        acc += ((const uint8_t *)p)[i];
    sink += acc;
}

/* A malloc'd copy of exactly len bytes (1 for an empty input); NULL when out of memory. The
 * caller frees it. */
static inline uint8_t *fuzz_copy(const void *buf, size_t len) {
    uint8_t *p = malloc(len ? len : 1);
    if (p && len)
        memcpy(p, buf, len);
    return p;
}

/* Flip one random bit of p[at] or (half the time) set it to a random byte. */
static inline void fuzz_flip_or_set(uint8_t *p, size_t at) {
    if (fuzz_rnd() & 1)
        p[at] ^= (uint8_t)(1u << fuzz_below(8));
    else
        p[at] = (uint8_t)fuzz_rnd();
}

/* k random bytes inserted at p[at] of *n bytes (the caller has room for *n + k). */
static inline void fuzz_insert(uint8_t *p, size_t *n, size_t at, size_t k) {
    memmove(p + at + k, p + at, *n - at);
    for (size_t i = 0; i < k; i++)
        p[at + i] = (uint8_t)fuzz_rnd();
    *n += k;
}

/* p[at .. at+k) of *n bytes removed (k clipped to the end). */
static inline void fuzz_delete(uint8_t *p, size_t *n, size_t at, size_t k) {
    if (at + k > *n)
        k = *n - at;
    memmove(p + at, p + at + k, *n - at - k);
    *n -= k;
}

#endif
