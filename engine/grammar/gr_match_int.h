/* gr_match_int.h — private layout shared by the matcher's files (gr_vocab.c, gr_match.c,
 * gr_mask.c): the vocabulary and its trie, the mask cache, the matcher's stacks and scratch. */
#ifndef MEDLEY_ENGINE_GRAMMAR_MATCH_INT_H
#define MEDLEY_ENGINE_GRAMMAR_MATCH_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_int.h"

#define P_BOTTOM (-1)
#define P_ESC (-2)

/* ---- vocabulary ------------------------------------------------------------------------ */

struct gr_vocab {
    int n;
    uint64_t uid; /* caches are keyed by this, not by the address (which can be reused) */
    char *bytes;
    uint32_t *off, *len; /* [n] */
    uint8_t *is_eos;     /* [n] */
    int32_t *eos;        /* the distinct end tokens */
    int neos;
    int maxlen;
    /* trie in preorder: node k at depth tn_depth[k] (1-based) with byte tn_byte[k]; its
     * subtree ends before tn_end[k]; tokens ending at k are toks[tn_tok[k] .. tn_tok[k+1]) */
    int ntn;
    uint8_t *tn_byte;
    int32_t *tn_depth, *tn_end, *tn_tok;
    int32_t *toks;
    int ntoks;
};

/* ---- per (grammar, vocabulary) mask cache ------------------------------------------------ */

typedef struct {
    uint32_t *acc; /* [nwords] tokens accepted from the node whatever its caller, or NULL */
    int32_t *accl; /* the same as a list when short (fewer tokens than acc has words) */
    int naccl;
    int32_t *unc;  /* uncertain tokens, in trie order */
    uint16_t *lcp; /* bytes each shares with the previous uncertain token */
    int nunc;
} gr_nentry;

/* The OR of several nodes' dense bitsets, for a state that stands on all of them (any JSON
 * value may start: object, array, string, number and literal nodes at once). */
typedef struct {
    uint32_t hash;
    int n;
    int32_t *nodes; /* sorted */
    uint32_t *bits;
} gr_combo;

#define COMBO_SLOTS 512

struct gr_cache {
    uint64_t vocab_uid;
    int nwords;
    _Atomic(gr_nentry *) *ent;              /* [n_nodes] */
    _Atomic(gr_combo *) combo[COMBO_SLOTS]; /* set once, never replaced */
    int ncombo;                             /* under the grammar's lock */
    gr_cache *next;
};

/* ---- matcher ----------------------------------------------------------------------------- */

typedef struct {
    int32_t node, parent;
} gr_ent;

typedef struct {
    uint64_t *key;
    int32_t *id;
    uint8_t *vis;
    int32_t *used;
    int nused, cap;
} htab;

#define DF_END 1
#define DF_ESC 2
#define DF_ALIVE 4
#define DFA_MEMO 16384 /* states whose transitions are memoized (256 x 4 bytes each) */

struct gr_matcher {
    const gr_grammar *g;
    const gr_vocab *v;
    gr_cache *c;
    gr_ent *ar; /* stack entries; ids index it */
    int nar, car;
    int32_t *cur; /* ready stacks of the current state */
    int ncur, ccur;
    int end;  /* the root rule may end here */
    int done; /* an end token was accepted */
    /* scratch: concatenated sets per depth of a walk */
    int32_t *sets;
    int nsets, csets;
    int32_t *d_off, *d_len, *d_mark;
    uint8_t *d_end, *d_esc, *d_escany;
    int dcap;
    /* per-step hash (node, parent) -> slot; slots hold id and visited */
    htab h;  /* per step: (node, parent) -> entry, visited */
    htab hc; /* per walk while hc_on: hash-consing, so equal stacks get equal ids */
    int hc_on;
    /* per walk: a DFA over stack sets, built lazily (walk_trie) */
    int32_t *dpool; /* sorted entry ids of each state */
    int ndpool, cdpool;
    int32_t *doff, *dlen;
    uint8_t *dflag; /* DF_END, DF_ESC, DF_ALIVE */
    uint32_t *dhash;
    gr_cls *dposs;  /* bytes some stack of the state can take */
    int32_t *dslot; /* the state's slot in dtab (clearing dtab costs states, not capacity) */
    int ddead;      /* the empty state */
    int nds, cds;
    int32_t *dtab; /* open addressing: hash -> state */
    int dtcap;
    int32_t *dtrans; /* [min(nds, DFA_MEMO) * 256]: next state, -1 unknown */
    int ctrans;
    int32_t *dst; /* state per depth */
    int32_t *work;
    int nwork, cwork;
    uint32_t *nmark; /* [n_nodes] epoch marks */
    uint32_t epoch;
    int32_t *nlist;
    int oom; /* a scratch buffer could not grow: the last walk is incomplete */
};

/* Where a walk puts the tokens it accepts: a list while short, then a bitset. */
typedef struct {
    uint32_t *bits; /* [words], or NULL while listing */
    int32_t *list;
    int n, cap, words;
    int fail;
} gr_sink;

static inline void set_bit(uint32_t *mask, int t) {
    mask[t >> 5] |= 1u << (t & 31);
}
static inline int get_bit(const uint32_t *mask, int t) {
    return (mask[t >> 5] >> (t & 31)) & 1;
}

static inline void isort(int32_t *x, int n) {
    for (int i = 1; i < n; i++) {
        int32_t v = x[i];
        int j = i - 1;
        while (j >= 0 && x[j] > v) {
            x[j + 1] = x[j];
            j--;
        }
        x[j + 1] = v;
    }
}

/* gr_mask.c */
gr_nentry *gm_entry_of(gr_matcher *m, int n);
int gm_combo_fill(gr_matcher *m, int nn, uint32_t *mask, int words);

/* gr_match.c */
int gm_mgrow(gr_matcher *m, void **p, int *cap, int need, size_t elem);
void gm_h_clear(htab *h);
int gm_h_rehash(gr_matcher *m, htab *h, int ncap);
void gm_h_free(htab *h);
int32_t gm_ent_new(gr_matcher *m, int32_t node, int32_t parent);
void gm_visit(gr_matcher *m, int32_t id);
void gm_closure(gr_matcher *m, uint8_t *end, uint8_t *esc);
int gm_ensure_depth(gr_matcher *m, int maxd);
void gm_walk_init(gr_matcher *m, int node);
void gm_walk_trie(gr_matcher *m, const gr_cls *follow, gr_sink *acc, int32_t **unc, int *nunc,
                  int *cunc);

#endif
