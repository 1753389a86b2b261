/* fleet.c — see api.h: the workers from their heartbeat hashes, and the plan with what the
 * workers serving each replica measure. */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "dashboard/api.h"
#include "dashboard/api_int.h"
#include "queue/queue.h"

/* The value of field name in an HGETALL reply, or NULL. */
static const redisReply *field(const redisReply *h, const char *name) {
    for (size_t i = 0; i + 1 < h->elements; i += 2)
        if (h->element[i]->type == REDIS_REPLY_STRING && !strcmp(h->element[i]->str, name) &&
            h->element[i + 1]->type == REDIS_REPLY_STRING)
            return h->element[i + 1];
    return NULL;
}

/* A decimal integer field: 1 with *out set, 0 when absent or not a number. */
static int int_field(const redisReply *h, const char *name, long long *out) {
    const redisReply *v = field(h, name);
    if (!v || !v->len)
        return 0;
    char *end;
    long long x = strtoll(v->str, &end, 10);
    if (*end)
        return 0;
    *out = x;
    return 1;
}

/* One worker's document from its hash (HGETALL reply h) and key. */
static json_t *worker_doc(const redisReply *h, const char *key, const char *id, size_t id_len,
                          long long now, int heartbeat_ms) {
    json_t *j = json_object();
    json_object_set_new(j, "id", dash_json_str(id, id_len));
    json_object_set_new(j, "key", dash_json_str(key, strlen(key)));
    json_object_set_new(j, "state", dash_reply_str(field(h, "state")));
    long long v;
    json_object_set_new(j, "drain", int_field(h, "drain", &v) ? json_integer(v) : json_null());
    json_t *hb = NULL;
    const redisReply *doc = field(h, "json");
    if (!doc) {
        json_object_set_new(j, "heartbeat_error", json_string("the hash has no field json"));
    } else {
        json_error_t je;
        hb = json_loadb(doc->str, doc->len, 0, &je);
        if (!json_is_object(hb)) {
            json_object_set_new(j, "heartbeat_error",
                                json_pack("s", hb ? "field json is not a JSON object" : je.text));
            json_decref(hb);
            hb = NULL;
        }
    }
    long long seen = 0;
    int known = int_field(h, "last_seen", &seen);
    if (!known && hb && json_is_integer(json_object_get(hb, "last_seen"))) {
        seen = json_integer_value(json_object_get(hb, "last_seen"));
        known = 1;
    }
    json_object_set_new(j, "last_seen", known ? json_integer(seen) : json_null());
    json_object_set_new(j, "age_ms", known ? json_integer(now - seen) : json_null());
    /* the key lives 3 periods past a heartbeat; one still here and older than that is kept
     * alive by something other than heartbeats (the watchdog while a model loads) */
    json_object_set_new(j, "stale", json_boolean(!known || now - seen > 3LL * heartbeat_ms));
    json_object_set_new(j, "plan_version",
                        int_field(h, "plan_version", &v) ? json_integer(v) : json_null());
    json_t *reps = json_array();
    const redisReply *rs = field(h, "replicas");
    for (size_t i = 0; rs && i < rs->len;) {
        const char *c = memchr(rs->str + i, ',', rs->len - i);
        size_t n = c ? (size_t)(c - (rs->str + i)) : rs->len - i;
        if (n)
            json_array_append_new(reps, dash_json_str(rs->str + i, n));
        i += n + 1;
    }
    json_object_set_new(j, "replicas", reps);
    json_object_set_new(j, "heartbeat", hb ? hb : json_null());
    return j;
}

json_t *dash_api_fleet(dash_api *a, md_err *e) {
    char pat[Q_KEY_MAX], head[Q_KEY_MAX];
    snprintf(pat, sizeof pat, "%sworker:*", a->prefix);
    snprintf(head, sizeof head, "%sworker:", a->prefix);
    json_t *keys = dash_scan(a, pat, e);
    if (!keys)
        return NULL;
    dash_sort_strings(keys);
    size_t n = json_array_size(keys);
    /* one round trip for all the hashes */
    redisContext *ctx = md_redis_ctx(a->r);
    for (size_t i = 0; i < n; i++)
        redisAppendCommand(ctx, "HGETALL %s", json_string_value(json_array_get(keys, i)));
    long long now = (long long)md_wall_ms();
    json_t *out =
        json_pack("{s:I, s:i}", "now_ms", (json_int_t)now, "heartbeat_ms", a->heartbeat_ms);
    json_t *workers = json_array();
    json_object_set_new(out, "workers", workers);
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        redisReply *h = failed ? NULL : md_redis_get_reply(a->r, e);
        if (!h) {
            failed = 1;
            continue;
        }
        const char *key = json_string_value(json_array_get(keys, i));
        size_t id_len;
        const char *id = dash_braced(key, head, &id_len);
        /* an empty reply: expired since the SCAN; an error: not a hash */
        if (id && h->type == REDIS_REPLY_ARRAY && h->elements > 0)
            json_array_append_new(workers, worker_doc(h, key, id, id_len, now, a->heartbeat_ms));
        freeReplyObject(h);
    }
    json_decref(keys);
    if (failed) {
        json_decref(out);
        return NULL;
    }
    return out;
}

/* The replica ids of a plan's replicas, each with the tokens/s of the live workers serving
 * it: a worker's measured tokens/s shared evenly among the replicas it lists (a heartbeat
 * measures the worker, not each replica). */
static json_t *measured(json_t *plan, json_t *fleet) {
    json_t *m = json_object();
    size_t i, k;
    json_t *rep, *w, *rid;
    json_array_foreach(json_object_get(plan, "replicas"), i, rep) {
        const char *id = json_string_value(json_object_get(rep, "id"));
        if (!id)
            continue;
        double tps = 0;
        json_t *names = json_array();
        json_array_foreach(json_object_get(fleet, "workers"), k, w) {
            json_t *reps = json_object_get(w, "replicas");
            if (json_is_true(json_object_get(w, "stale")) || !json_array_size(reps))
                continue;
            size_t r;
            int serves = 0;
            json_array_foreach(reps, r, rid) serves |= !strcmp(json_string_value(rid), id);
            if (!serves)
                continue;
            json_t *hb = json_object_get(w, "heartbeat");
            double wt = json_number_value(json_object_get(hb, "tokens_per_s"));
            if (wt > 0 && wt < 1e12)
                tps += wt / (double)json_array_size(reps);
            json_array_append(names, json_object_get(w, "id"));
        }
        double usd_h = json_number_value(json_object_get(rep, "usd_per_hour"));
        json_object_set_new(
            m, id,
            json_pack("{s:f, s:o, s:o}", "tokens_per_s", tps, "workers", names, "usd_per_mtok",
                      tps > 0 && usd_h > 0 ? json_real(usd_h / (tps * 3600) * 1e6) : json_null()));
    }
    return m;
}

json_t *dash_api_plan(dash_api *a, md_err *e) {
    char key[Q_KEY_MAX], vkey[Q_KEY_MAX];
    snprintf(key, sizeof key, "%splan", a->prefix);
    snprintf(vkey, sizeof vkey, "%splan:version", a->prefix);
    redisReply *ver = md_redis_cmd(a->r, e, "GET %s", vkey);
    if (!ver)
        return NULL;
    redisReply *doc = md_redis_cmd(a->r, e, "GET %s", key);
    if (!doc) {
        freeReplyObject(ver);
        return NULL;
    }
    json_t *out = json_pack("{s:I}", "now_ms", (json_int_t)md_wall_ms());
    char *end = NULL;
    long long v = ver->type == REDIS_REPLY_STRING ? strtoll(ver->str, &end, 10) : 0;
    json_object_set_new(out, "version",
                        end && end != ver->str && !*end ? json_integer(v) : json_null());
    freeReplyObject(ver);
    json_t *plan = NULL;
    if (doc->type == REDIS_REPLY_STRING) {
        json_error_t je;
        plan = json_loadb(doc->str, doc->len, 0, &je);
        if (!json_is_object(plan) || !json_is_array(json_object_get(plan, "replicas"))) {
            json_object_set_new(out, "error",
                                plan ? json_pack("s+", key, " is not a plan: no replicas array")
                                     : json_pack("s++", key, " is not JSON: ", je.text));
            json_decref(plan);
            plan = NULL;
        }
    } else if (doc->type == REDIS_REPLY_ERROR) {
        json_object_set_new(out, "error", json_pack("s++", key, ": ", doc->str));
    }
    freeReplyObject(doc);
    if (plan) {
        json_t *fleet = dash_api_fleet(a, e);
        if (!fleet) {
            json_decref(plan);
            json_decref(out);
            return NULL;
        }
        json_object_set_new(out, "measured", measured(plan, fleet));
        json_decref(fleet);
    } else {
        json_object_set_new(out, "measured", json_object());
    }
    json_object_set_new(out, "plan", plan ? plan : json_null());
    return out;
}
