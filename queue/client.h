/* client.h — the client side of the queue protocol, shared by `medley submit/status/results`,
 * `medley run` and `medley api`: submit JSONL lines (from a file or any reader, submit.c) as a
 * batch (pipelined), read a batch's output stream into files, describe a batch as JSON
 * (schemas/batch-meta.schema.json). */
#ifndef MEDLEY_QUEUE_CLIENT_H
#define MEDLEY_QUEUE_CLIENT_H

#include <jansson.h>
#include <stdio.h>

#include "common/redis.h"
#include "queue/queue.h"

typedef struct {
    const char *prefix; /* default "medley:" */
    const char *path; /* JSONL input file (q_submit_lines: the input's name in messages and meta) */
    const char *model;    /* queue model; NULL: the first line's body.model */
    const char *batch_id; /* NULL: a new random id */
    long long window_s;   /* completion window (deadline); 0 = none */
    int priority;
    const char *tenant;   /* the batch's tenant (docs/protocol.md §3); NULL: "default" */
    int no_replica_check; /* skip ROLE/WAIT (a user without them; a failover may lose it) */
} q_submit_opts;

/* A source of JSONL lines for q_submit_lines, read twice (a scan, then the queuing). next
 * returns 1 with the line in *line / *len (the reader's memory, valid until its next call; it
 * may end in a newline), 0 at the end, or a negative status with e filled; rewind goes back
 * to the first line (0, or a negative status). check, when set, sees each request line of the
 * scan with the scan's parse of it (NULL when it is not JSON; borrowed for the call): a
 * caller's own checks of the lines without a second parse (`medley api`'s, as OpenAI's). */
typedef struct {
    int (*next)(void *ctx, const char **line, size_t *len, md_err *e);
    int (*rewind)(void *ctx, md_err *e);
    void (*check)(void *ctx, const json_t *doc, const char *line, size_t len);
    void *ctx;
} q_line_reader;

/* Check the lines of rd (every custom_id unique; lines may otherwise be malformed: workers
 * answer those with error lines), create the batch, queue every non-blank line, seal the
 * batch, confirm its replication. The id goes to batch_out and the line count to *n_lines.
 * If queuing fails half-way the batch is marked failed. o->path names the input. */
int q_submit_lines(md_redis *r, const q_submit_opts *o, const q_line_reader *rd,
                   char batch_out[Q_BATCH_ID_MAX], long long *n_lines, md_err *e);

/* q_submit_lines over the lines of the file o->path. */
int q_submit_file(md_redis *r, const q_submit_opts *o, char batch_out[Q_BATCH_ID_MAX],
                  long long *n_lines, md_err *e);

/* Write the batch's output lines in completion order: successful ones to out, failed ones
 * to err (or to out too when err is NULL). Counts go to *n_out / *n_err. */
int q_results_write(md_redis *r, const char *prefix, const char *batch, FILE *out, FILE *err,
                    long long *n_out, long long *n_err, md_err *e);

/* Which answers to trust (trust.c): the lines of P {B}:out that answer one of the batch's
 * own queue entries, read page by page (docs/operations.md, "Threat model"). */
typedef struct q_trust q_trust;
/* One output entry's fields (pointers into the reply; entry NULL when it has none). */
typedef struct {
    const char *line, *cid, *entry;
    size_t llen;
    int ok; /* the `ok` field is "1" (or absent) */
} q_out_entry;
/* Parse one XRANGE entry of P {B}:out; 0 when it has no line. */
int q_out_entry_parse(const redisReply *en, q_out_entry *o);
/* Start reading batch B's output (EXISTS P {B}:ids). 0 or MD_EREDIS / MD_ENOMEM. */
int q_trust_new(md_redis *r, const char *prefix, const char *batch, q_trust **out, md_err *e);
/* For each entry i of an XRANGE page (in stream order): emit[i] = 1 when its line is to be
 * used now, 0 when it has no line or is kept aside until q_trust_finish. */
int q_trust_page(q_trust *t, md_redis *r, const redisReply *page, char *emit, md_err *e);
/* After the last page: emit(ctx, line) for each line kept aside that is still to be used
 * (an unrecorded entry of a killed submit); *forged counts the others (dropped). */
int q_trust_finish(q_trust *t, md_redis *r, int (*emit)(void *ctx, const q_out_entry *o), void *ctx,
                   long long *forged, md_err *e);
void q_trust_free(q_trust *t);

/* The batch meta as a JSON document (caller owns the reference). */
json_t *q_batch_json(const q_batch_info *b);

/* Parse a duration such as "90", "30s", "15m", "24h", "7d" into seconds (MD_EINVAL). */
int q_parse_duration(const char *s, long long *seconds, md_err *e);

#endif
