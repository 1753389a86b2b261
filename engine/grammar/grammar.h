/* grammar.h — constrained decoding: what a sequence may generate next (docs/structured.md).
 *
 * Three objects:
 *  - gr_grammar: a compiled constraint (a JSON Schema, any JSON object, a regex, a list of
 *    choices, or a grammar in the documented EBNF notation), over bytes. Immutable once
 *    built; any number of threads and sequences share one.
 *  - gr_vocab: one tokenizer's tokens as byte strings plus its end tokens, with what can be
 *    precomputed per tokenizer (sorted tries, prefix sharing). Built once per engine.
 *  - gr_matcher: one sequence's position in a grammar over a vocabulary. Masks and accepts
 *    tokens; one thread at a time.
 *
 * Errors (MD_EINVAL for a constraint that is wrong, MD_EUNSUPP for one medley cannot enforce)
 * name the keyword and its JSON pointer ("'pattern' at /properties/id: lookahead is not
 * supported"). Compiling is bounded in time and memory whatever the input (hostile schemas:
 * deep nesting, huge enums, $ref cycles, remote $ref).
 *
 * Ownership: every _new/_from_* result is freed by its _free; a matcher borrows its grammar
 * and vocabulary, which must outlive it. */
#ifndef MEDLEY_ENGINE_GRAMMAR_H
#define MEDLEY_ENGINE_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct gr_grammar gr_grammar;
typedef struct gr_vocab gr_vocab;
typedef struct gr_matcher gr_matcher;

/* ---- compiling ---------------------------------------------------------------------- */

/* A JSON Schema (the text of the schema object). strict = 1: a keyword medley cannot enforce
 * is an error naming it; strict = 0: it is relaxed (not enforced) and listed in relaxed
 * (comma-separated "keyword at pointer" entries, truncated to relaxedsz; may be NULL). */
int gr_from_json_schema(const char *schema, size_t len, int strict, gr_grammar **out, char *relaxed,
                        size_t relaxedsz, md_err *e);
/* Markup around sentences of a schema: a chat template's tool calls (docs/structured.md
 * "tool_choice auto"). The output is prefix, then 1 to max_items items (item_open, a sentence
 * of the schema, item_close) separated by sep, then suffix. A space in any of these strings
 * stands for 0 to 8 of space, tab and newline; NULL is "". */
typedef struct {
    const char *prefix, *item_open, *item_close, *sep, *suffix;
    int max_items; /* <= 0: 1 */
} gr_frame;
/* A JSON Schema's sentences inside the markup of f (otherwise as gr_from_json_schema). */
int gr_from_json_schema_framed(const char *schema, size_t len, int strict, const gr_frame *f,
                               gr_grammar **out, char *relaxed, size_t relaxedsz, md_err *e);
/* Any JSON object (response_format json_object). */
int gr_from_json_object(gr_grammar **out, md_err *e);
/* A regular expression over the whole output (the supported subset: docs/structured.md). */
int gr_from_regex(const char *re, size_t len, gr_grammar **out, md_err *e);
/* Exactly one of n strings. */
int gr_from_choice(const char *const *choices, const size_t *lens, int n, gr_grammar **out,
                   md_err *e);
/* A grammar in medley's EBNF notation (docs/structured.md), start rule "root". */
int gr_from_ebnf(const char *text, size_t len, gr_grammar **out, md_err *e);
void gr_free(gr_grammar *g);

/* ---- vocabulary ----------------------------------------------------------------------- */

/* n_vocab tokens: tok[i] (len[i] bytes, the exact bytes the token decodes to; len 0 for a
 * token that never appears in output: control and special tokens) and the end tokens eos[]
 * (allowed exactly where the grammar may end). Copies what it needs. */
int gr_vocab_new(int n_vocab, const char *const *tok, const uint32_t *len, const int32_t *eos,
                 int n_eos, gr_vocab **out, md_err *e);
void gr_vocab_free(gr_vocab *v);
int gr_vocab_size(const gr_vocab *v);

/* Compute now every entry of g's token-mask cache for v (otherwise each is computed when a
 * matcher first needs it, under g's lock): for a caller that wants no first-use latency, and
 * for compile times comparable to engines that precompute. 0 or MD_ENOMEM. */
int gr_prepare(const gr_grammar *g, const gr_vocab *v, md_err *e);

/* ---- matching ------------------------------------------------------------------------- */

int gr_matcher_new(const gr_grammar *g, const gr_vocab *v, gr_matcher **out, md_err *e);
void gr_matcher_free(gr_matcher *m);
/* The tokens allowed next: bit t of mask[t / 32] (t % 32) set when token t keeps the output
 * inside the grammar (an end token where the grammar may end). mask holds (n_vocab + 31) / 32
 * words. Allocates only to compute a cache entry the first time any matcher of (g, v) needs
 * it (gr_prepare avoids that) or to grow scratch past its largest size so far. */
void gr_matcher_fill_mask(gr_matcher *m, uint32_t *mask);
/* Advance by one token: 0, or MD_EINVAL when the token is not allowed (the state is then
 * unchanged). An end token is accepted where the grammar may end. */
int gr_matcher_accept(gr_matcher *m, int32_t token);
/* Advance by raw bytes, whatever the tokens (validating a text, tests): 0, or MD_EINVAL when
 * the bytes leave the grammar (the state is then unchanged). */
int gr_matcher_accept_bytes(gr_matcher *m, const char *s, size_t n);
/* 1 when the output so far is a complete sentence of the grammar. */
int gr_matcher_can_end(const gr_matcher *m);
/* 1 when nothing but an end token can follow (the engine may stop the sequence). */
int gr_matcher_must_end(const gr_matcher *m);

#endif
