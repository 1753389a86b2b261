/* queue.h — medley's Redis Streams protocol (docs/design.md §3, docs/protocol.md): key names,
 * batch creation and sealing, pipelined submission, the completion script that makes
 * results effectively-once, and batch reads for clients.
 *
 * Keys (prefix P, default "medley:"; model M; batch B):
 *   P q:{M}        stream, group `workers`; entry fields batch=B, line=<input JSON line>
 *   P q:{M}:<C>    the same for request-size class C when the plan defines classes
 *   P {B}:meta     hash: status model endpoint total completed failed created_at started_at
 *                  finished_at deadline priority input_file errors plan_version routing tenant
 *   P {B}:out      stream; entry fields custom_id, ok (1|0), line=<output JSON line>
 *   P {B}:done     set of custom_ids already answered
 *   P dlq:{M}      stream: entries that failed max_attempts times (batch, line, id, reason,
 *                  stream), from q:{M} and every class stream of M
 *   P plan         the scheduler's plan (queue/plan.h); P plan:version its version
 *   P worker:{W}   hash with a TTL: the worker heartbeat (schemas/worker-heartbeat)
 *   P replica:{R}:stage:<i>  string with a TTL: "tcp://HOST:PORT/DEVICE", where the stage
 *                  server of stage i (i >= 1) of plan replica R listens (docs/protocol.md §6)
 *   P batches      sorted set: batch ids by created_at (ms)
 *   P events       pub/sub channel: {"type":"batch","batch":B,"status":S}
 *
 * Nothing here allocates on behalf of the caller unless a function says so. */
#ifndef MEDLEY_QUEUE_QUEUE_H
#define MEDLEY_QUEUE_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/redis.h"

#define Q_GROUP "workers"
#define Q_KEY_MAX 512
#define Q_BATCH_ID_MAX 64

/* Key builders: write the key into out (Q_KEY_MAX). */
void q_key_queue(char *out, const char *prefix, const char *model);
/* P q:{M}:<class>: the stream of one request-size class of a plan (queue/plan.h). */
void q_key_class(char *out, const char *prefix, const char *model, const char *cls);
void q_key_meta(char *out, const char *prefix, const char *batch);
void q_key_out(char *out, const char *prefix, const char *batch);
void q_key_done(char *out, const char *prefix, const char *batch);
void q_key_ids(char *out, const char *prefix, const char *batch);  /* entry ids the batch has */
void q_key_sent(char *out, const char *prefix, const char *batch); /* custom_ids queued */
void q_key_dlq(char *out, const char *prefix, const char *model);
void q_key_worker(char *out, const char *prefix, const char *worker);
/* P replica:{R}:stage:<i>: the endpoint of stage i of a sharded plan replica R. */
void q_key_stage(char *out, const char *prefix, const char *replica, int stage);
void q_key_batches(char *out, const char *prefix);
void q_key_events(char *out, const char *prefix);

/* A valid key prefix: printable, no spaces or braces, at most 64 bytes. */
int q_prefix_check(const char *prefix, md_err *e);
/* A new batch id "batch_" + 24 hex chars. */
void q_new_batch_id(char *out, size_t outsz);
/* A valid batch id: 1..63 chars of [A-Za-z0-9_.-]. */
int q_batch_id_check(const char *id, md_err *e);

/* The completion script: SADD done custom_id; when new, XADD the output line to out, bump
 * completed (ok) or failed, stamp started_at, and when completed+failed reaches total of
 * a sealed batch set the terminal status (cancelled when cancelling, expired past the
 * deadline, else completed) with finished_at, publishing the change. Returns 1 when
 * written, 0 when the custom_id had been answered already (a redelivery). ARGV[7], the queue
 * entry id answered, goes into the output entry's `entry` field: readers drop lines whose
 * entry the batch never had (P {B}:ids; docs/protocol.md §5). */
extern const char q_complete_lua[];
/* Seal: set total, move validating -> in_progress and finish at once if every line is
 * already answered. */
extern const char q_create_lua[]; /* create a batch hash unless it exists */
extern const char q_seal_lua[];
/* Cancel: in_progress/validating -> cancelling (or cancelled when nothing is left). Returns
 * the resulting status, or an error reply for an unknown or finished batch. */
extern const char q_cancel_lua[];

/* Delete KEYS[1] only while it holds ARGV[1] (a stage key a worker still owns). */
extern const char q_stage_del_lua[];

/* SCRIPT LOAD a script; its SHA1 (for EVALSHA) goes to out. Redo after a reconnect:
 * a restarted Redis has forgotten its scripts. When the user may not load scripts (NOPERM,
 * the medley-worker role) out still gets the SHA1, computed here, and the result is
 * MD_ENOTFOUND with e saying so: EVALSHA works once a role that may load it did. */
int q_script_load(md_redis *r, const char *script, char out[41], md_err *e);
/* The SHA1 of a script as 40 hex digits, as SCRIPT LOAD returns it. */
void q_script_sha(const char *script, char out[41]);
/* SCRIPT LOAD every script a worker runs (q_complete_lua, q_stage_del_lua); q_batch_create
 * does it, so a worker that may only EVALSHA finds them. */
int q_scripts_load_all(md_redis *r, md_err *e);

/* Create the batch meta (status validating) and index it. window_s: completion window in
 * seconds (deadline = created_at + window). */
typedef struct {
    const char *prefix, *batch, *model, *endpoint, *input_file;
    const char *tenant; /* NULL: "default" */
    const char *input_sha; /* SHA-256 of the lines (hex), or NULL */
    long long window_s;
    int priority;
} q_batch_spec;
int q_batch_create(md_redis *r, const q_batch_spec *spec, md_err *e);

/* Pipelined submission: q_submitter buffers XADDs and sends them in chunks, reading the
 * replies per chunk. Lines are copied into the pipeline buffer by hiredis. */
typedef struct q_submitter q_submitter;
int q_submitter_open(md_redis *r, const char *prefix, const char *batch, const char *model,
                     q_submitter **out, md_err *e);
int q_submit_line(q_submitter *s, const char *line, size_t len, md_err *e);
/* The same into another stream (a class stream P q:{M}:<class>). */
int q_submit_line_to(q_submitter *s, const char *key, const char *line, size_t len, md_err *e);
/* The same (key NULL: the submitter's own stream), recording cid (the line's custom_id, or
 * NULL) in P {B}:sent once the XADD is confirmed: a retried submission of the batch skips the
 * custom_ids found there. */
int q_submit_line_cid(q_submitter *s, const char *key, const char *line, size_t len,
                      const char *cid, md_err *e);
/* Flush what is buffered; returns the number of lines queued so far in *n_total. */
int q_submitter_flush(q_submitter *s, long long *n_total, md_err *e);
void q_submitter_free(q_submitter *s);
/* Seal the batch with its total after the last line is queued. */
int q_batch_seal(md_redis *r, const char *prefix, const char *batch, long long total, md_err *e);
/* Mark a batch failed (submission aborted) with a reason. */
int q_batch_fail(md_redis *r, const char *prefix, const char *batch, const char *reason, md_err *e);
int q_batch_cancel(md_redis *r, const char *prefix, const char *batch, char *status_out,
                   size_t status_sz, md_err *e);

/* A batch's meta as read by clients. */
typedef struct {
    char id[Q_BATCH_ID_MAX];
    char status[24], model[128], endpoint[64], errors[256];
    char tenant[64]; /* "default" when the hash has none */
    long long total, completed, failed;
    long long created_at, started_at, finished_at, deadline; /* ms since epoch, 0 if unset */
    int priority;
    char input_sha[65]; /* SHA-256 of the submitted lines (hex), "" when not recorded */
} q_batch_info;
/* MD_ENOTFOUND when the batch does not exist. */
int q_batch_get(md_redis *r, const char *prefix, const char *batch, q_batch_info *out, md_err *e);
/* Status is terminal (completed, failed, cancelled, expired). */
int q_status_terminal(const char *status);

#endif
