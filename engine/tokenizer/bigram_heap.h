/* bigram_heap.h — the binary min-heap of candidate merges that both BPE encoders run
 * (tokenizer_bpe.c by merge rank, tokenizer_spm.c by score). Header-only and static inline:
 * the order is a function the caller passes as a constant, so each encoder gets its own
 * inlined copy and the hot loop makes no indirect call. The caller owns the array and
 * makes room for one more element before a push. */
#ifndef MEDLEY_ENGINE_TOKENIZER_BIGRAM_HEAP_H
#define MEDLEY_ENGINE_TOKENIZER_BIGRAM_HEAP_H

#include <stddef.h>
#include <stdint.h>

/* Two adjacent symbols that could merge: left and right are symbol indices of the word. */
typedef struct {
    union {
        int32_t rank; /* BPE: merge rank, lowest first */
        float score;  /* SentencePiece: the merged token's score, highest first */
    };
    int32_t left, right;
    int32_t id;            /* BPE: the merged symbol's string id */
    uint32_t len_l, len_r; /* the sides' lengths when queued (stale when they changed);
                              SentencePiece: len_l is the merged length */
} tok_bigram;

/* Nonzero when a comes out of the heap before b. */
typedef int (*tok_bigram_before)(const tok_bigram *a, const tok_bigram *b);

static inline void tok_heap_push(tok_bigram *h, size_t *n, tok_bigram v, tok_bigram_before before) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&v, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

/* The first element; *n must be > 0. */
static inline tok_bigram tok_heap_pop(tok_bigram *h, size_t *n, tok_bigram_before before) {
    tok_bigram top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m)
            break;
        if (c + 1 < m && before(&h[c + 1], &h[c]))
            c++;
        if (!before(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (m)
        h[i] = last;
    return top;
}

#endif
