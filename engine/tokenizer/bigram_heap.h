/* bigram_heap.h — the binary min-heap of candidate merges that both BPE encoders run
 * (tokenizer_bpe.c by merge rank, tokenizer_spm.c by score), over elements of the caller's
 * type: each encoder keeps its own pair struct (24 bytes for BPE, 16 for SentencePiece).
 * Header-only and static inline: the element size and the order are constants at each call,
 * so every encoder gets its own inlined copy with plain moves and no indirect call. The
 * caller owns the array and makes room for one more element before a push. */
#ifndef MEDLEY_ENGINE_TOKENIZER_BIGRAM_HEAP_H
#define MEDLEY_ENGINE_TOKENIZER_BIGRAM_HEAP_H

#include <stddef.h>
#include <string.h>

/* Nonzero when element a comes out of the heap before element b. */
typedef int (*tok_heap_before)(const void *a, const void *b);

/* Push the element at v (size bytes) onto the heap h of *n elements. */
static inline void tok_heap_push(void *h, size_t *n, const void *v, size_t size,
                                 tok_heap_before before) {
    char *a = h;
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(v, a + p * size))
            break;
        memcpy(a + i * size, a + p * size, size);
        i = p;
    }
    memcpy(a + i * size, v, size);
}

/* Pop the first element into top; *n must be > 0. */
static inline void tok_heap_pop(void *h, size_t *n, void *top, size_t size,
                                tok_heap_before before) {
    char *a = h;
    memcpy(top, a, size);
    size_t m = --*n, i = 0;
    const char *last = a + m * size; /* stays in place: the sift writes below m only */
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m)
            break;
        if (c + 1 < m && before(a + (c + 1) * size, a + c * size))
            c++;
        if (!before(a + c * size, last))
            break;
        memcpy(a + i * size, a + c * size, size);
        i = c;
    }
    if (m)
        memcpy(a + i * size, last, size);
}

#endif
