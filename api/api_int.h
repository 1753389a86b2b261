/* api_int.h — private to the api/ files: the server state, one request's state, the answer helpers
 * (OpenAI's error envelope), the per-thread Redis connection, the key table and the Redis
 * file store. Call order: server.c routes to files.c / batches.c / models.c / online.c, which
 * use store.c, keys.c, sse.c and online_wait.c (online.h); nothing below calls up. */
#ifndef MEDLEY_API_API_INT_H
#define MEDLEY_API_API_INT_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>

#include "api/api.h"
#include "common/redis.h"
#include "queue/client.h"

#define API_ID_MAX 80          /* file and batch ids: [A-Za-z0-9_-], shorter than this */
#define API_TENANT_MAX 64      /* tenant names: [A-Za-z0-9_.-] */
#define API_CHUNK (256 * 1024) /* bytes per stored chunk of a file body */

/* keys.c: the TENANT KEY table. Lookups are constant-time per entry. */
typedef struct api_keys api_keys;
int api_keys_load(const char *path, api_keys **out, md_err *e);
void api_keys_free(api_keys *k);
/* The tenant of the bearer token in an Authorization header, or NULL. */
const char *api_keys_tenant(const api_keys *k, const char *authorization);

/* conns.c: every open connection with its deadline (headers, then a body's rate), closed
 * past it; against slowloris, which libmicrohttpd's idle timeout does not stop. */
typedef struct api_conns api_conns;
int api_conns_new(unsigned header_timeout_s, api_conns **out);
void api_conns_free(api_conns *t); /* after the daemon has stopped */
/* MHD_OPTION_NOTIFY_CONNECTION's callback, cls the api_conns. */
void api_conns_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                      enum MHD_ConnectionNotificationCode code);
/* The request's headers are in (its body may follow) / n more body bytes / the body is in,
 * no deadline until the answer is done / the answer is done: wait for the next headers. */
void api_conns_request(struct MHD_Connection *mc);
void api_conns_body(struct MHD_Connection *mc, size_t n);
void api_conns_answering(struct MHD_Connection *mc);
void api_conns_done(struct MHD_Connection *mc);
/* Shut down the connections past their deadline; how many (*open: connections now). */
long long api_conns_reap(api_conns *t, long long *open);

typedef struct api_server {
    const api_config *cfg;
    const char *prefix;
    md_redis_url url;
    pthread_rwlock_t keys_lock;
    api_keys *keys;
    md_metric *m_requests, *m_seconds, *m_upload, *m_tenant;
    md_metric *m_forged; /* answer lines dropped from output files: entry never the batch's */
    md_metric *m_slow, *m_open; /* connections closed past their deadline; open connections */
    api_conns *conns;
    _Atomic long long body_mem; /* bytes held for request bodies now (cfg->max_body_memory) */
    struct api_waiter *waiter;  /* online requests' events (online_wait.c) */
} api_server;

/* An upload in progress (files.c). */
typedef struct api_upload api_upload;

/* One request: created when its headers arrive, freed when it completes. */
typedef struct {
    api_server *s;
    const char *route; /* a bounded label for metrics */
    char tenant[API_TENANT_MAX];
    uint64_t t0_ns;
    unsigned status;
    int answered; /* a response is queued (maybe before the body was read) */
    char *body;   /* a JSON body, up to cfg->max_json_bytes */
    size_t body_len, body_cap;
    int body_too_big;
    long long dropped; /* body bytes dropped after a failure: past a bound the connection closes */
    api_upload *up;
    long long held; /* of s->body_mem, this request's; given back when it completes */
    int busy;       /* its body would pass --max-body-memory: answered 503 */
    struct api_online *on; /* an online request (online.c), NULL for the other routes */
} api_req;

/* Hold n more bytes of request body for q against --max-body-memory; -1 (nothing held) when
 * that would pass it. */
int api_body_reserve(api_req *q, long long n);

/* The calling thread's Redis connection, dialled on first use and again after a failure;
 * NULL with e set when Redis cannot be reached. */
md_redis *api_redis(api_server *s, md_err *e);
/* Mark the calling thread's connection broken after an MD_EREDIS. */
void api_redis_failed(void);

/* Answers. doc is consumed. */
enum MHD_Result api_send_json(api_req *q, struct MHD_Connection *c, unsigned status, json_t *doc);
/* OpenAI's envelope {"error": {"message", "type", "param", "code"}}; param and code may be
 * NULL. type follows the status (invalid_request_error, authentication_error, ...). */
enum MHD_Result api_send_error(api_req *q, struct MHD_Connection *c, unsigned status,
                               const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* A Redis failure as a 503 (and the connection redialled next time). */
enum MHD_Result api_send_redis_error(api_req *q, struct MHD_Connection *c, const md_err *e);
/* 404 in OpenAI's words: "No such File object: ID". */
enum MHD_Result api_send_not_found(api_req *q, struct MHD_Connection *c, const char *what,
                                   const char *id);
/* An id usable in keys: 1..API_ID_MAX-1 chars of [A-Za-z0-9_-]. */
int api_id_ok(const char *id);
/* ?name= as an integer in [lo, hi] (def when absent); -1 when malformed. */
long long api_int_arg(struct MHD_Connection *c, const char *name, long long def, long long lo,
                      long long hi);

/* Key names (docs/api.md "Redis keys"); out holds Q_KEY_MAX. */
void api_key_file(char *out, const char *prefix, const char *file);
void api_key_file_data(char *out, const char *prefix, const char *file);
void api_key_tenant(char *out, const char *prefix, const char *tenant, const char *what);
void api_key_batch(char *out, const char *prefix, const char *batch);

/* files.c */
/* POST /v1/files: begin in the headers' call (tenant limits, the multipart parser; may
 * answer), then each piece of the body (-1 once the upload has failed: the rest of the body
 * is dropped and the error answered when it has all come, as libmicrohttpd answers only
 * then). */
enum MHD_Result api_files_upload_begin(api_req *q, struct MHD_Connection *c);
int api_files_upload(api_req *q, const char *data, size_t size);
/* Free an upload's state; its chunks are deleted unless it was stored. */
void api_files_upload_end(api_req *q);
enum MHD_Result api_files_route(api_req *q, struct MHD_Connection *c, const char *method,
                                const char *rest);
/* The file F of the tenant (uploaded, or a batch's output or error file) as its JSON object
 * (id, purpose, bytes, ...), or NULL (*rc MD_ENOTFOUND when it is not there, deleted or
 * another tenant's; MD_EREDIS). sized 0: an output file's bytes are not counted (left out). */
json_t *api_file_get(md_redis *r, const char *prefix, const char *tenant, const char *id, int sized,
                     int *rc, md_err *e);

/* store.c: a stored file body as the lines of a q_line_reader (chunks read one at a time). */
typedef struct api_file_reader api_file_reader;
api_file_reader *api_file_reader_new(md_redis *r, const char *data_key, long long max_line);
void api_file_reader_free(api_file_reader *fr);
int api_file_reader_next(void *ctx, const char **line, size_t *len, md_err *e);
int api_file_reader_rewind(void *ctx, md_err *e);
long long api_file_reader_lineno(const api_file_reader *fr);
/* A response streaming either a stored body (data_key) or the output lines of batch (ok: 1
 * output file, 0 error file) from Redis, a page at a time. */
struct MHD_Response *api_stream_data(api_server *s, const char *data_key);
struct MHD_Response *api_stream_output(api_server *s, const char *batch, int ok);

/* batches.c */
enum MHD_Result api_batches_route(api_req *q, struct MHD_Connection *c, const char *method,
                                  const char *rest);

/* outputs.c: a batch's output (ok 1) and error (ok 0) files, docs/api.md "Output and error
 * files". */
/* The batch of an output/error file id ("file-out-B" / "file-err-B"), ok set; 0 if it is not
 * one. */
int api_output_file_batch(const char *file_id, char batch[API_ID_MAX], int *ok);
/* The file object of batch B's file of kind ok for the tenant; NULL with *rc MD_ENOTFOUND
 * (not the tenant's, deleted, never queued) or MD_EREDIS. sized: count its bytes (read from
 * P api:{B} once the batch has ended and they were counted once; else the stream is read). */
json_t *api_output_object(md_redis *r, const char *prefix, const char *tenant, const char *batch,
                          int ok, int sized, int *rc, md_err *e);
/* Put the files of the tenant's batches that have ended since (P tenant:{T}:running) into its
 * file list (P tenant:{T}:files, scored by the batch's end), as OpenAI makes them at the
 * end. 0 or MD_EREDIS. */
int api_outputs_settle(md_redis *r, const char *prefix, const char *tenant, md_err *e);
/* Delete batch B's file of kind ok: MD_ENOTFOUND, MD_EINVAL while the batch has not ended
 * (e says so), MD_EREDIS. */
int api_output_delete(md_redis *r, const char *prefix, const char *tenant, const char *batch,
                      int ok, md_err *e);

/* online.c: POST /v1/chat/completions (chat 1) and /v1/completions (chat 0); the call of
 * a resumed request; the end of one (from the completed callback). */
enum MHD_Result api_online_route(api_req *q, struct MHD_Connection *c, const char *method,
                                 int chat);
enum MHD_Result api_online_resume(api_req *q, struct MHD_Connection *c);
void api_online_end(api_req *q);

/* models.c */
enum MHD_Result api_models(api_req *q, struct MHD_Connection *c);

/* The tenant's list of ids (a sorted set by creation ms) as OpenAI's page: limit, after,
 * order ("asc"/"desc"); each id goes through one(ctx, id) (NULL: skipped). */
json_t *api_list_page(md_redis *r, const char *zkey, long long limit, const char *after, int desc,
                      json_t *(*one)(void *ctx, const char *id), void *ctx, md_err *e);

#endif
