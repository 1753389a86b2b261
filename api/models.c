/* models.c — GET /v1/models: the models the fleet serves now, read from the workers'
 * heartbeats (P worker:{W}, field json, schemas/worker-heartbeat.schema.json). A model is
 * listed while some live heartbeat names it. */
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"
#include "queue/queue.h"

/* The models of one heartbeat document into set (an object used as a set). */
static void add_models(json_t *set, const redisReply *doc) {
    if (!doc || doc->type != REDIS_REPLY_STRING)
        return;
    json_t *hb = json_loadb(doc->str, doc->len, 0, NULL);
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(hb, "models"), i, m) {
        const char *name = json_string_value(json_object_get(m, "model"));
        long long created = json_integer_value(json_object_get(hb, "started_at")) / 1000;
        if (name && !json_object_get(set, name))
            json_object_set_new(set, name, json_integer(created));
    }
    json_decref(hb);
}

enum MHD_Result api_models(api_req *q, struct MHD_Connection *c) {
    md_err e = {0};
    md_redis *r = api_redis(q->s, &e);
    if (!r)
        return api_send_redis_error(q, c, &e);
    char pat[Q_KEY_MAX], cursor[32] = "0";
    snprintf(pat, sizeof pat, "%sworker:{*}", q->s->prefix);
    json_t *set = json_object();
    int rounds = 0;
    do {
        redisReply *rep = md_redis_cmd(r, &e, "SCAN %s MATCH %s COUNT 500", cursor, pat);
        if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
            if (rep)
                freeReplyObject(rep);
            json_decref(set);
            return api_send_redis_error(q, c, &e);
        }
        snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
        redisReply *keys = rep->element[1];
        for (size_t i = 0; i < keys->elements; i++) {
            redisReply *doc = md_redis_cmd(r, &e, "HGET %s json", keys->element[i]->str);
            if (!doc)
                break;
            add_models(set, doc);
            freeReplyObject(doc);
        }
        freeReplyObject(rep);
    } while (strcmp(cursor, "0") && ++rounds < 10000);
    json_t *data = json_array();
    const char *name;
    json_t *created;
    json_object_foreach(set, name, created) {
        json_array_append_new(data, json_pack("{s:s, s:s, s:O, s:s}", "id", name, "object", "model",
                                              "created", created, "owned_by", "medley"));
    }
    json_decref(set);
    return api_send_json(q, c, MHD_HTTP_OK,
                         json_pack("{s:s, s:o}", "object", "list", "data", data));
}
