/* grammar_int.h — private layout shared by the grammar's files.
 *
 * Every front end (JSON Schema, regex, choice, EBNF) builds expressions in a gr_builder:
 * byte classes, sequences, alternatives, bounded repetitions and references to named rules.
 * gb_finish turns each rule into an epsilon-free NFA over bytes whose edges are either a
 * byte class or a call of another rule, prunes what can never finish, refuses left recursion,
 * and yields the immutable gr_grammar the matcher (gr_match.c) runs as a pushdown automaton. */
#ifndef MEDLEY_ENGINE_GRAMMAR_INT_H
#define MEDLEY_ENGINE_GRAMMAR_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/grammar/grammar.h"

/* Limits that keep compiling bounded whatever the input. */
#define GR_MAX_EXPRS (1 << 22)  /* expression nodes per grammar */
#define GR_MAX_STATES (1 << 21) /* NFA states per grammar */
#define GR_MAX_RULES (1 << 18)

typedef struct {
    uint64_t w[4];
} gr_cls;

static inline int gr_cls_has(const gr_cls *c, unsigned b) {
    return (c->w[b >> 6] >> (b & 63)) & 1;
}
static inline void gr_cls_set(gr_cls *c, unsigned b) {
    c->w[b >> 6] |= 1ull << (b & 63);
}

enum { GX_EMPTY, GX_NONE, GX_CLS, GX_SEQ, GX_ALT, GX_REP, GX_REF };

typedef struct {
    uint8_t kind;
    int32_t a, b;   /* SEQ/ALT: children; CLS: class index; REF: rule; REP: child in a */
    int32_t lo, hi; /* REP: bounds, hi < 0 unbounded */
} gr_expr;

typedef struct {
    char *name;
    int32_t expr; /* -1 until defined */
} gr_rule_def;

typedef struct gr_builder {
    gr_expr *ex;
    int nex, cex;
    gr_cls *cls;
    int ncls, ccls;
    gr_rule_def *rules;
    int nrules, crules;
    int failed; /* set once anything failed; every builder call then returns -1 */
    md_err *e;
} gr_builder;

void gb_init(gr_builder *b, md_err *e);
void gb_free(gr_builder *b);
/* Grows *p (of *cap elements of elem bytes) to hold need; 0, or -1 when out of memory. */
int gb_grow(void **p, int *cap, int need, size_t elem);
/* Each returns an expression index, or -1 once the builder failed (the error is in b->e). */
int gb_empty(gr_builder *b);
int gb_none(gr_builder *b);
int gb_cls(gr_builder *b, const gr_cls *c);
int gb_byte(gr_builder *b, unsigned char c);
int gb_range(gr_builder *b, unsigned lo, unsigned hi);
int gb_lit(gr_builder *b, const char *s, size_t n);
int gb_str(gr_builder *b, const char *s);
int gb_seq(gr_builder *b, int x, int y);
int gb_seq3(gr_builder *b, int x, int y, int z);
int gb_alt(gr_builder *b, int x, int y);
int gb_rep(gr_builder *b, int x, int lo, int hi);
int gb_opt(gr_builder *b, int x);
int gb_ref(gr_builder *b, int rule);
/* A rule by name: the existing one, or a new undefined one. -1 on failure. */
int gb_rule(gr_builder *b, const char *name);
/* A new rule with a unique name built from prefix. */
int gb_rule_new(gr_builder *b, const char *prefix);
void gb_rule_set(gr_builder *b, int rule, int expr);
/* Any one UTF-8 encoded code point (well-formed sequences only), excluding the ASCII bytes
 * in `except` (may be NULL). */
int gb_utf8_char(gr_builder *b, const gr_cls *ascii_except);
int gb_fail(gr_builder *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Compile the builder's rules, start rule root, into a grammar. The builder is left as is. */
int gb_finish(gr_builder *b, int root, gr_grammar **out, md_err *e);

/* Regex (docs/structured.md subset) into an expression of b. -1 on error (b->e says where). */
int gr_regex_expr(gr_builder *b, const char *re, size_t len);
/* The same for a JSON string's content (a schema's `pattern`: searched, JSON-escaped). */
int gr_regex_json_expr(gr_builder *b, const char *re, size_t len);

/* ---- the compiled grammar ------------------------------------------------------------ */

enum { GE_BYTES = 0, GE_CALL = 1 };

typedef struct {
    uint8_t kind;   /* GE_BYTES or GE_CALL */
    int32_t label;  /* class index or rule */
    int32_t target; /* node */
} gr_edge;

typedef struct gr_cache gr_cache;

struct gr_grammar {
    int n_nodes, n_rules, n_cls;
    int root;
    int32_t *rule_start; /* [n_rules] start node of each rule */
    int32_t *edge_off;   /* [n_nodes + 1] CSR into edges */
    gr_edge *edges;
    uint8_t *final;     /* [n_nodes] the rule may return here */
    uint8_t *has_bytes; /* [n_nodes] some byte edge leaves the node */
    gr_cls *cls;
    int32_t *rule_of;     /* [n_nodes] */
    gr_cls *first;        /* [n_rules] bytes a rule can start with */
    gr_cls *follow;       /* [n_rules] bytes that can follow a rule, in any context */
    pthread_mutex_t lock; /* guards caches */
    gr_cache *caches;     /* per vocabulary mask caches (gr_match.c) */
};

void gr_cache_free_all(gr_grammar *g);

/* The mask by an exact walk of the whole vocabulary trie from the matcher's stacks, without
 * the cache: the reference the cached gr_matcher_fill_mask is tested against. */
void gr_matcher_fill_mask_slow(gr_matcher *m, uint32_t *mask);

/* Shared by the regex and EBNF front ends (gr_regex.c): code point c (<= 0x10FFFF) as UTF-8
 * into o (4 bytes of room), returning the length; a hex digit's value, or -1. */
int gr_utf8_put(uint32_t c, uint8_t *o);
int gr_hex_digit(int c);
/* The quantifier at s[*i] (*, +, ?, {m}, {m,}, {m,n}; counts saturated at cap) into *lo and
 * *hi (-1: unbounded): 1 with *i past it; 0 when none is there; for a '{' not followed by a
 * well-formed count -1 (no count after '{'), -2 (none after ','), -3 (no '}'); *i unchanged
 * unless 1. */
int gr_parse_quant(const char *s, size_t n, size_t *i, long cap, int *lo, int *hi);

#endif
