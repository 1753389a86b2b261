/* api.h — the dashboard's JSON documents, read from Redis as docs/protocol.md lays it out
 * (and docs/operations.md "Dashboard" describes for operators), and its two actions.
 *
 *   batches  P batches (newest first) and each P {B}:meta; cost, tokens (generated, and for
 *            embeddings answers the inputs and tokens embedded) and failures by error code
 *            summed from P {B}:out, read incrementally (only new entries each time)
 *   fleet    every P worker:{W} hash (schemas/worker-heartbeat in field json), with its age
 *            and whether it is stale (no heartbeat for 3 periods)
 *   plan     P plan (schemas/plan) and P plan:version, with each replica's measured tokens/s
 *            from the heartbeats of the workers serving it
 *   dlq      the newest entries of every P dlq:{M}, with the custom_id of each line
 *   actions  cancel a batch (the cancel script of docs/protocol.md §4, as `medley cancel`),
 *            drain a worker (field `drain` of P worker:{W}: it stops as on SIGTERM)
 *
 * Every string that comes from Redis goes into the documents as valid UTF-8 (invalid bytes
 * become U+FFFD), so a hostile id or line cannot break the JSON; escaping for HTML is the
 * page's job (it only ever sets textContent).
 *
 * A dash_api owns one Redis connection and is used from one thread. Documents returned are
 * new references the caller decrefs. On a Redis failure a function returns NULL (or a
 * negative status) with e filled; the caller may md_redis_reconnect(dash_api_redis(a)). */
#ifndef MEDLEY_DASHBOARD_API_H
#define MEDLEY_DASHBOARD_API_H

#include <jansson.h>
#include <stddef.h>

#include "common/err.h"
#include "common/redis.h"

typedef struct dash_api dash_api;

/* r is taken over (closed by dash_api_free). heartbeat_ms: the workers' heartbeat period,
 * for staleness. */
dash_api *dash_api_new(md_redis *r, const char *prefix, int heartbeat_ms);
void dash_api_free(dash_api *a);
md_redis *dash_api_redis(dash_api *a);
/* The connection, taken over, through which the actions (cancel, drain, undrain) write: the
 * medley-operator Redis user (docs/operations.md). Without one they write through r. */
void dash_api_set_operator(dash_api *a, md_redis *op);

/* {"now_ms", "indexed": ZCARD P batches, "batches": [...]}: the newest `limit` batches.
 * Each: id status model total completed failed done progress (0..1) created_at started_at
 * finished_at deadline priority errors, rate_per_s (answers per second since the first),
 * eta_s (null when unknown or finished), cost_usd, completion_tokens, usd_per_mtok (null
 * without tokens), failures ({error code: count}), cost_partial (true while P {B}:out has
 * entries not summed yet: at most `dash_api_scan_budget` entries are read per call, the
 * rest on the next calls), unserved (not finished and no live running worker lists its
 * model: it waits for one). */
json_t *dash_api_batches(dash_api *a, int limit, md_err *e);
/* {"now_ms", "heartbeat_ms", "workers": [...]}, sorted by id. Each: id (W), key, state,
 * drain (a drain was asked), last_seen, age_ms, stale, plan_version, replicas ([R...]),
 * heartbeat (the parsed document, or null with heartbeat_error). */
json_t *dash_api_fleet(dash_api *a, md_err *e);
/* {"now_ms", "version" (P plan:version or null), "plan" (the document or null), "error"
 * (why an existing plan is not shown), "measured": {R: {"tokens_per_s", "workers": [W...],
 * "usd_per_mtok"}}}. */
json_t *dash_api_plan(dash_api *a, md_err *e);
/* {"now_ms", "queues": [{"key", "model", "length", "entries": [...]}]}: the newest `limit`
 * entries of each P dlq:{M}. Each entry: entry_id time_ms id (queue entry) batch custom_id
 * reason worker stream line_bytes, and line_head (the first 240 bytes of the line: the
 * prompt) only when dash_api_show_dlq_lines is on. */
json_t *dash_api_dlq(dash_api *a, int limit, md_err *e);

/* Cancel batch B. 0 with the resulting status in status_out; MD_ENOTFOUND for no such
 * batch, MD_EINVAL for one already finished (e says which), MD_EREDIS on a Redis failure.
 * When no live worker serves its model, its queued lines are answered here (unserved.c), so
 * it ends `cancelled` instead of waiting forever in `cancelling`: up to dash_cancel_budget
 * queue entries read in this call, the rest by the next dash_api_batches calls. */
int dash_api_cancel(dash_api *a, const char *batch, char *status_out, size_t status_sz, md_err *e);
/* Ask worker W to drain: HSET P worker:{W} drain <now ms> state draining, only while the key
 * exists (MD_ENOTFOUND otherwise). The worker sees it at its next heartbeat. */
int dash_api_drain(dash_api *a, const char *worker, md_err *e);
/* Delete P drain:{W}: a worker held after a drain serves again (MD_ENOTFOUND: not drained). */
int dash_api_undrain(dash_api *a, const char *worker, md_err *e);

/* Whether /api/dlq shows the start of each line (the prompt): off unless --dlq-lines. */
void dash_api_show_dlq_lines(dash_api *a, int on);

/* Output-stream entries one dash_api_batches call reads at most, over all batches. */
extern const int dash_api_scan_budget;

/* s[0..n) as a JSON string, each invalid UTF-8 sequence replaced by U+FFFD (never NULL). */
json_t *dash_json_str(const char *s, size_t n);

#endif
