/* unserved.c — batches of models no live worker serves (docs/operations.md, "Dashboard"):
 * which models the live workers serve (for the batches' "unserved" warning), and the cancel
 * of such a batch, which would otherwise stay `cancelling` forever (a cancelled batch ends
 * when workers have answered its queued lines; docs/protocol.md §4). Here the dashboard
 * answers them itself, as a worker would: a `batch_cancelled` error line through the
 * completion script (so a worker that reads the same entry meanwhile is deduplicated by
 * P {B}:done: every custom_id still once), then XACK and XDEL of the entry. Reads go through
 * the dashboard's connection, these writes through the operator's (dash_op). The HTTP thread
 * serves every request, so one call reads at most a budget of queue entries and remembers
 * where it stopped in each stream; the cancel request and each later listing of the batches
 * go on from there until the batch's lines are all answered. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "dashboard/api_int.h"
#include "queue/queue.h"
#include "queue/validate.h"

#define RANGE_COUNT 500

const int dash_cancel_budget = 2000;

json_t *dash_served_models(dash_api *a, md_err *e) {
    json_t *fleet = dash_api_fleet(a, e);
    if (!fleet)
        return NULL;
    json_t *served = json_object();
    size_t i, k;
    json_t *w, *m;
    json_array_foreach(json_object_get(fleet, "workers"), i, w) {
        const char *st = json_string_value(json_object_get(w, "state"));
        if (json_is_true(json_object_get(w, "stale")) || !st || strcmp(st, "running"))
            continue; /* draining, drained or silent: serves nothing new */
        json_array_foreach(json_object_get(json_object_get(w, "heartbeat"), "models"), k, m) {
            const char *name = json_string_value(json_object_get(m, "model"));
            if (name)
                json_object_set_new(served, name, json_true());
        }
    }
    json_decref(fleet);
    return served;
}

/* A glob pattern matching key exactly and then anything ("\\"-escaped). */
static void glob_prefix(char *out, size_t cap, const char *key) {
    size_t o = 0;
    for (const char *p = key; *p && o + 3 < cap; p++) {
        if (strchr("*?[]\\", *p))
            out[o++] = '\\';
        out[o++] = *p;
    }
    out[o++] = '*';
    out[o] = '\0';
}

static const redisReply *entry_field(const redisReply *f, const char *name) {
    for (size_t i = 0; f && f->type == REDIS_REPLY_ARRAY && i + 1 < f->elements; i += 2)
        if (f->element[i]->type == REDIS_REPLY_STRING && !strcmp(f->element[i]->str, name))
            return f->element[i + 1];
    return NULL;
}

/* Answer one entry (id, fields) of batch B in stream key. 0, or MD_EREDIS. */
static int answer(dash_api *a, const char *key, const char *id, const redisReply *line,
                  const char *batch, md_err *e) {
    char cidbuf[Q_CUSTOM_ID_MAX], member[Q_CUSTOM_ID_MAX + 48], hex[25], rid[40];
    json_t *req = line ? json_loadb(line->str, line->len, 0, NULL) : NULL;
    const char *cid = json_string_value(json_object_get(req, "custom_id"));
    if (!cid && !req && line)
        cid = q_scan_custom_id(line->str, line->len, cidbuf);
    snprintf(member, sizeof member, cid ? "%s" : "#%s", cid ? cid : id);
    md_random_hex(hex, sizeof hex, 24);
    snprintf(rid, sizeof rid, "batch_req_%s", hex);
    long long now = (long long)md_wall_ms(), waited = now - strtoll(id, NULL, 10);
    json_t *doc = json_pack(
        "{s:s, s:o, s:n, s:{s:s, s:s}, s:{s:s, s:[s], s:I, s:i, s:i, s:i, s:i}}", "id", rid,
        "custom_id", cid ? json_string(cid) : json_null(), "response", "error", "code",
        "batch_cancelled", "message",
        "the batch was cancelled; no worker served its model, so the dashboard answered it",
        "medley", "worker", "dashboard", "device_types", "none", "queue_ms",
        (json_int_t)(waited > 0 ? waited : 0), "prefill_ms", 0, "decode_ms", 0, "cost_usd", 0,
        "attempt", 1);
    json_decref(req);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!text)
        return md_errf(e, MD_ENOMEM, "out of memory");
    char meta[Q_KEY_MAX], done[Q_KEY_MAX], out[Q_KEY_MAX], ev[Q_KEY_MAX], nows[32];
    q_key_meta(meta, a->prefix, batch);
    q_key_done(done, a->prefix, batch);
    q_key_out(out, a->prefix, batch);
    q_key_events(ev, a->prefix);
    snprintf(nows, sizeof nows, "%lld", now);
    md_redis *op = dash_op(a, e);
    if (!op) {
        free(text);
        return MD_EREDIS;
    }
    redisReply *r = md_redis_cmd(op, e, "EVAL %s 3 %s %s %s %s 0 %s %s %s %s", q_complete_lua, meta,
                                 done, out, member, text, nows, ev, batch);
    free(text);
    int rc = dash_reply_error(r, "answering a cancelled line", e);
    freeReplyObject(r);
    if (rc)
        return rc;
    r = md_redis_cmd(op, e, "XACK %s %s %s", key, Q_GROUP, id);
    rc = dash_reply_error(r, "XACK", e);
    freeReplyObject(r);
    if (rc)
        return rc;
    r = md_redis_cmd(op, e, "XDEL %s %s", key, id);
    rc = dash_reply_error(r, "XDEL", e);
    freeReplyObject(r);
    return rc;
}

/* Answer batch B's entries in one stream, reading on from *from (an XRANGE start: "-", or
 * "(<id>" after the last entry read, which it advances) at most *budget entries (which it
 * lowers). 1 when the stream's end was reached, 0 when the budget ran out first, or
 * MD_EREDIS (negative). */
static int answer_stream(dash_api *a, const char *key, const char *batch, char *from, size_t fsz,
                         int *budget, long long *n, md_err *e) {
    while (*budget > 0) {
        int count = *budget < RANGE_COUNT ? *budget : RANGE_COUNT;
        redisReply *r = md_redis_cmd(a->r, e, "XRANGE %s %s + COUNT %d", key, from, count);
        if (dash_reply_error(r, "XRANGE", e)) {
            freeReplyObject(r);
            return MD_EREDIS;
        }
        size_t got = r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
        *budget -= (int)got;
        for (size_t i = 0; i < got; i++) {
            const redisReply *ent = r->element[i];
            if (ent->type != REDIS_REPLY_ARRAY || ent->elements != 2 || !ent->element[0]->str)
                continue;
            const char *id = ent->element[0]->str;
            snprintf(from, fsz, "(%s", id);
            const redisReply *b = entry_field(ent->element[1], "batch");
            if (!b || b->type != REDIS_REPLY_STRING || strcmp(b->str, batch))
                continue;
            int rc = answer(a, key, id, entry_field(ent->element[1], "line"), batch, e);
            if (rc) {
                freeReplyObject(r);
                return rc;
            }
            (*n)++;
        }
        freeReplyObject(r);
        if (got < (size_t)count)
            return 1;
    }
    return 0;
}

int dash_cancel_unserved(dash_api *a, const char *batch, const char *model, int *budget,
                         long long *answered, int *more, md_err *e) {
    *answered = 0;
    *more = 0;
    char key[Q_KEY_MAX], pat[2 * Q_KEY_MAX];
    q_key_queue(key, a->prefix, model);
    glob_prefix(pat, sizeof pat, key); /* P q:{M} and its class streams P q:{M}:<class> */
    json_t *keys = dash_scan(a, pat, e);
    if (!keys)
        return MD_EREDIS;
    if (!a->cancel_from)
        a->cancel_from = json_object();
    json_t *at = json_object_get(a->cancel_from, batch); /* {stream: XRANGE start} */
    if (!at && a->cancel_from && !json_object_set_new(a->cancel_from, batch, json_object()))
        at = json_object_get(a->cancel_from, batch);
    if (!at) {
        json_decref(keys);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    size_t i;
    json_t *k;
    int rc = 0;
    json_array_foreach(keys, i, k) {
        const char *s = json_string_value(k);
        if (strcmp(s, key) && strncmp(s + strlen(key), ":", 1))
            continue; /* P q:{M}x... is another model's */
        char from[64];
        const char *was = json_string_value(json_object_get(at, s));
        snprintf(from, sizeof from, "%s", was ? was : "-");
        int end = answer_stream(a, s, batch, from, sizeof from, budget, answered, e);
        if (end < 0) {
            rc = end;
            break;
        }
        json_object_set_new(at, s, json_string(from));
        *more |= !end;
    }
    json_decref(keys);
    if (!rc && !*more)
        json_object_del(a->cancel_from, batch);
    if (!rc && *answered)
        MD_INFO("dashboard",
                "cancel %s: no worker serves %s, so %lld queued line(s) were answered "
                "batch_cancelled here%s",
                batch, model, *answered, *more ? " (more on the next look)" : "");
    return rc;
}
