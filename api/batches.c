/* batches.c — the Batches API: POST /v1/batches (the input file validated line by line as
 * OpenAI validates it, then queued through q_submit_lines, the one implementation `medley
 * submit` uses), GET /v1/batches/{id} (the queue's batch meta in OpenAI's shape), GET
 * /v1/batches (per tenant), POST /v1/batches/{id}/cancel. The API's part of a batch (tenant,
 * input file, metadata, validation errors) lives in P api:{B}; the rest is the queue's. */
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"
#include "common/log.h"
#include "common/util.h"
#include "queue/queue.h"

#define ERRORS_MAX 100 /* validation errors reported per batch */

/* The value of field name in an HGETALL reply, or NULL. */
static const char *hget(const redisReply *h, const char *name) {
    for (size_t i = 0; h->type == REDIS_REPLY_ARRAY && i + 1 < h->elements; i += 2)
        if (!strcmp(h->element[i]->str, name))
            return h->element[i + 1]->str;
    return NULL;
}

static json_t *ts(long long ms) {
    return ms > 0 ? json_integer(ms / 1000) : json_null();
}

/* OpenAI's timestamps from the queue's meta: each terminal status has its *_at. */
static void set_times(json_t *o, const q_batch_info *b, long long cancelling_s) {
    const char *st = b->status;
    int term = q_status_terminal(st);
    json_object_set_new(o, "in_progress_at",
                        strcmp(st, "validating") ? ts(b->started_at ? b->started_at : b->created_at)
                                                 : json_null());
    json_object_set_new(o, "expires_at", ts(b->deadline));
    json_object_set_new(o, "finalizing_at", term ? ts(b->finished_at) : json_null());
    json_object_set_new(o, "completed_at",
                        !strcmp(st, "completed") ? ts(b->finished_at) : json_null());
    json_object_set_new(o, "failed_at", !strcmp(st, "failed") ? ts(b->finished_at) : json_null());
    json_object_set_new(o, "expired_at", !strcmp(st, "expired") ? ts(b->finished_at) : json_null());
    json_object_set_new(o, "cancelling_at",
                        cancelling_s ? json_integer(cancelling_s) : json_null());
    json_object_set_new(o, "cancelled_at",
                        !strcmp(st, "cancelled") ? ts(b->finished_at) : json_null());
}

/* The batch object of B for the tenant; NULL with *rc MD_ENOTFOUND (not there, another
 * tenant's) or MD_EREDIS. */
static json_t *batch_object(md_redis *r, const char *prefix, const char *tenant, const char *id,
                            int *rc, md_err *e) {
    char key[Q_KEY_MAX];
    api_key_batch(key, prefix, id);
    redisReply *h = md_redis_cmd(r, e, "HGETALL %s", key);
    if (!h) {
        *rc = MD_EREDIS;
        return NULL;
    }
    const char *t = hget(h, "tenant");
    if (!t || strcmp(t, tenant)) {
        freeReplyObject(h);
        *rc = MD_ENOTFOUND;
        return NULL;
    }
    const char *md = hget(h, "metadata"), *errs = hget(h, "errors");
    json_t *o =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:I}", "id", id, "object", "batch", "endpoint",
                  hget(h, "endpoint") ? hget(h, "endpoint") : "", "input_file_id",
                  hget(h, "input_file_id") ? hget(h, "input_file_id") : "", "completion_window",
                  hget(h, "completion_window") ? hget(h, "completion_window") : "24h", "created_at",
                  (json_int_t)atoll(hget(h, "created_at") ? hget(h, "created_at") : "0"));
    json_object_set_new(o, "metadata", md ? json_loads(md, 0, NULL) : json_null());
    json_object_set_new(o, "errors", errs ? json_loads(errs, 0, NULL) : json_null());
    long long cancelling = hget(h, "cancelling_at") ? atoll(hget(h, "cancelling_at")) : 0;
    long long failed_at = hget(h, "failed_at") ? atoll(hget(h, "failed_at")) : 0;
    freeReplyObject(h);
    q_batch_info b;
    int g = failed_at ? MD_ENOTFOUND : q_batch_get(r, prefix, id, &b, e);
    if (g == MD_EREDIS) {
        json_decref(o);
        *rc = MD_EREDIS;
        return NULL;
    }
    if (g) { /* refused by validation: the queue never saw it */
        memset(&b, 0, sizeof b);
        snprintf(b.status, sizeof b.status, "failed");
        b.finished_at = failed_at * 1000;
    }
    json_object_set_new(o, "status", json_string(b.status));
    set_times(o, &b, cancelling);
    int term = q_status_terminal(b.status);
    char fid[API_ID_MAX + 16];
    snprintf(fid, sizeof fid, "file-out-%s", id);
    json_object_set_new(o, "output_file_id", term && b.completed ? json_string(fid) : json_null());
    snprintf(fid, sizeof fid, "file-err-%s", id);
    json_object_set_new(o, "error_file_id", term && b.failed ? json_string(fid) : json_null());
    json_object_set_new(o, "request_counts",
                        json_pack("{s:I, s:I, s:I}", "total", (json_int_t)b.total, "completed",
                                  (json_int_t)b.completed, "failed", (json_int_t)b.failed));
    *rc = 0;
    return o;
}

/* One validation error as OpenAI reports it (errors.data[]). */
static void add_error(json_t *errs, const char *code, const char *msg, const char *param,
                      long long line) {
    if (json_array_size(errs) < ERRORS_MAX)
        json_array_append_new(errs, json_pack("{s:s, s:s, s:s?, s:o}", "code", code, "message", msg,
                                              "param", param, "line",
                                              line > 0 ? json_integer(line) : json_null()));
}

/* One input line (j: its parse, NULL when it is not JSON) against the batch's endpoint and
 * model (the first line's). */
static void check_line(const json_t *j, const char *line, size_t len, long long lineno,
                       const char *endpoint, char *model, size_t msz, json_t *errs) {
    char msg[300];
    if (!json_is_object(j)) {
        json_error_t je = {.text = "another JSON value"};
        if (!j) /* parsed again for jansson's words (rare: a broken line) */
            json_decref(json_loadb(line, len, 0, &je));
        snprintf(msg, sizeof msg, "line %lld is not a JSON object (%s)", lineno, je.text);
        add_error(errs, "invalid_json_line", msg, NULL, lineno);
    } else if (!json_is_string(json_object_get(j, "custom_id"))) {
        add_error(errs, "missing_required_parameter", "the line has no string custom_id",
                  "custom_id", lineno);
    } else if (!json_is_string(json_object_get(j, "method")) ||
               strcmp(json_string_value(json_object_get(j, "method")), "POST")) {
        add_error(errs, "invalid_request", "method must be \"POST\"", "method", lineno);
    } else if (!json_is_string(json_object_get(j, "url")) ||
               strcmp(json_string_value(json_object_get(j, "url")), endpoint)) {
        snprintf(msg, sizeof msg, "url must be the batch's endpoint \"%s\"", endpoint);
        add_error(errs, "mismatched_endpoint", msg, "url", lineno);
    } else if (!json_is_object(json_object_get(j, "body")) ||
               !json_is_string(json_object_get(json_object_get(j, "body"), "model"))) {
        add_error(errs, "missing_required_parameter", "the line has no body with a string model",
                  "body.model", lineno);
    } else {
        const char *m = json_string_value(json_object_get(json_object_get(j, "body"), "model"));
        if (!model[0])
            snprintf(model, msz, "%s", m);
        else if (strcmp(model, m)) {
            snprintf(msg, sizeof msg,
                     "every line of a batch must name one model: '%.100s', then "
                     "'%.100s'",
                     model, m);
            add_error(errs, "mismatched_model", msg, "body.model", lineno);
        }
    }
}

/* The input file's lines for q_submit_lines, checked as OpenAI checks them on the parse of its
 * first pass (the scan; q_line_reader.check): one pass and one parse fewer. A file with errors
 * ends that pass with MD_EINVAL, so q_submit_lines stops before it creates anything. */
typedef struct {
    api_file_reader *fr;
    int pass;
    const char *endpoint;
    char model[128];
    json_t *errs;
} checked_reader;

static void checked_line(void *ctx, const json_t *doc, const char *line, size_t len) {
    checked_reader *cr = ctx;
    if (cr->pass == 0)
        check_line(doc, line, len, api_file_reader_lineno(cr->fr), cr->endpoint, cr->model,
                   sizeof cr->model, cr->errs);
}

static int checked_next(void *ctx, const char **line, size_t *len, md_err *e) {
    checked_reader *cr = ctx;
    int rc = api_file_reader_next(cr->fr, line, len, e);
    if (cr->pass > 0 || rc > 0)
        return rc;
    if (rc == MD_EINVAL) /* a line over the limit */
        add_error(cr->errs, "line_too_long", e->msg, NULL, api_file_reader_lineno(cr->fr) + 1);
    else if (rc < 0 || !json_array_size(cr->errs))
        return rc;
    return md_errf(e, MD_EINVAL, "the input file has %zu error(s)", json_array_size(cr->errs));
}

static int checked_rewind(void *ctx, md_err *e) {
    checked_reader *cr = ctx;
    cr->pass++;
    return api_file_reader_rewind(cr->fr, e);
}

/* metadata: at most 16 string pairs, keys up to 64 chars, values up to 512 (OpenAI's). */
static const char *metadata_bad(json_t *md) {
    if (!md || json_is_null(md))
        return NULL;
    if (!json_is_object(md))
        return "metadata must be an object of strings";
    if (json_object_size(md) > 16)
        return "metadata has more than 16 keys";
    const char *k;
    json_t *v;
    json_object_foreach(md, k, v) {
        if (strlen(k) > 64)
            return "a metadata key is longer than 64 characters";
        if (!json_is_string(v))
            return "metadata values must be strings";
        if (json_string_length(v) > 512)
            return "a metadata value is longer than 512 characters";
    }
    return NULL;
}

typedef struct {
    const char *input, *endpoint, *window;
    long long window_s;
    json_t *metadata;
} create_args;

/* The body of POST /v1/batches; 0, or the HTTP status with *param and msg set. */
static unsigned check_create(json_t *j, create_args *a, const char **param, char *msg, size_t msz) {
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        if (strcmp(k, "input_file_id") && strcmp(k, "endpoint") && strcmp(k, "completion_window") &&
            strcmp(k, "metadata")) {
            *param = k;
            snprintf(msg, msz, "Unrecognized request argument supplied: %.64s", k);
            return MHD_HTTP_BAD_REQUEST;
        }
    }
    a->input = json_string_value(json_object_get(j, "input_file_id"));
    a->endpoint = json_string_value(json_object_get(j, "endpoint"));
    a->window = json_string_value(json_object_get(j, "completion_window"));
    a->metadata = json_object_get(j, "metadata");
    const char *bad = metadata_bad(a->metadata);
    md_err e = {0};
    if (!a->input || !a->endpoint || !a->window) {
        *param = !a->input ? "input_file_id" : !a->endpoint ? "endpoint" : "completion_window";
        snprintf(msg, msz, "'%s' is a required property (a string)", *param);
    } else if (!api_id_ok(a->input)) {
        *param = "input_file_id";
        snprintf(msg, msz, "input_file_id is not a file id");
    } else if (strcmp(a->endpoint, "/v1/chat/completions") &&
               strcmp(a->endpoint, "/v1/completions")) {
        *param = "endpoint";
        snprintf(msg, msz, "endpoint must be \"/v1/chat/completions\" or \"/v1/completions\"");
    } else if (q_parse_duration(a->window, &a->window_s, &e) || a->window_s <= 0 ||
               a->window_s > 86400) {
        *param = "completion_window";
        snprintf(msg, msz,
                 "completion_window must be \"24h\" or a shorter duration (90s, 15m, 2h)");
    } else if (bad) {
        *param = "metadata";
        snprintf(msg, msz, "%s", bad);
    } else {
        return 0;
    }
    return MHD_HTTP_BAD_REQUEST;
}

/* How many of the tenant's newest batches are not finished (one pipeline). */
static int in_flight(md_redis *r, const char *prefix, const char *tenant, long long *n, md_err *e) {
    char key[Q_KEY_MAX], meta[Q_KEY_MAX];
    api_key_tenant(key, prefix, tenant, "batches");
    redisReply *ids = md_redis_cmd(r, e, "ZREVRANGE %s 0 999", key);
    if (!ids)
        return MD_EREDIS;
    size_t k = ids->type == REDIS_REPLY_ARRAY ? ids->elements : 0;
    for (size_t i = 0; i < k; i++) {
        q_key_meta(meta, prefix, ids->element[i]->str);
        redisAppendCommand(md_redis_ctx(r), "HGET %s status", meta);
    }
    freeReplyObject(ids);
    *n = 0;
    int rc = 0;
    for (size_t i = 0; i < k; i++) {
        redisReply *st = md_redis_get_reply(r, e);
        if (!st) {
            rc = MD_EREDIS;
            break;
        }
        *n += st->type == REDIS_REPLY_STRING && !q_status_terminal(st->str);
        freeReplyObject(st);
    }
    return rc;
}

/* Record the API's part of the batch. */
static int record_batch(md_redis *r, api_req *q, const char *id, const create_args *a, md_err *e) {
    char key[Q_KEY_MAX];
    api_key_batch(key, q->s->prefix, id);
    char *md = a->metadata && !json_is_null(a->metadata) ? json_dumps(a->metadata, JSON_COMPACT)
                                                         : strdup("null");
    long long now = md_wall_ms();
    redisReply *rep =
        md ? md_redis_cmd(r, e,
                          "HSET %s tenant %s input_file_id %s endpoint %s "
                          "completion_window %s metadata %s created_at %lld",
                          key, q->tenant, a->input, a->endpoint, a->window, md, now / 1000)
           : NULL;
    free(md);
    if (!rep)
        return MD_EREDIS;
    freeReplyObject(rep);
    return 0;
}

/* Index the batch for the tenant once it is queued (or refused): an API process killed while
 * queuing leaves no batch in the tenant's lists (the client had no answer and asks again).
 * In the same MULTI it joins P tenant:{T}:running, whose batches have their output and error
 * files listed once they end (api_outputs_settle). */
static int index_batch(md_redis *r, api_req *q, const char *id, md_err *e) {
    char idx[Q_KEY_MAX], running[Q_KEY_MAX];
    api_key_tenant(idx, q->s->prefix, q->tenant, "batches");
    api_key_tenant(running, q->s->prefix, q->tenant, "running");
    redisContext *ctx = md_redis_ctx(r);
    redisAppendCommand(ctx, "MULTI");
    redisAppendCommand(ctx, "ZADD %s %lld %s", idx, (long long)md_wall_ms(), id);
    redisAppendCommand(ctx, "SADD %s %s", running, id);
    redisAppendCommand(ctx, "EXEC");
    for (int i = 0; i < 4; i++) {
        redisReply *rep = md_redis_get_reply(r, e);
        if (!rep)
            return MD_EREDIS;
        int bad = rep->type == REDIS_REPLY_ERROR || (i == 3 && rep->type != REDIS_REPLY_ARRAY);
        freeReplyObject(rep);
        if (bad)
            return md_errf(e, MD_EREDIS, "indexing batch %s: Redis refused the transaction", id);
    }
    return 0;
}

static int fail_batch(md_redis *r, const char *prefix, const char *id, json_t *errs, md_err *e) {
    char key[Q_KEY_MAX];
    api_key_batch(key, prefix, id);
    json_t *doc = json_pack("{s:s, s:O}", "object", "list", "data", errs);
    char *s = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    redisReply *rep = s ? md_redis_cmd(r, e, "HSET %s errors %s failed_at %lld", key, s,
                                       (long long)(md_wall_ms() / 1000))
                        : NULL;
    free(s);
    if (!rep)
        return MD_EREDIS;
    freeReplyObject(rep);
    return 0;
}

/* Queue the input file through q_submit_lines, checked on its first pass (checked_reader).
 * Lines are read on a connection of their own: the submitter pipelines its XADDs on r.
 * Returns MD_EREDIS on a Redis failure; a refused file marks the batch failed and returns 0. */
static int queue_file(api_req *q, md_redis *r, const char *id, const create_args *a, md_err *e) {
    md_redis *rd_conn = NULL;
    char data[Q_KEY_MAX];
    api_key_file_data(data, q->s->prefix, a->input);
    int rc = md_redis_open(&q->s->url, &rd_conn, e);
    if (rc)
        return MD_EREDIS;
    api_file_reader *fr = api_file_reader_new(rd_conn, data, q->s->cfg->max_line_bytes);
    json_t *errs = json_array();
    if (!fr) {
        rc = md_errf(e, MD_ENOMEM, "out of memory");
    } else {
        q_submit_opts o = {.prefix = q->s->prefix,
                           .path = a->input,
                           .batch_id = id,
                           .window_s = a->window_s,
                           .tenant = q->tenant};
        checked_reader cr = {.fr = fr, .endpoint = a->endpoint, .errs = errs};
        q_line_reader lr = {
            .next = checked_next, .rewind = checked_rewind, .check = checked_line, .ctx = &cr};
        char out[Q_BATCH_ID_MAX];
        long long n = 0;
        rc = q_submit_lines(r, &o, &lr, out, &n, e);
        if (rc == MD_EINVAL) {
            /* errs has the lines' errors; else a duplicate custom_id, a bad model name */
            if (!json_array_size(errs))
                add_error(errs, "invalid_file", e->msg, NULL, 0);
            rc = 0;
        } else if (!rc) {
            MD_INFO("api", "tenant %s: batch %s of %s queued (%lld lines)", q->tenant, id, a->input,
                    n);
        }
    }
    if (!rc && json_array_size(errs))
        rc = fail_batch(r, q->s->prefix, id, errs, e);
    json_decref(errs);
    api_file_reader_free(fr);
    md_redis_close(rd_conn);
    return rc;
}

static enum MHD_Result create_batch(api_req *q, struct MHD_Connection *c, md_redis *r) {
    json_error_t je;
    json_t *j = q->body ? json_loadb(q->body, q->body_len, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!json_is_object(j)) {
        json_decref(j);
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, NULL, "invalid_json",
                              "the body must be a JSON object%s%s", q->body ? ": " : "",
                              q->body ? je.text : "");
    }
    create_args a = {0};
    const char *param = NULL;
    char msg[300];
    unsigned st = check_create(j, &a, &param, msg, sizeof msg);
    if (st) {
        enum MHD_Result res = api_send_error(q, c, st, param, "invalid_value", "%s", msg);
        json_decref(j);
        return res;
    }
    md_err e = {0};
    int rc;
    long long busy = 0;
    json_t *f = api_file_get(r, q->s->prefix, q->tenant, a.input, 0, &rc, &e);
    const char *purpose = json_string_value(json_object_get(f, "purpose"));
    enum MHD_Result res;
    char id[Q_BATCH_ID_MAX];
    if (!f && rc == MD_ENOTFOUND)
        res = api_send_not_found(q, c, "File", a.input);
    else if (!f)
        res = api_send_redis_error(q, c, &e);
    else if (!purpose || strcmp(purpose, "batch"))
        res = api_send_error(q, c, MHD_HTTP_BAD_REQUEST, "input_file_id", "invalid_value",
                             "file %s has purpose '%s'; a batch's input has purpose \"batch\"",
                             a.input, purpose ? purpose : "");
    else if (q->s->cfg->tenant_max_batches > 0 &&
             ((rc = in_flight(r, q->s->prefix, q->tenant, &busy, &e)) ||
              busy >= q->s->cfg->tenant_max_batches))
        res =
            rc ? api_send_redis_error(q, c, &e)
               : api_send_error(q, c, MHD_HTTP_TOO_MANY_REQUESTS, NULL, "quota_exceeded",
                                "tenant %s has %lld batches in flight, its limit", q->tenant, busy);
    else if (q_new_batch_id(id, sizeof id), (rc = record_batch(r, q, id, &a, &e)) ||
                                                (rc = queue_file(q, r, id, &a, &e)) ||
                                                (rc = index_batch(r, q, id, &e)))
        res = api_send_redis_error(q, c, &e);
    else {
        json_t *o = batch_object(r, q->s->prefix, q->tenant, id, &rc, &e);
        res = o ? api_send_json(q, c, MHD_HTTP_OK, o) : api_send_redis_error(q, c, &e);
    }
    json_decref(f);
    json_decref(j);
    return res;
}

typedef struct {
    md_redis *r;
    const char *prefix, *tenant;
    md_err *e;
} list_ctx;

static json_t *list_one(void *cls, const char *id) {
    list_ctx *l = cls;
    int rc;
    return batch_object(l->r, l->prefix, l->tenant, id, &rc, l->e);
}

static enum MHD_Result list_batches(api_req *q, struct MHD_Connection *c, md_redis *r) {
    long long limit = api_int_arg(c, "limit", 20, 1, 100);
    const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
    if (limit < 0)
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, "limit", "invalid_value",
                              "limit must be an integer in 1..100");
    if (after && !api_id_ok(after))
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, "after", "invalid_value",
                              "after must be a batch id");
    char key[Q_KEY_MAX];
    md_err e = {0};
    api_key_tenant(key, q->s->prefix, q->tenant, "batches");
    list_ctx l = {r, q->s->prefix, q->tenant, &e};
    json_t *page = api_list_page(r, key, limit, after, 1, list_one, &l, &e);
    return page ? api_send_json(q, c, MHD_HTTP_OK, page) : api_send_redis_error(q, c, &e);
}

static enum MHD_Result cancel_batch(api_req *q, struct MHD_Connection *c, md_redis *r,
                                    const char *id, json_t *o) {
    const char *st = json_string_value(json_object_get(o, "status"));
    if (q_status_terminal(st)) {
        enum MHD_Result res = api_send_error(q, c, MHD_HTTP_CONFLICT, NULL, "invalid_state",
                                             "Cannot cancel a batch with status '%s'.", st);
        json_decref(o);
        return res;
    }
    json_decref(o);
    md_err e = {0};
    char status[32], key[Q_KEY_MAX];
    int rc = q_batch_cancel(r, q->s->prefix, id, status, sizeof status, &e);
    if (rc == MD_EREDIS)
        return api_send_redis_error(q, c, &e);
    api_key_batch(key, q->s->prefix, id);
    redisReply *rep =
        md_redis_cmd(r, &e, "HSETNX %s cancelling_at %lld", key, (long long)(md_wall_ms() / 1000));
    if (!rep)
        return api_send_redis_error(q, c, &e);
    freeReplyObject(rep);
    o = batch_object(r, q->s->prefix, q->tenant, id, &rc, &e);
    return o ? api_send_json(q, c, MHD_HTTP_OK, o) : api_send_redis_error(q, c, &e);
}

enum MHD_Result api_batches_route(api_req *q, struct MHD_Connection *c, const char *method,
                                  const char *rest) {
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    md_err e = {0};
    md_redis *r = api_redis(q->s, &e);
    if (!r)
        return api_send_redis_error(q, c, &e);
    if (!*rest && post)
        return create_batch(q, c, r);
    if (!*rest && get)
        return list_batches(q, c, r);
    if (!*rest)
        return api_send_error(q, c, MHD_HTTP_METHOD_NOT_ALLOWED, NULL, NULL,
                              "/v1/batches takes GET and POST");
    char id[API_ID_MAX + 16];
    const char *slash = strchr(rest + 1, '/');
    size_t n = slash ? (size_t)(slash - rest - 1) : strlen(rest + 1);
    snprintf(id, sizeof id, "%.*s", n < sizeof id ? (int)n : (int)sizeof id - 1, rest + 1);
    int cancel = slash && !strcmp(slash, "/cancel");
    if ((slash && !cancel) || !api_id_ok(id))
        return api_send_not_found(q, c, "Batch", rest + 1);
    int rc;
    json_t *o = batch_object(r, q->s->prefix, q->tenant, id, &rc, &e);
    if (!o)
        return rc == MD_ENOTFOUND ? api_send_not_found(q, c, "Batch", id)
                                  : api_send_redis_error(q, c, &e);
    if (cancel && post)
        return cancel_batch(q, c, r, id, o);
    if (!cancel && get)
        return api_send_json(q, c, MHD_HTTP_OK, o);
    json_decref(o);
    return api_send_error(q, c, MHD_HTTP_METHOD_NOT_ALLOWED, NULL, NULL,
                          "method %s is not served here", method);
}
