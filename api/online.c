/* online.c — see online.h: POST /v1/chat/completions and /v1/completions. A request is
 * validated as a batch line is (q_validate with q_limits.online, so every field either works
 * or is a 400 naming it), queued in the online lane P online:{M} (docs/protocol.md §9) with a
 * deadline, and its connection suspended until the waiter (online_wait.c) brings the worker's
 * events. Without stream: the output line becomes the answer (its status and body, or
 * OpenAI's error envelope). With stream: true the answer waits for the worker's start event
 * (so that a request the worker refuses, a prompt past the context for one, is still a 400),
 * then is a 200 event stream written as the events come (sse.c). The process keeps nothing
 * else: the request and its events are in Redis, so any API process serves any request. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/online.h"
#include "common/log.h"
#include "common/util.h"
#include "queue/online.h"
#include "queue/queue.h"
#include "queue/validate.h"

#define SSE_BLOCK (16 * 1024) /* bytes libmicrohttpd asks the event stream for at a time */

static api_sse meta_of(const api_online *on, char *idbuf, size_t idsz) {
    snprintf(idbuf, idsz, "%s%s", on->chat ? "chatcmpl-" : "cmpl-", on->id);
    return (api_sse){.chat = on->chat,
                     .id = idbuf,
                     .model = on->model,
                     .created = on->created_s,
                     .include_usage = on->include_usage};
}

/* The events the stream can send now into on->out (under the waiter's lock): the role, the
 * text that came, and the end when the request is over. */
static void fill(api_online *on) {
    char idbuf[64];
    api_sse m = meta_of(on, idbuf, sizeof idbuf);
    int oom = 0;
    if (on->chat && !on->role_sent) {
        oom |= api_sse_role(&on->out, &m);
        on->role_sent = 1;
    }
    if (on->diverged) {
        json_t *err = json_pack("{s:s, s:s, s:n, s:s}", "message",
                                "the request was run again after a worker failed, and its text "
                                "differs from the text already streamed",
                                "type", "server_error", "param", "code", "server_error");
        oom |= !err || api_sse_error(&on->out, err);
        json_decref(err);
        on->ended = 1;
        return;
    }
    if (on->text_len > on->emitted) {
        oom |= api_sse_text(&on->out, &m, on->text + on->emitted, on->text_len - on->emitted, NULL);
        on->emitted = on->text_len;
    }
    if (on->finished) {
        oom |= api_sse_answer(&on->out, &m, on->done, on->text, on->emitted);
        on->ended = 1;
    } else if (on->failed) {
        json_t *err = json_pack("{s:s, s:s, s:n, s:s}", "message", on->fail_msg, "type",
                                "server_error", "param", "code", on->fail_code);
        oom |= !err || api_sse_error(&on->out, err);
        json_decref(err);
        on->ended = 1;
    }
    if (oom)
        on->gone = 1; /* out of memory: the connection is closed */
}

/* libmicrohttpd's content reader of an event stream: what fill() made, or (nothing yet)
 * the connection parked until the waiter brings more. */
static ssize_t read_stream(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    api_online *on = cls;
    api_server *s = on->s;
    api_waiter_lock(s);
    if (on->out_pos == on->out.len && !on->ended && !on->gone) {
        on->out.len = on->out_pos = 0;
        fill(on);
    }
    ssize_t n;
    if (on->gone) {
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (on->out_pos < on->out.len) {
        size_t k = on->out.len - on->out_pos < max ? on->out.len - on->out_pos : max;
        memcpy(buf, on->out.p + on->out_pos, k);
        on->out_pos += k;
        n = (ssize_t)k;
    } else if (on->ended) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        on->parked = 1;
        MHD_suspend_connection(on->c);
        n = 0;
    }
    api_waiter_unlock(s);
    return n;
}

/* The 200 event stream; its body is read_stream's. */
static enum MHD_Result start_stream(api_req *q, struct MHD_Connection *c) {
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, read_stream, q->on, NULL);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Accel-Buffering", "no"); /* proxies: pass events at once */
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    q->status = MHD_HTTP_OK;
    q->answered = 1;
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return rc;
}

enum MHD_Result api_online_resume(api_req *q, struct MHD_Connection *c) {
    api_online *on = q->on;
    api_server *s = q->s;
    api_waiter_lock(s);
    if (on->gone) {
        api_waiter_unlock(s);
        return MHD_NO;
    }
    int answer =
        on->stream ? on->started || on->finished || on->failed : on->finished || on->failed;
    if (!answer && !api_waiter_stopping(s)) {
        on->parked = 1;
        MHD_suspend_connection(c);
        api_waiter_unlock(s);
        return MHD_YES;
    }
    if (!answer) { /* stopping before the worker answered */
        on->failed = 1;
        on->fail_status = MHD_HTTP_SERVICE_UNAVAILABLE;
        snprintf(on->fail_code, sizeof on->fail_code, "shutting_down");
        snprintf(on->fail_msg, sizeof on->fail_msg, "the API process is stopping");
    }
    /* a stream begins once the worker started the request (or answered a success at once);
     * anything else is one JSON answer */
    unsigned status = 0;
    json_t *doc = NULL;
    if (on->finished)
        doc = api_answer_doc(on->done, &status);
    int stream = on->stream && !on->failed && (on->started || status == MHD_HTTP_OK);
    char code[48], msg[256];
    snprintf(code, sizeof code, "%s", on->fail_code);
    snprintf(msg, sizeof msg, "%s", on->fail_msg);
    unsigned fail = on->fail_status ? on->fail_status : MHD_HTTP_INTERNAL_SERVER_ERROR;
    api_waiter_unlock(s);
    if (stream) {
        json_decref(doc);
        return start_stream(q, c);
    }
    if (doc)
        return api_send_json(q, c, status, doc);
    return api_send_error(q, c, fail, NULL, code, "%s", msg);
}

/* A validation failure as OpenAI answers it: 400 (404 for a model), param without the batch
 * line's "body." prefix. */
static enum MHD_Result refuse(api_req *q, struct MHD_Connection *c, const q_verr *ve) {
    const char *param = ve->param[0] ? ve->param : NULL;
    if (param && !strncmp(param, "body.", 5))
        param += 5;
    char msg[sizeof ve->message];
    snprintf(msg, sizeof msg, "%s", ve->message);
    /* "body.temperature is 3" reads "temperature is 3" to a client that sent no batch line */
    for (char *p = strstr(msg, "body."); p; p = strstr(p, "body."))
        memmove(p, p + 5, strlen(p + 5) + 1);
    return api_send_error(q, c, ve->status ? (unsigned)ve->status : 400, param, ve->code, "%s",
                          msg);
}

/* Queue the request: XADD P online:{M} * reply R line <line> deadline D tenant T. */
static int enqueue(api_req *q, md_redis *r, const api_online *on, const char *line, md_err *e) {
    char key[Q_KEY_MAX], dl[24];
    q_key_online(key, q->s->prefix, on->model);
    snprintf(dl, sizeof dl, "%lld", on->deadline_ms);
    const char *argv[] = {"XADD", key,        "*", "reply",  on->id,   "line",
                          line,   "deadline", dl,  "tenant", q->tenant};
    size_t lens[11];
    for (int k = 0; k < 11; k++)
        lens[k] = strlen(argv[k]);
    redisReply *rep = md_redis_cmd_argv(r, 11, argv, lens, e);
    if (!rep)
        return MD_EREDIS;
    int rc = rep->type == REDIS_REPLY_ERROR
                 ? md_errf(e, MD_EINVAL, "XADD %s refused: %s", key, rep->str)
                 : 0;
    freeReplyObject(rep);
    return rc;
}

/* Whether a worker ever served model: its online lane exists (a worker creates its group).
 * 1, 0, or -1 on a Redis failure. */
static int served(md_redis *r, const char *prefix, const char *model, md_err *e) {
    char key[Q_KEY_MAX];
    q_key_online(key, prefix, model);
    redisReply *rep = md_redis_cmd(r, e, "EXISTS %s", key);
    if (!rep)
        return -1;
    int n = rep->type == REDIS_REPLY_INTEGER ? (int)rep->integer : 0;
    freeReplyObject(rep);
    return n > 0;
}

enum MHD_Result api_online_route(api_req *q, struct MHD_Connection *c, const char *method,
                                 int chat) {
    api_server *s = q->s;
    if (strcmp(method, "POST"))
        return api_send_error(q, c, MHD_HTTP_METHOD_NOT_ALLOWED, NULL, NULL,
                              "%s takes POST, not %s",
                              chat ? "/v1/chat/completions" : "/v1/completions", method);
    json_error_t je;
    json_t *body = q->body ? json_loadb(q->body, q->body_len, 0, &je) : NULL;
    if (!body)
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, NULL, "invalid_json",
                              "We could not parse the JSON body of your request: %s",
                              q->body ? je.text : "the body is empty");
    char model[128]; /* "" when too long to be a queue's (a 404 then) */
    const char *mv = json_string_value(json_object_get(body, "model"));
    snprintf(model, sizeof model, "%s", mv && strlen(mv) < sizeof model ? mv : "");
    if (json_is_object(body) && !json_object_get(body, "model")) {
        json_decref(body);
        return api_send_error(q, c, MHD_HTTP_BAD_REQUEST, "model", "missing_required_parameter",
                              "you must provide a model parameter");
    }
    api_online *on = calloc(1, sizeof *on);
    char *line = NULL;
    if (on) {
        md_random_hex(on->id, sizeof on->id, 24);
        json_t *doc =
            json_pack("{s:s, s:s, s:s, s:O}", "custom_id", on->id, "method", "POST", "url",
                      chat ? "/v1/chat/completions" : "/v1/completions", "body", body);
        line = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
        json_decref(doc);
    }
    json_decref(body);
    if (!on || !line) {
        free(on);
        return api_send_error(q, c, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, NULL, "out of memory");
    }
    /* the batch line's rules (a body that is not an object is refused here too) */
    q_limits lim;
    q_limits_default(&lim);
    lim.online = 1;
    lim.max_line_bytes = strlen(line) + 1;
    q_request req;
    q_verr ve;
    char cidbuf[Q_CUSTOM_ID_MAX];
    if (q_validate(line, strlen(line), &lim, &req, cidbuf, &ve)) {
        q_request_free(&req);
        free(line);
        free(on);
        return refuse(q, c, &ve);
    }
    *on = (api_online){.s = s,
                       .c = c,
                       .fd = -1,
                       .chat = chat,
                       .stream = req.stream,
                       .include_usage = req.include_usage,
                       .created_s = md_wall_ms() / 1000,
                       .deadline_ms = md_wall_ms() + (long long)s->cfg->online_timeout_s * 1000};
    snprintf(on->id, sizeof on->id, "%s", req.custom_id);
    snprintf(on->model, sizeof on->model, "%s", model);
    snprintf(on->last, sizeof on->last, "0-0");
    q_request_free(&req);
    md_err e = {0};
    md_redis *r = api_redis(s, &e);
    int sv = r && q_online_model_ok(on->model) ? served(r, s->prefix, on->model, &e) : r ? 0 : -1;
    if (sv <= 0) {
        free(line);
        free(on);
        if (sv < 0)
            return api_send_redis_error(q, c, &e);
        return api_send_error(q, c, MHD_HTTP_NOT_FOUND, "model", "model_not_found",
                              "The model '%s' does not exist or no worker serves it", model);
    }
    snprintf(on->key, sizeof on->key, "%sreply:{%s}", s->prefix, on->id);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    on->fd = ci ? ci->connect_fd : -1;
    q->on = on;
    if (api_waiter_add(s, on)) {
        free(line);
        return api_send_error(q, c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "shutting_down",
                              "the API process is stopping");
    }
    int rc = enqueue(q, r, on, line, &e);
    free(line);
    on->queued = !rc;
    if (rc) {
        api_waiter_remove(s, on);
        return rc == MD_EREDIS ? api_send_redis_error(q, c, &e)
                               : api_send_error(q, c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL,
                                                "redis_unavailable", "%s", e.msg);
    }
    return api_online_resume(q, c);
}

void api_online_end(api_req *q) {
    api_online *on = q->on;
    if (!on)
        return;
    api_server *s = q->s;
    api_waiter_remove(s, on);
    /* unregistered: only this thread sees on now */
    md_err e = {0};
    md_redis *r = on->key[0] ? api_redis(s, &e) : NULL;
    redisReply *rep = NULL;
    if (r && on->finished) { /* answered: its events are of no more use */
        rep = md_redis_cmd(r, &e, "UNLINK %s", on->key);
    } else if (r && on->queued) {
        /* not answered (the client went away, the deadline passed, this process stops): a
         * worker drops it unread or stops it */
        char ck[Q_KEY_MAX];
        q_key_cancel(ck, s->prefix, on->id);
        rep = md_redis_cmd(r, &e, "SET %s 1 PX %d", ck, Q_CANCEL_TTL_MS);
    }
    if (rep)
        freeReplyObject(rep);
    else if (r && e.code == MD_EREDIS)
        api_redis_failed();
    json_decref(on->done);
    free(on->text);
    api_buf_free(&on->out);
    free(on);
    q->on = NULL;
}
