/* api.c — see api.h. The batches (with the incremental cost tally of their output
 * streams), the DLQ and the actions (written through the operator connection, dash_op); the
 * fleet and the plan are in fleet.c. */
#include "dashboard/api.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "dashboard/api_int.h"
#include "queue/queue.h"
#include "queue/validate.h"

const int dash_api_scan_budget = 20000;

#define TALLY_MAX 1000 /* batches whose tallies are kept (api.c caps `limit` at 500) */

dash_api *dash_api_new(md_redis *r, const char *prefix, int heartbeat_ms) {
    dash_api *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->r = r;
    snprintf(a->prefix, sizeof a->prefix, "%s", prefix);
    a->heartbeat_ms = heartbeat_ms;
    return a;
}

void dash_api_free(dash_api *a) {
    if (!a)
        return;
    for (int i = 0; i < a->n_tally; i++)
        json_decref(a->tally[i].failures);
    free(a->tally);
    json_decref(a->cancel_from);
    md_redis_close(a->r);
    md_redis_close(a->op);
    free(a);
}

md_redis *dash_api_redis(dash_api *a) {
    return a->r;
}

void dash_api_set_operator(dash_api *a, md_redis *op) {
    md_redis_close(a->op);
    a->op = op;
}

md_redis *dash_op(dash_api *a, md_err *e) {
    if (!a->op)
        return a->r;
    redisContext *ctx = md_redis_ctx(a->op);
    if ((!ctx || ctx->err) && md_redis_reconnect(a->op, 1000, NULL, e))
        return NULL;
    return a->op;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one (RFC 3629: no
 * overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (n < len)
        return 0;
    unsigned cp = c & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

json_t *dash_json_str(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) { /* the common case: already valid, no copy */
        size_t k = utf8_seq(u + i, n - i);
        if (!k)
            break;
        i += k;
    }
    if (i == n) {
        json_t *j = json_stringn(s, n);
        return j ? j : json_string("");
    }
    char *buf = malloc(n * 3 + 1); /* each bad byte becomes 3 bytes (U+FFFD) */
    if (!buf)
        return json_string("");
    size_t o = 0;
    for (i = 0; i < n;) {
        size_t k = utf8_seq(u + i, n - i);
        if (k) {
            memcpy(buf + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    json_t *j = json_stringn(buf, o);
    free(buf);
    return j ? j : json_string("");
}

json_t *dash_reply_str(const redisReply *r) {
    if (!r || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS))
        return json_null();
    return dash_json_str(r->str, r->len);
}

int dash_reply_error(const redisReply *rep, const char *what, md_err *e) {
    if (!rep)
        return MD_EREDIS;
    if (rep->type == REDIS_REPLY_ERROR)
        return md_errf(e, MD_EREDIS, "%s: %s", what, rep->str);
    return 0;
}

json_t *dash_scan(dash_api *a, const char *pattern, md_err *e) {
    json_t *keys = json_array();
    char cursor[32] = "0";
    do {
        redisReply *r = md_redis_cmd(a->r, e, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
            if (r)
                md_errf(e, MD_EREDIS, "SCAN %s: %s", pattern,
                        r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
            freeReplyObject(r);
            json_decref(keys);
            return NULL;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        for (size_t i = 0; i < r->element[1]->elements; i++) {
            const redisReply *k = r->element[1]->element[i];
            if (k->type == REDIS_REPLY_STRING)
                json_array_append_new(keys, json_stringn_nocheck(k->str, k->len));
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0"));
    return keys;
}

static int cmp_key(const void *x, const void *y) {
    return strcmp(json_string_value(*(json_t *const *)x), json_string_value(*(json_t *const *)y));
}

void dash_sort_strings(json_t *arr) {
    size_t n = json_array_size(arr);
    if (n < 2)
        return;
    json_t **v = malloc(n * sizeof *v);
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        v[i] = json_incref(json_array_get(arr, i));
    qsort(v, n, sizeof *v, cmp_key);
    json_array_clear(arr);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, v[i]);
    free(v);
}

const char *dash_braced(const char *key, const char *head, size_t *len) {
    size_t h = strlen(head), n = strlen(key);
    if (n < h + 2 || strncmp(key, head, h) || key[h] != '{' || key[n - 1] != '}')
        return NULL;
    *len = n - h - 2;
    return key + h + 1;
}

/* ---- batches ------------------------------------------------------------------------------ */

static tally *tally_get(dash_api *a, const char *id) {
    for (int i = 0; i < a->n_tally; i++)
        if (!strcmp(a->tally[i].id, id))
            return &a->tally[i];
    if (a->n_tally == TALLY_MAX)
        return NULL;
    if (a->n_tally == a->cap_tally) {
        int cap = a->cap_tally ? a->cap_tally * 2 : 64;
        tally *t = realloc(a->tally, (size_t)cap * sizeof *t);
        if (!t)
            return NULL;
        a->tally = t;
        a->cap_tally = cap;
    }
    tally *t = &a->tally[a->n_tally++];
    memset(t, 0, sizeof *t);
    snprintf(t->id, sizeof t->id, "%s", id);
    t->failures = json_object();
    return t;
}

/* Forget the tallies of batches no longer listed (deleted, or pushed out by newer ones). */
static void tally_sweep(dash_api *a) {
    int o = 0;
    for (int i = 0; i < a->n_tally; i++) {
        if (a->tally[i].seen == a->sweep)
            a->tally[o++] = a->tally[i];
        else
            json_decref(a->tally[i].failures);
    }
    a->n_tally = o;
}

/* The error code of a failed output line (schemas/error-line): error.code, else the
 * response body's error.code (a request answered 400), else "unknown". */
static const char *failure_code(json_t *line) {
    const char *c = json_string_value(json_object_get(json_object_get(line, "error"), "code"));
    if (!c)
        c = json_string_value(json_object_get(
            json_object_get(json_object_get(json_object_get(line, "response"), "body"), "error"),
            "code"));
    return c && *c && strlen(c) < 64 ? c : "unknown";
}

/* Add one output-stream entry (fields custom_id ok line) to t. */
static void tally_entry(tally *t, const redisReply *fields) {
    const redisReply *line = NULL, *ok = NULL;
    for (size_t i = 0; i + 1 < fields->elements; i += 2) {
        const redisReply *k = fields->element[i];
        if (k->type != REDIS_REPLY_STRING)
            continue;
        if (!strcmp(k->str, "line"))
            line = fields->element[i + 1];
        else if (!strcmp(k->str, "ok"))
            ok = fields->element[i + 1];
    }
    t->n++;
    json_t *doc =
        line && line->type == REDIS_REPLY_STRING ? json_loadb(line->str, line->len, 0, NULL) : NULL;
    json_t *m = json_object_get(doc, "medley");
    double usd = json_number_value(json_object_get(m, "cost_usd"));
    if (usd > 0 && usd < 1e9)
        t->cost_usd += usd;
    json_t *body = json_object_get(json_object_get(doc, "response"), "body");
    json_t *usage = json_object_get(body, "usage");
    json_int_t tok = json_integer_value(json_object_get(usage, "completion_tokens"));
    if (tok > 0)
        t->completion_tokens += tok;
    const char *object = json_string_value(json_object_get(body, "object"));
    if (object && !strcmp(object, "list")) { /* an embeddings answer (docs/embeddings.md) */
        json_int_t et = json_integer_value(json_object_get(usage, "total_tokens"));
        if (et > 0)
            t->embedding_tokens += et;
        t->embedding_inputs += (long long)json_array_size(json_object_get(body, "data"));
    }
    if (!(ok && ok->type == REDIS_REPLY_STRING && !strcmp(ok->str, "1"))) {
        const char *code = doc ? failure_code(doc) : "unreadable_line";
        json_t *c = json_object_get(t->failures, code);
        json_object_set_new(t->failures, code, json_integer(json_integer_value(c) + 1));
    }
    json_decref(doc);
}

/* Read P {B}:out past t->last, at most *budget entries. MD_EREDIS on a failed connection. */
static int tally_scan(dash_api *a, tally *t, long long done, int *budget, md_err *e) {
    char key[Q_KEY_MAX];
    q_key_out(key, a->prefix, t->id);
    while (t->n<done && * budget> 0) {
        int count = *budget < 1000 ? *budget : 1000;
        char from[64];
        snprintf(from, sizeof from, t->last[0] ? "(%s" : "-", t->last);
        redisReply *r = md_redis_cmd(a->r, e, "XRANGE %s %s + COUNT %d", key, from, count);
        if (!r)
            return MD_EREDIS;
        if (r->type != REDIS_REPLY_ARRAY) { /* not a stream: nothing to sum */
            freeReplyObject(r);
            return 0;
        }
        for (size_t i = 0; i < r->elements; i++) {
            const redisReply *ent = r->element[i];
            if (ent->type != REDIS_REPLY_ARRAY || ent->elements != 2 ||
                ent->element[0]->type != REDIS_REPLY_STRING ||
                ent->element[1]->type != REDIS_REPLY_ARRAY)
                continue;
            snprintf(t->last, sizeof t->last, "%s", ent->element[0]->str);
            tally_entry(t, ent->element[1]);
        }
        *budget -= (int)r->elements;
        size_t got = r->elements;
        freeReplyObject(r);
        if ((int)got < count)
            break;
    }
    /* fewer entries than answers but no budget problem: the stream lost entries (trimmed, or
     * written by hand); waiting for them would say "summing" forever */
    t->more = t->n < done && *budget <= 0;
    return 0;
}

static json_t *num_or_null(int known, double v) {
    return known ? json_real(v) : json_null();
}

json_t *dash_api_batches(dash_api *a, int limit, md_err *e) {
    char idx[Q_KEY_MAX];
    q_key_batches(idx, a->prefix);
    redisReply *ids = md_redis_cmd(a->r, e, "ZREVRANGE %s 0 %d", idx, limit - 1);
    if (dash_reply_error(ids, "ZREVRANGE batches", e)) {
        freeReplyObject(ids);
        return NULL;
    }
    redisReply *card = md_redis_cmd(a->r, e, "ZCARD %s", idx);
    if (dash_reply_error(card, "ZCARD batches", e)) {
        freeReplyObject(card);
        freeReplyObject(ids);
        return NULL;
    }
    long long now = (long long)md_wall_ms();
    json_t *out = json_pack("{s:I, s:I}", "now_ms", (json_int_t)now, "indexed",
                            (json_int_t)(card->type == REDIS_REPLY_INTEGER ? card->integer : 0));
    freeReplyObject(card);
    json_t *list = json_array();
    json_object_set_new(out, "batches", list);
    int budget = dash_api_scan_budget, cancel_budget = dash_cancel_budget;
    a->sweep++;
    json_t *served = NULL; /* read at the first batch not finished */
    for (size_t i = 0; ids->type == REDIS_REPLY_ARRAY && i < ids->elements; i++) {
        const redisReply *id = ids->element[i];
        if (id->type != REDIS_REPLY_STRING || id->len >= sizeof a->tally[0].id)
            continue; /* longer than any key q_key_* builds: cannot be a batch */
        q_batch_info b;
        int rc = q_batch_get(a->r, a->prefix, id->str, &b, e);
        if (rc == MD_ENOTFOUND)
            continue; /* deleted since it was indexed */
        if (rc) {
            json_decref(out);
            freeReplyObject(ids);
            return NULL;
        }
        long long done = b.completed + b.failed;
        tally *t = tally_get(a, id->str);
        if (t) {
            t->seen = a->sweep;
            if (tally_scan(a, t, done, &budget, e)) {
                json_decref(out);
                freeReplyObject(ids);
                return NULL;
            }
        }
        int terminal = q_status_terminal(b.status);
        if (!terminal && !served && !(served = dash_served_models(a, e))) {
            json_decref(out);
            freeReplyObject(ids);
            return NULL;
        }
        if (json_object_get(a->cancel_from, id->str) && !strcmp(b.status, "cancelling") &&
            !json_object_get(served, b.model) && cancel_budget > 0) {
            /* this dashboard's cancel of an unserved batch left lines: go on with it */
            long long n = 0;
            int more = 0;
            if (dash_cancel_unserved(a, id->str, b.model, &cancel_budget, &n, &more, e) ||
                (n && q_batch_get(a->r, a->prefix, id->str, &b, e))) {
                json_decref(out);
                json_decref(served);
                freeReplyObject(ids);
                return NULL;
            }
            done = b.completed + b.failed;
            terminal = q_status_terminal(b.status);
        }
        if (terminal) /* ended: by this dashboard's answers, or by workers */
            json_object_del(a->cancel_from, id->str);
        double since_s = 0;
        if (b.started_at > 0)
            since_s = (double)((b.finished_at > 0 ? b.finished_at : now) - b.started_at) / 1000.0;
        double rate = since_s > 0 ? (double)done / since_s : 0;
        json_t *j = json_object();
        json_object_set_new(j, "id", dash_json_str(id->str, id->len));
        json_object_set_new(j, "status", dash_json_str(b.status, strlen(b.status)));
        json_object_set_new(j, "model", dash_json_str(b.model, strlen(b.model)));
        json_object_set_new(j, "tenant", dash_json_str(b.tenant, strlen(b.tenant)));
        json_object_set_new(j, "endpoint", dash_json_str(b.endpoint, strlen(b.endpoint)));
        json_object_set_new(j, "errors", dash_json_str(b.errors, strlen(b.errors)));
        json_object_set_new(j, "total", json_integer(b.total));
        json_object_set_new(j, "completed", json_integer(b.completed));
        json_object_set_new(j, "failed", json_integer(b.failed));
        json_object_set_new(j, "done", json_integer(done));
        json_object_set_new(j, "progress",
                            json_real(b.total > 0 ? (double)done / (double)b.total : 0));
        json_object_set_new(j, "created_at", json_integer(b.created_at));
        json_object_set_new(j, "started_at", json_integer(b.started_at));
        json_object_set_new(j, "finished_at", json_integer(b.finished_at));
        json_object_set_new(j, "deadline", json_integer(b.deadline));
        json_object_set_new(j, "priority", json_integer(b.priority));
        json_object_set_new(j, "rate_per_s", json_real(rate));
        json_object_set_new(j, "eta_s",
                            num_or_null(!terminal && b.total > 0 && rate > 0 && done < b.total,
                                        (double)(b.total - done) / (rate > 0 ? rate : 1)));
        json_object_set_new(j, "cost_usd", json_real(t ? t->cost_usd : 0));
        json_object_set_new(j, "completion_tokens", json_integer(t ? t->completion_tokens : 0));
        json_object_set_new(j, "embedding_tokens", json_integer(t ? t->embedding_tokens : 0));
        json_object_set_new(j, "embedding_inputs", json_integer(t ? t->embedding_inputs : 0));
        /* $ per million generated tokens; for an embeddings batch, per million embedded */
        long long per = !t                         ? 0
                        : t->completion_tokens > 0 ? t->completion_tokens
                                                   : t->embedding_tokens;
        json_object_set_new(j, "usd_per_mtok",
                            num_or_null(per > 0, per > 0 ? t->cost_usd / (double)per * 1e6 : 0));
        json_object_set_new(j, "failures", t ? json_deep_copy(t->failures) : json_object());
        json_object_set_new(j, "cost_partial", json_boolean(!t || t->more));
        json_object_set_new(j, "unserved",
                            json_boolean(!terminal && !json_object_get(served, b.model)));
        json_array_append_new(list, j);
    }
    freeReplyObject(ids);
    json_decref(served);
    tally_sweep(a);
    return out;
}

/* ---- DLQ ---------------------------------------------------------------------------------- */

#define LINE_HEAD 240

/* One DLQ entry (fields id batch line reason worker stream) as a document. */
static json_t *dlq_entry(const redisReply *ent, int show_line) {
    const char *eid = ent->element[0]->str;
    const redisReply *f = ent->element[1];
    json_t *j = json_object();
    json_object_set_new(j, "entry_id", dash_json_str(eid, strlen(eid)));
    json_object_set_new(j, "time_ms", json_integer(strtoll(eid, NULL, 10)));
    static const char *const names[] = {"id", "batch", "reason", "worker", "stream"};
    for (size_t n = 0; n < sizeof names / sizeof *names; n++)
        json_object_set_new(j, names[n], json_null());
    json_object_set_new(j, "custom_id", json_null());
    for (size_t i = 0; i + 1 < f->elements; i += 2) {
        const redisReply *k = f->element[i], *v = f->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
            continue;
        if (!strcmp(k->str, "line")) {
            json_object_set_new(j, "line_bytes", json_integer((json_int_t)v->len));
            if (show_line)
                json_object_set_new(j, "line_head",
                                    dash_json_str(v->str, v->len < LINE_HEAD ? v->len : LINE_HEAD));
            json_t *doc = json_loadb(v->str, v->len, 0, NULL);
            const char *cid = json_string_value(json_object_get(doc, "custom_id"));
            char buf[Q_CUSTOM_ID_MAX];
            if (!cid && !doc) /* too large or broken: the id a worker would answer under */
                cid = q_scan_custom_id(v->str, v->len, buf);
            if (cid)
                json_object_set_new(j, "custom_id", dash_json_str(cid, strlen(cid)));
            json_decref(doc);
            continue;
        }
        for (size_t n = 0; n < sizeof names / sizeof *names; n++)
            if (!strcmp(k->str, names[n]))
                json_object_set_new(j, names[n], dash_json_str(v->str, v->len));
    }
    return j;
}

json_t *dash_api_dlq(dash_api *a, int limit, md_err *e) {
    char pat[Q_KEY_MAX];
    snprintf(pat, sizeof pat, "%sdlq:*", a->prefix);
    json_t *keys = dash_scan(a, pat, e);
    if (!keys)
        return NULL;
    dash_sort_strings(keys);
    json_t *out = json_pack("{s:I}", "now_ms", (json_int_t)md_wall_ms());
    json_t *queues = json_array();
    json_object_set_new(out, "queues", queues);
    char head[Q_KEY_MAX];
    snprintf(head, sizeof head, "%sdlq:", a->prefix);
    size_t i;
    json_t *k;
    json_array_foreach(keys, i, k) {
        const char *key = json_string_value(k);
        size_t mlen;
        const char *model = dash_braced(key, head, &mlen);
        if (!model)
            continue; /* another key under dlq: (none in the protocol) */
        redisReply *len = md_redis_cmd(a->r, e, "XLEN %s", key);
        if (!len) {
            json_decref(keys);
            json_decref(out);
            return NULL;
        }
        if (len->type != REDIS_REPLY_INTEGER) { /* not a stream */
            freeReplyObject(len);
            continue;
        }
        redisReply *r = md_redis_cmd(a->r, e, "XREVRANGE %s + - COUNT %d", key, limit);
        if (!r) {
            freeReplyObject(len);
            json_decref(keys);
            json_decref(out);
            return NULL;
        }
        json_t *q = json_object();
        json_object_set_new(q, "key", dash_json_str(key, strlen(key)));
        json_object_set_new(q, "model", dash_json_str(model, mlen));
        json_object_set_new(q, "length", json_integer(len->integer));
        json_t *ents = json_array();
        for (size_t n = 0; r->type == REDIS_REPLY_ARRAY && n < r->elements; n++) {
            const redisReply *ent = r->element[n];
            if (ent->type == REDIS_REPLY_ARRAY && ent->elements == 2 &&
                ent->element[0]->type == REDIS_REPLY_STRING &&
                ent->element[1]->type == REDIS_REPLY_ARRAY)
                json_array_append_new(ents, dlq_entry(ent, a->dlq_lines));
        }
        json_object_set_new(q, "entries", ents);
        json_array_append_new(queues, q);
        freeReplyObject(len);
        freeReplyObject(r);
    }
    json_decref(keys);
    return out;
}

/* ---- actions ------------------------------------------------------------------------------ */

void dash_api_show_dlq_lines(dash_api *a, int on) {
    a->dlq_lines = on;
}

int dash_api_cancel(dash_api *a, const char *batch, char *status_out, size_t status_sz, md_err *e) {
    md_redis *op = dash_op(a, e);
    if (!op)
        return MD_EREDIS;
    int rc = q_batch_cancel(op, a->prefix, batch, status_out, status_sz, e);
    if (rc || strcmp(status_out, "cancelling"))
        return rc;
    q_batch_info b;
    json_t *served = NULL;
    if ((rc = q_batch_get(a->r, a->prefix, batch, &b, e)) || !(served = dash_served_models(a, e)))
        return rc ? rc : MD_EREDIS;
    int nobody = !json_object_get(served, b.model);
    json_decref(served);
    long long n = 0;
    int budget = dash_cancel_budget, more = 0;
    if (!nobody || (rc = dash_cancel_unserved(a, batch, b.model, &budget, &n, &more, e)))
        return rc;
    if ((rc = q_batch_get(a->r, a->prefix, batch, &b, e)))
        return rc;
    snprintf(status_out, status_sz, "%s", b.status);
    return 0;
}

/* Only while the heartbeat key exists: a drain of a worker that is gone would otherwise
 * create a hash without a TTL that looks like a worker. KEYS[2], P drain:{W}, outlives the
 * process: a worker started again under the same id holds (reads nothing, not ready) until
 * it is deleted (dash_api_undrain; docs/protocol.md §6). */
static const char drain_lua[] =
    "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n"
    "redis.call('HSET', KEYS[1], 'drain', ARGV[1], 'state', 'draining')\n"
    "redis.call('SET', KEYS[2], ARGV[1])\n"
    "return 1\n";

/* P drain:{W}: the hash tag keeps it in the worker's Cluster slot. */
static void drain_key(char *out, const char *prefix, const char *worker) {
    snprintf(out, Q_KEY_MAX, "%sdrain:{%s}", prefix, worker);
}

int dash_api_drain(dash_api *a, const char *worker, md_err *e) {
    char key[Q_KEY_MAX], dkey[Q_KEY_MAX], now[32];
    q_key_worker(key, a->prefix, worker);
    drain_key(dkey, a->prefix, worker);
    snprintf(now, sizeof now, "%lld", (long long)md_wall_ms());
    md_redis *op = dash_op(a, e);
    if (!op)
        return MD_EREDIS;
    redisReply *r = md_redis_cmd(op, e, "EVAL %s 2 %s %s %s", drain_lua, key, dkey, now);
    int rc = dash_reply_error(r, "asking the worker to drain", e);
    if (!rc && (r->type != REDIS_REPLY_INTEGER || r->integer != 1))
        rc = md_errf(e, MD_ENOTFOUND, "no worker %s (no key %s)", worker, key);
    freeReplyObject(r);
    return rc;
}

int dash_api_undrain(dash_api *a, const char *worker, md_err *e) {
    char dkey[Q_KEY_MAX];
    drain_key(dkey, a->prefix, worker);
    md_redis *op = dash_op(a, e);
    if (!op)
        return MD_EREDIS;
    redisReply *r = md_redis_cmd(op, e, "DEL %s", dkey);
    int rc = dash_reply_error(r, "undraining the worker", e);
    if (!rc && (r->type != REDIS_REPLY_INTEGER || r->integer != 1))
        rc = md_errf(e, MD_ENOTFOUND, "worker %s is not drained (no key %s)", worker, dkey);
    freeReplyObject(r);
    return rc;
}
