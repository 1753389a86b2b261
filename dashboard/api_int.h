/* api_int.h — what api.c and fleet.c share inside the dashboard module: the dash_api
 * struct (a Redis connection and the per-batch cost tallies) and small Redis/JSON helpers. */
#ifndef MEDLEY_DASHBOARD_API_INT_H
#define MEDLEY_DASHBOARD_API_INT_H

#include <jansson.h>

#include "common/redis.h"
#include "dashboard/api.h"

/* What has been summed of one batch's output stream P {B}:out, up to entry `last`. */
typedef struct {
    char id[256];
    char last[48];               /* the last entry id summed ("" before the first) */
    long long n;                 /* entries summed: one per answered line */
    double cost_usd;             /* sum of medley.cost_usd */
    long long completion_tokens; /* sum of response.body.usage.completion_tokens */
    /* embedding answers (body object "list"): usage.total_tokens and vectors (data) summed */
    long long embedding_tokens, embedding_inputs;
    json_t *failures; /* {error code: count} of the failed lines */
    int more;         /* the last look ran out of budget before the stream's end */
    unsigned seen;    /* the dash_api sweep that last listed the batch */
} tally;

struct dash_api {
    md_redis *r;  /* reads (the dashboard's read-only Redis user) */
    md_redis *op; /* the operator actions' writes; NULL: r (one user for both) */
    char prefix[80];
    int heartbeat_ms;
    tally *tally;
    int n_tally, cap_tally;
    unsigned sweep;
    int dlq_lines;       /* show the start of DLQ lines (prompts): off by default */
    json_t *cancel_from; /* unserved.c: {batch: {stream: XRANGE start}} of the cancels whose
                            queued lines are not all answered yet */
};

/* unserved.c: {model: true} for every model a live, running, not stale worker lists; NULL
 * on a Redis failure. */
json_t *dash_served_models(dash_api *a, md_err *e);
/* Answer the queued lines of batch B (streams P q:{M} and P q:{M}:<class>) with a
 * batch_cancelled error line, as a worker would, for a cancelled batch whose model nobody
 * serves: reading at most *budget queue entries (lowered by those read), on from where the
 * last call for B stopped; *answered counts the lines answered, *more is 1 when entries are
 * left to read. 0, MD_ENOMEM or MD_EREDIS. */
int dash_cancel_unserved(dash_api *a, const char *batch, const char *model, int *budget,
                         long long *answered, int *more, md_err *e);
/* Queue entries one cancel request, or one listing of the batches, reads at most. */
extern const int dash_cancel_budget;

/* The connection for an operator action's writes (op, dialled again when it was lost, else
 * r); NULL with e filled when op cannot be reached. */
md_redis *dash_op(dash_api *a, md_err *e);

/* A string or status reply as a JSON string (UTF-8 made valid); anything else: null. */
json_t *dash_reply_str(const redisReply *r);
/* 0 for a usable reply; MD_EREDIS for none (e already says why) or an error reply. */
int dash_reply_error(const redisReply *rep, const char *what, md_err *e);
/* Every key matching pattern (SCAN), as a JSON array of strings (raw bytes, not checked
 * as UTF-8: pass them through dash_json_str before output). NULL on a Redis failure. */
json_t *dash_scan(dash_api *a, const char *pattern, md_err *e);
/* Sort an array of strings by strcmp. */
void dash_sort_strings(json_t *arr);
/* The part of key between "<head>{" and a final "}", with its length in *len; NULL when key
 * has not that shape. */
const char *dash_braced(const char *key, const char *head, size_t *len);

#endif
