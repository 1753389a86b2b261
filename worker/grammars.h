/* grammars.h — a worker's compiled output constraints (docs/structured.md, "Request side"):
 * the grammar of each distinct constraint of its lines (queue/validate.h q_con_kind),
 * compiled once and kept in a bounded cache keyed by a hash of the constraint's kind,
 * strictness and canonical text. Refusals are cached too, so a hostile schema sent a
 * thousand times is compiled once.
 *
 * Ownership: entries are reference-counted. wk_grammars_prepare gives the request one
 * reference (dropped by wk_grammars_release); whoever keeps the grammar longer (a running
 * sequence) takes its own with wk_grammars_hold. The cache holds one while the entry is in
 * it; an evicted entry lives on until its last holder releases it. One thread uses a
 * cache. */
#ifndef MEDLEY_WORKER_GRAMMARS_H
#define MEDLEY_WORKER_GRAMMARS_H

#include "common/err.h"
#include "queue/validate.h"

typedef struct wk_grammars wk_grammars;

#define WK_GRAMMARS_DEFAULT 64 /* distinct constraints kept per worker */

int wk_grammars_new(int cap, wk_grammars **out, md_err *e);
/* Frees the cache's references; entries still held live on until released. */
void wk_grammars_free(wk_grammars *c);

/* Compile (or find) req's constraint: 0 with req->grammar, gentry, compile_ms,
 * compile_cached and relaxed set (nothing set for Q_CON_NONE); -1 with ve filled (400)
 * when the constraint cannot be enforced: the message names the keyword and its JSON
 * pointer, param the body field. */
int wk_grammars_prepare(wk_grammars *c, q_request *req, q_verr *ve);
/* Another reference to an entry (NULL: nothing); release drops one. */
void wk_grammars_hold(void *entry);
void wk_grammars_release(void *entry);

/* Counters for tests and metrics: compiles run, lookups answered from the cache, entries
 * in it now. */
typedef struct {
    long compiles, hits;
    int entries;
} wk_grammars_stats;
void wk_grammars_get_stats(const wk_grammars *c, wk_grammars_stats *st);

#endif
