/* files.c — the Files API: POST /v1/files (multipart/form-data streamed into Redis a chunk at a
 * time through libmicrohttpd's post processor, counted and bounded as it arrives), GET
 * /v1/files (per tenant, purpose / limit / after / order), GET /v1/files/{id},
 * GET /v1/files/{id}/content (streamed), DELETE /v1/files/{id}. A batch's output and error
 * files (file-out-B, file-err-B) are routed here too: their objects, listing and deletion are
 * outputs.c's, their content store.c's output stream. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"
#include "common/log.h"
#include "common/util.h"
#include "queue/queue.h"

/* An unfinished upload's chunks expire if the API process dies before it is complete. */
#define UPLOAD_TTL_S 3600

struct api_upload {
    struct MHD_PostProcessor *pp;
    char id[API_ID_MAX], data_key[Q_KEY_MAX];
    char purpose[32], filename[256], unknown[64];
    char *buf; /* the chunk being filled (API_CHUNK) */
    size_t len;
    long long bytes, lines, chunks;
    int line_has_text, saw_file, committed;
    unsigned err_status; /* an error found while streaming: answered at once */
    char err_msg[300];
    const char *err_param, *err_code;
    md_err e;
};

static int upload_fail(api_upload *u, unsigned status, const char *param, const char *code,
                       const char *msg) {
    if (!u->err_status) {
        u->err_status = status;
        u->err_param = param;
        u->err_code = code;
        snprintf(u->err_msg, sizeof u->err_msg, "%s", msg);
    }
    return MHD_NO;
}

/* Append the chunk to the file's list and (re)arm its expiry, in one transaction: a process
 * killed at any point leaves either nothing or chunks that expire. */
static int flush_chunk(api_req *q, api_upload *u) {
    if (!u->len)
        return 0;
    md_redis *r = api_redis(q->s, &u->e);
    if (!r)
        return -1;
    redisContext *ctx = md_redis_ctx(r);
    redisAppendCommand(ctx, "MULTI");
    redisAppendCommand(ctx, "RPUSH %s %b", u->data_key, u->buf, u->len);
    redisAppendCommand(ctx, "EXPIRE %s %d", u->data_key, UPLOAD_TTL_S);
    redisAppendCommand(ctx, "EXEC");
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        redisReply *rep = md_redis_get_reply(r, &u->e);
        if (!rep) {
            api_redis_failed();
            return -1;
        }
        bad |= rep->type == REDIS_REPLY_ERROR || (i == 3 && rep->type != REDIS_REPLY_ARRAY);
        freeReplyObject(rep);
    }
    if (bad) {
        md_errf(&u->e, MD_EREDIS, "storing a chunk of %s: Redis refused the transaction", u->id);
        return -1;
    }
    u->chunks++;
    u->len = 0;
    return 0;
}

/* File bytes: counted (bytes, non-blank lines against the limits), buffered, flushed. */
static int file_bytes(api_req *q, api_upload *u, const char *data, size_t size) {
    const api_config *cfg = q->s->cfg;
    u->bytes += (long long)size;
    if (u->bytes > cfg->max_file_bytes) {
        char m[160];
        snprintf(m, sizeof m, "the file is over %lld bytes, the limit of this server",
                 cfg->max_file_bytes);
        return upload_fail(u, MHD_HTTP_CONTENT_TOO_LARGE, "file", "file_too_large", m);
    }
    for (size_t i = 0; i < size; i++) {
        if (data[i] == '\n') {
            u->lines += u->line_has_text;
            u->line_has_text = 0;
        } else if (!isspace((unsigned char)data[i])) {
            u->line_has_text = 1;
        }
    }
    if (u->lines > cfg->max_file_lines) {
        char m[160];
        snprintf(m, sizeof m, "the file has more than %lld requests, the limit per batch file",
                 cfg->max_file_lines);
        return upload_fail(u, MHD_HTTP_BAD_REQUEST, "file", "too_many_requests_in_file", m);
    }
    while (size) {
        size_t n = API_CHUNK - u->len < size ? API_CHUNK - u->len : size;
        memcpy(u->buf + u->len, data, n);
        u->len += n;
        data += n;
        size -= n;
        if (u->len == API_CHUNK && flush_chunk(q, u))
            return upload_fail(u, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "redis_unavailable",
                               u->e.msg);
    }
    return MHD_YES;
}

static enum MHD_Result on_part(void *cls, enum MHD_ValueKind kind, const char *key,
                               const char *filename, const char *content_type,
                               const char *transfer_encoding, const char *data, uint64_t off,
                               size_t size) {
    (void)kind, (void)content_type, (void)transfer_encoding, (void)off;
    api_req *q = cls;
    api_upload *u = q->up;
    if (!key) /* libmicrohttpd passes a part without a name so */
        return upload_fail(u, MHD_HTTP_BAD_REQUEST, NULL, "invalid_multipart",
                           "a multipart part has no name (Content-Disposition: form-data; "
                           "name=...)");
    if (!strcmp(key, "file")) {
        if (!u->saw_file && filename) {
            /* the name goes into JSON answers: printable ASCII only */
            snprintf(u->filename, sizeof u->filename, "%s", filename);
            for (char *p = u->filename; *p; p++)
                if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7E)
                    *p = '_';
        }
        u->saw_file = 1;
        return file_bytes(q, u, data, size) == MHD_YES ? MHD_YES : MHD_NO;
    }
    if (!strcmp(key, "purpose")) {
        size_t have = strlen(u->purpose);
        if (have + size >= sizeof u->purpose)
            return upload_fail(u, MHD_HTTP_BAD_REQUEST, "purpose", "invalid_value",
                               "purpose is too long; this server takes purpose \"batch\"");
        memcpy(u->purpose + have, data, size);
        u->purpose[have + size] = 0;
        return MHD_YES;
    }
    if (!u->unknown[0])
        snprintf(u->unknown, sizeof u->unknown, "%s", key);
    return MHD_YES;
}

enum MHD_Result api_files_upload_begin(api_req *q, struct MHD_Connection *c) {
    const api_config *cfg = q->s->cfg;
    md_err e = {0};
    md_redis *r = api_redis(q->s, &e);
    if (!r)
        return api_send_redis_error(q, c, &e);
    char usage[Q_KEY_MAX];
    api_key_tenant(usage, q->s->prefix, q->tenant, "usage");
    /* uploaded files only: output files are the batches' (and not in these counts) */
    redisReply *h = md_redis_cmd(r, &e, "HMGET %s files bytes", usage);
    if (!h)
        return api_send_redis_error(q, c, &e);
    long long nfiles = 0, bytes = 0;
    if (h->type == REDIS_REPLY_ARRAY && h->elements == 2) {
        nfiles = h->element[0]->type == REDIS_REPLY_STRING ? atoll(h->element[0]->str) : 0;
        bytes = h->element[1]->type == REDIS_REPLY_STRING ? atoll(h->element[1]->str) : 0;
    }
    freeReplyObject(h);
    if (cfg->tenant_max_files > 0 && nfiles >= cfg->tenant_max_files)
        return api_send_error(q, c, MHD_HTTP_TOO_MANY_REQUESTS, NULL, "quota_exceeded",
                              "tenant %s holds %lld files, its limit; delete some first", q->tenant,
                              nfiles);
    if (cfg->tenant_max_bytes > 0 && bytes >= cfg->tenant_max_bytes)
        return api_send_error(q, c, MHD_HTTP_TOO_MANY_REQUESTS, NULL, "quota_exceeded",
                              "tenant %s stores %lld bytes, its limit; delete files first",
                              q->tenant, bytes);
    /* the chunk buffer and the post processor's */
    if (api_body_reserve(q, API_CHUNK + 64 * 1024))
        return api_send_error(q, c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "server_busy",
                              "uploads being received hold --max-body-memory (%lld bytes) now; "
                              "try again",
                              cfg->max_body_memory);
    api_upload *u = calloc(1, sizeof *u);
    if (u)
        u->buf = malloc(API_CHUNK);
    q->up = u;
    if (!u || !u->buf)
        return api_send_error(q, c, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, NULL, "out of memory");
    char hex[32];
    md_random_hex(hex, sizeof hex, 24);
    snprintf(u->id, sizeof u->id, "file-%s", hex);
    api_key_file_data(u->data_key, q->s->prefix, u->id);
    u->pp = MHD_create_post_processor(c, 64 * 1024, on_part, q);
    if (!u->pp)
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, NULL, "invalid_request",
                              "expected a multipart/form-data body with fields file and purpose");
    return MHD_YES;
}

int api_files_upload(api_req *q, const char *data, size_t size) {
    api_upload *u = q->up;
    if (!u || u->err_status)
        return -1;
    if (MHD_post_process(u->pp, data, size) != MHD_YES && !u->err_status)
        upload_fail(u, MHD_HTTP_BAD_REQUEST, NULL, "invalid_multipart",
                    "the multipart/form-data body is malformed");
    return u->err_status ? -1 : 0;
}

void api_files_upload_end(api_req *q) {
    api_upload *u = q->up;
    if (!u)
        return;
    if (u->pp)
        MHD_destroy_post_processor(u->pp);
    if (!u->committed && u->chunks) {
        md_err e = {0};
        md_redis *r = api_redis(q->s, &e);
        redisReply *rep = r ? md_redis_cmd(r, &e, "UNLINK %s", u->data_key) : NULL;
        if (rep)
            freeReplyObject(rep);
    }
    free(u->buf);
    free(u);
    q->up = NULL;
}

static json_t *file_object(const char *id, long long bytes, long long created, const char *name,
                           const char *purpose) {
    return json_pack("{s:s, s:s, s:I, s:I, s:s, s:s, s:s, s:n, s:n}", "id", id, "object", "file",
                     "bytes", (json_int_t)bytes, "created_at", (json_int_t)created, "filename",
                     name, "purpose", purpose, "status", "processed", "status_details",
                     "expires_at");
}

/* Store the meta, index the file, count its bytes: one MULTI. */
static int commit(api_req *q, api_upload *u, long long now_s, md_err *e) {
    md_redis *r = api_redis(q->s, e);
    if (!r)
        return MD_EREDIS;
    char meta[Q_KEY_MAX], files[Q_KEY_MAX], usage[Q_KEY_MAX];
    api_key_file(meta, q->s->prefix, u->id);
    api_key_tenant(files, q->s->prefix, q->tenant, "files");
    api_key_tenant(usage, q->s->prefix, q->tenant, "usage");
    redisContext *ctx = md_redis_ctx(r);
    redisAppendCommand(ctx, "MULTI");
    redisAppendCommand(ctx,
                       "HSET %s tenant %s purpose batch filename %s bytes %lld lines %lld "
                       "created_at %lld",
                       meta, q->tenant, u->filename, u->bytes, u->lines, now_s);
    redisAppendCommand(ctx, "PERSIST %s", u->data_key);
    redisAppendCommand(ctx, "ZADD %s %lld %s", files, (long long)md_wall_ms(), u->id);
    redisAppendCommand(ctx, "HINCRBY %s bytes %lld", usage, u->bytes);
    redisAppendCommand(ctx, "HINCRBY %s files 1", usage);
    redisAppendCommand(ctx, "EXEC");
    for (int i = 0; i < 7; i++) {
        redisReply *rep = md_redis_get_reply(r, e);
        if (!rep)
            return MD_EREDIS;
        int bad = rep->type == REDIS_REPLY_ERROR || (i == 6 && rep->type != REDIS_REPLY_ARRAY);
        freeReplyObject(rep);
        if (bad)
            return md_errf(e, MD_EREDIS, "storing file %s: Redis refused the transaction", u->id);
    }
    u->committed = 1;
    return 0;
}

/* The last call of POST /v1/files: the body is in; check it whole and keep it. */
static enum MHD_Result upload_finish(api_req *q, struct MHD_Connection *c) {
    api_upload *u = q->up;
    if (!u)
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, "file", "invalid_request",
                              "expected a multipart/form-data body with fields file and purpose");
    if (MHD_destroy_post_processor(u->pp) != MHD_YES && !u->err_status)
        upload_fail(u, MHD_HTTP_BAD_REQUEST, NULL, "invalid_multipart",
                    "the multipart/form-data body is incomplete or malformed");
    u->pp = NULL;
    u->lines += u->line_has_text;
    u->line_has_text = 0;
    if (u->err_status)
        return api_send_error(q, c, u->err_status, u->err_param, u->err_code, "%s", u->err_msg);
    if (u->unknown[0])
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, u->unknown, "unknown_parameter",
                              "Unrecognized request argument supplied: %s", u->unknown);
    if (!u->saw_file)
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, "file", "missing_required_parameter",
                              "'file' is a required property");
    if (strcmp(u->purpose, "batch"))
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, "purpose", "invalid_value",
                              "purpose '%s' is not served here; only \"batch\"", u->purpose);
    if (u->lines == 0)
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, "file", "empty_file",
                              "the file has no request lines");
    md_err e = {0};
    long long now = md_wall_ms() / 1000;
    if (flush_chunk(q, u) || commit(q, u, now, &e))
        return api_send_redis_error(q, c, u->e.msg[0] ? &u->e : &e);
    md_counter_add(md_metric_at1(q->s->m_upload, q->tenant), (double)u->bytes);
    MD_INFO("api", "tenant %s stored %s (%lld bytes, %lld lines)", q->tenant, u->id, u->bytes,
            u->lines);
    return api_send_json(q, c, MHD_HTTP_OK,
                         file_object(u->id, u->bytes, now, u->filename, "batch"));
}

/* The value of field name in an HGETALL reply, or "". */
static const char *hfield(const redisReply *h, const char *name) {
    for (size_t i = 0; h->type == REDIS_REPLY_ARRAY && i + 1 < h->elements; i += 2)
        if (!strcmp(h->element[i]->str, name))
            return h->element[i + 1]->str;
    return "";
}

json_t *api_file_get(md_redis *r, const char *prefix, const char *tenant, const char *id, int sized,
                     int *rc, md_err *e) {
    char batch[API_ID_MAX], key[Q_KEY_MAX];
    int ok;
    if (api_output_file_batch(id, batch, &ok))
        return api_output_object(r, prefix, tenant, batch, ok, sized, rc, e);
    api_key_file(key, prefix, id);
    redisReply *h = md_redis_cmd(r, e, "HGETALL %s", key);
    if (!h) {
        *rc = MD_EREDIS;
        return NULL;
    }
    json_t *o = NULL;
    *rc = MD_ENOTFOUND;
    if (h->type == REDIS_REPLY_ARRAY && h->elements && !strcmp(hfield(h, "tenant"), tenant)) {
        o = file_object(id, atoll(hfield(h, "bytes")), atoll(hfield(h, "created_at")),
                        hfield(h, "filename"), hfield(h, "purpose"));
        *rc = 0;
    }
    freeReplyObject(h);
    return o;
}

typedef struct {
    md_redis *r;
    const char *prefix, *tenant, *purpose;
    md_err *e;
} list_ctx;

static json_t *list_one(void *cls, const char *id) {
    list_ctx *l = cls;
    int rc;
    json_t *o = api_file_get(l->r, l->prefix, l->tenant, id, 1, &rc, l->e);
    const char *p = json_string_value(json_object_get(o, "purpose"));
    if (o && l->purpose && p && strcmp(p, l->purpose)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static enum MHD_Result list_files(api_req *q, struct MHD_Connection *c, md_redis *r) {
    long long limit = api_int_arg(c, "limit", 10000, 1, 10000);
    const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
    const char *order = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order");
    const char *purpose = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "purpose");
    if (limit < 0)
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, "limit", "invalid_value",
                              "limit must be an integer in 1..10000");
    if (order && strcmp(order, "asc") && strcmp(order, "desc"))
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, "order", "invalid_value",
                              "order must be \"asc\" or \"desc\"");
    if (after && !api_id_ok(after))
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, "after", "invalid_value",
                              "after must be a file id");
    char key[Q_KEY_MAX];
    md_err e = {0};
    if (api_outputs_settle(r, q->s->prefix, q->tenant, &e))
        return api_send_redis_error(q, c, &e);
    api_key_tenant(key, q->s->prefix, q->tenant, "files");
    list_ctx l = {r, q->s->prefix, q->tenant, purpose, &e};
    json_t *page =
        api_list_page(r, key, limit, after, !order || !strcmp(order, "desc"), list_one, &l, &e);
    return page ? api_send_json(q, c, MHD_HTTP_OK, page) : api_send_redis_error(q, c, &e);
}

static enum MHD_Result delete_file(api_req *q, struct MHD_Connection *c, md_redis *r,
                                   const char *id, json_t *f) {
    char batch[API_ID_MAX];
    int ok;
    md_err e = {0};
    if (api_output_file_batch(id, batch, &ok)) {
        json_decref(f);
        int rc = api_output_delete(r, q->s->prefix, q->tenant, batch, ok, &e);
        if (rc == MD_ENOTFOUND)
            return api_send_not_found(q, c, "File", id);
        if (rc == MD_EINVAL)
            return api_send_error(q, c, MHD_HTTP_CONFLICT, "file_id", "invalid_state", "%s", e.msg);
        if (rc)
            return api_send_redis_error(q, c, &e);
        return api_send_json(
            q, c, MHD_HTTP_OK,
            json_pack("{s:s, s:s, s:b}", "id", id, "object", "file", "deleted", 1));
    }
    long long bytes = json_integer_value(json_object_get(f, "bytes"));
    json_decref(f);
    char meta[Q_KEY_MAX], data[Q_KEY_MAX], files[Q_KEY_MAX], usage[Q_KEY_MAX];
    api_key_file(meta, q->s->prefix, id);
    api_key_file_data(data, q->s->prefix, id);
    api_key_tenant(files, q->s->prefix, q->tenant, "files");
    api_key_tenant(usage, q->s->prefix, q->tenant, "usage");
    redisReply *rep = md_redis_cmd(r, &e, "ZREM %s %s", files, id);
    if (!rep)
        return api_send_redis_error(q, c, &e);
    int mine = rep->integer == 1; /* two deletes at once: one frees the bytes */
    freeReplyObject(rep);
    if (mine) {
        if (!(rep = md_redis_cmd(r, &e, "UNLINK %s %s", meta, data)))
            return api_send_redis_error(q, c, &e);
        freeReplyObject(rep);
        if (!(rep = md_redis_cmd(r, &e, "HINCRBY %s bytes %lld", usage, -bytes)))
            return api_send_redis_error(q, c, &e);
        freeReplyObject(rep);
        if (!(rep = md_redis_cmd(r, &e, "HINCRBY %s files -1", usage)))
            return api_send_redis_error(q, c, &e);
        freeReplyObject(rep);
    }
    return api_send_json(q, c, MHD_HTTP_OK,
                         json_pack("{s:s, s:s, s:b}", "id", id, "object", "file", "deleted", 1));
}

static enum MHD_Result send_content(api_req *q, struct MHD_Connection *c, const char *id) {
    char batch[API_ID_MAX], data[Q_KEY_MAX];
    int ok;
    struct MHD_Response *resp;
    if (api_output_file_batch(id, batch, &ok)) {
        resp = api_stream_output(q->s, batch, ok);
    } else {
        api_key_file_data(data, q->s->prefix, id);
        resp = api_stream_data(q->s, data);
    }
    if (!resp)
        return api_send_error(q, c, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, NULL, "out of memory");
    MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
    q->status = MHD_HTTP_OK;
    q->answered = 1;
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return rc;
}

enum MHD_Result api_files_route(api_req *q, struct MHD_Connection *c, const char *method,
                                const char *rest) {
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (!*rest && !strcmp(method, "POST"))
        return upload_finish(q, c);
    md_err e = {0};
    md_redis *r = api_redis(q->s, &e);
    if (!r)
        return api_send_redis_error(q, c, &e);
    if (!*rest && get)
        return list_files(q, c, r);
    if (!*rest)
        return api_send_error(q, c, MHD_HTTP_METHOD_NOT_ALLOWED, NULL, NULL,
                              "/v1/files takes GET and POST");
    char id[API_ID_MAX + 16];
    const char *slash = strchr(rest + 1, '/');
    size_t n = slash ? (size_t)(slash - rest - 1) : strlen(rest + 1);
    snprintf(id, sizeof id, "%.*s", n < sizeof id ? (int)n : (int)sizeof id - 1, rest + 1);
    int content = slash && !strcmp(slash, "/content");
    if ((slash && !content) || !api_id_ok(id))
        return api_send_not_found(q, c, "File", rest + 1);
    int rc;
    /* content needs no size: an output file's is counted over its whole stream */
    json_t *f = api_file_get(r, q->s->prefix, q->tenant, id, !content, &rc, &e);
    if (!f)
        return rc == MD_ENOTFOUND ? api_send_not_found(q, c, "File", id)
                                  : api_send_redis_error(q, c, &e);
    if (content && get) {
        json_decref(f);
        return send_content(q, c, id);
    }
    if (!content && get)
        return api_send_json(q, c, MHD_HTTP_OK, f);
    if (!content && !strcmp(method, "DELETE"))
        return delete_file(q, c, r, id, f);
    json_decref(f);
    return api_send_error(q, c, MHD_HTTP_METHOD_NOT_ALLOWED, NULL, NULL,
                          "method %s is not served on a file", method);
}
