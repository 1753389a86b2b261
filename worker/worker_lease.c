/* worker_lease.c — holding entries and saying so: renewing the leases of running entries
 * (XCLAIM to ourselves), handing entries back (marked idle past the visibility timeout)
 * when their device failed or the grace period ran out, the step watchdog's view of the
 * streams and its verdict, and the heartbeat key P worker:{W}. It owns wk's failed-device
 * state (device_failed, dev_err, n_handed_back) and tokens_at_hb. */
#include "worker/worker_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

/* XCLAIM our running entries to ourselves (JUSTID: no delivery count bump), resetting their
 * idle time so nobody takes them over; draining streams included. idle_ms > 0 instead marks
 * them idle that long: the hand-back on stop, so another worker takes them over at once. */
void wk_renew(wk *w, long long idle_ms, int handback_only) {
    redisContext *c = md_redis_ctx(w->r);
    int sent = 0;
    for (int s = 0; s < MAX_STREAMS; s++) {
        if (w->st[s].state == SLOT_FREE)
            continue;
        model *md = &w->mod[w->st[s].m];
        int n = 0;
        for (int i = 0; i < md->n_jobs; i++)
            n += md->jobs[i].used && md->jobs[i].s == s && (!handback_only || md->jobs[i].handback);
        if (!n)
            continue;
        const char **argv = malloc((size_t)(n + 8) * sizeof *argv);
        size_t *lens = malloc((size_t)(n + 8) * sizeof *lens);
        if (!argv || !lens) {
            free(argv);
            free(lens);
            return;
        }
        char idle[32];
        snprintf(idle, sizeof idle, "%lld", idle_ms);
        int k = 0;
        argv[k++] = "XCLAIM";
        argv[k++] = w->st[s].key;
        argv[k++] = Q_GROUP;
        argv[k++] = w->me;
        argv[k++] = "0";
        for (int i = 0; i < md->n_jobs; i++)
            if (md->jobs[i].used && md->jobs[i].s == s && (!handback_only || md->jobs[i].handback))
                argv[k++] = md->jobs[i].id;
        if (idle_ms > 0) {
            argv[k++] = "IDLE";
            argv[k++] = idle;
        }
        argv[k++] = "JUSTID";
        for (int i = 0; i < k; i++)
            lens[i] = strlen(argv[i]);
        redisAppendCommandArgv(c, k, argv, lens);
        free(argv);
        free(lens);
        sent++;
    }
    md_err e = {0};
    for (int i = 0; i < sent; i++) {
        redisReply *rep = md_redis_get_reply(w->r, &e);
        if (!rep) {
            w->broken = 1;
            return;
        }
        freeReplyObject(rep);
    }
}

/* An operator's drain (`medley dashboard`, docs/protocol.md §6): the field `drain` of the
 * heartbeat hash and the key P drain:{W}. Found while serving: stop as on SIGTERM (the exit
 * then says "drained", cli/cmd_worker.c). Found at the first heartbeat: the process was
 * started again after a drain (a pod or unit restarted), so hold: read nothing, report
 * "drained" (not ready) until the key is deleted. 0, or -1 with w->broken set. */
static int check_drain(wk *w) {
    if (w->drain_asked)
        return 0;
    if (!w->drain_key[0])
        snprintf(w->drain_key, sizeof w->drain_key, "%sdrain:{%s}", w->prefix, w->me);
    md_err de = {0};
    redisReply *k = md_redis_cmd(w->r, &de, "EXISTS %s", w->drain_key);
    redisReply *d = k ? md_redis_cmd(w->r, &de, "HMGET %s drain", w->wkey) : NULL;
    if (!k || !d) {
        if (k)
            freeReplyObject(k);
        w->broken = 1;
        return -1;
    }
    int key = k->type == REDIS_REPLY_INTEGER && k->integer > 0;
    int field = d->type == REDIS_REPLY_ARRAY && d->elements == 1 &&
                d->element[0]->type == REDIS_REPLY_STRING && d->element[0]->len > 0;
    freeReplyObject(k);
    freeReplyObject(d);
    if (w->drain_hold < 0 && key && !field) {
        w->drain_hold = 1;
        MD_WARN("worker",
                "drained by an operator (%s exists): reading nothing until it is deleted "
                "(docs/operations.md, \"Drain a node\")",
                w->drain_key);
    } else if (w->drain_hold == 1 && !key) {
        w->drain_hold = 0;
        MD_INFO("worker", "undrained (%s deleted): serving", w->drain_key);
    } else if (w->drain_hold != 1 && (key || field)) {
        w->drain_asked = 1;
        MD_INFO("worker", "drain asked through %s: stopping as on SIGTERM",
                field ? w->wkey : w->drain_key);
    }
    if (w->drain_hold < 0)
        w->drain_hold = 0;
    return 0;
}

int wk_heartbeat(wk *w, const char *state, double dt_s) {
    /* A node demoted under us (the Sentinels' announcement lost, or a hand demotion): stop
     * writing to it before the next answer (docs/operations.md, "Redis failover"). */
    md_err re = {0};
    if (md_redis_check_primary(w->r, &re)) {
        MD_WARN("worker", "%s", re.msg);
        w->broken = 1;
        return -1;
    }
    if (check_drain(w))
        return -1;
    if (w->drain_asked)
        state = "draining";
    else if (w->drain_hold == 1)
        state = "drained";
    json_t *models = json_array(), *devices = json_array();
    char replicas[1024] = "";
    size_t used = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        model *md = &w->mod[m];
        if (md->state == SLOT_FREE)
            continue;
        json_t *mj = json_pack("{s:s, s:s, s:i, s:i}", "model", md->name, "runner",
                               md->runner ? wk_runner_kind(md->runner) : "engine", "capacity",
                               md->runner ? wk_runner_capacity(md->runner) : 0, "live",
                               md->runner ? wk_runner_live(md->runner) : 0);
        /* a sharded replica: its stages, and why it reads nothing while it is not formed */
        if (mj && md->sh.on && md->sh.spec[0])
            json_object_set_new(mj, "stages", json_string(md->sh.spec));
        if (mj && md->sh.on && md->sh.why[0])
            json_object_set_new(mj, "not_serving", json_string(md->sh.why));
        json_array_append_new(models, mj);
        if (md->state == SLOT_ON && md->replicas[0] && used < sizeof replicas)
            used += (size_t)snprintf(replicas + used, sizeof replicas - used, "%s%s",
                                     used ? "," : "", md->replicas);
    }
    json_t *stage_servers = json_array();
    for (int k = 0; k < WK_ROLES_MAX; k++) {
        const stage_srv *v = &w->srv[k];
        if (!v->used)
            continue;
        json_array_append_new(stage_servers,
                              json_pack("{s:s, s:s, s:i, s:[i, i], s:s, s:b}", "replica",
                                        v->role.replica, "model", v->role.model, "stage",
                                        v->role.stage, "layers", v->role.lo, v->role.hi, "endpoint",
                                        v->endpoint, "ready", v->ready));
        if (used < sizeof replicas)
            used += (size_t)snprintf(replicas + used, sizeof replicas - used, "%s%s",
                                     used ? "," : "", v->role.replica);
    }
    double tps = dt_s > 0 ? (double)(w->n_tokens - w->tokens_at_hb) / dt_s : 0;
    w->tokens_at_hb = w->n_tokens;
    json_t *dev = json_pack("{s:s, s:I, s:f}", "type", wk_dev_type(w, -1), "memory_bytes",
                            w->gpu_name[0] ? (json_int_t)w->gpu_bytes
                                           : (json_int_t)md_host_memory_bytes(NULL),
                            "tokens_per_s", tps);
    if (dev && w->gpu_name[0]) /* the scheduler recognises the type by the driver's name */
        json_object_set_new(dev, "name", json_string(w->gpu_name));
    json_array_append_new(devices, dev);
    json_t *doc = json_pack(
        "{s:s, s:s, s:I, s:s, s:o, s:o, s:I, s:I, s:I, s:I, s:i, s:f, s:f}", "worker", w->me,
        "host", w->host, "pid", (json_int_t)getpid(), "state", state, "models", models, "devices",
        devices, "started_at", (json_int_t)w->started_ms, "last_seen", (json_int_t)md_wall_ms(),
        "completed", (json_int_t)w->n_ok, "failed", (json_int_t)w->n_failed, "in_flight", w->live,
        "tokens_per_s", tps, "usd_per_hour", w->cfg->usd_per_hour);
    if (doc && json_array_size(stage_servers))
        json_object_set(doc, "stage_servers", stage_servers);
    if (doc) { /* answers waiting to be written, and why when Redis refuses them */
        json_object_set_new(doc, "answers_held", json_integer(w->n_ans));
        if (w->wr.refused)
            json_object_set_new(doc, "answers_refused",
                                json_pack("{s:s, s:I, s:I}", "error", w->wr.error, "since",
                                          (json_int_t)w->wr.since_ms, "refusals",
                                          (json_int_t)w->wr.count));
    }
    json_decref(stage_servers);
    /* `devices` and `state` also as fields of their own: the scheduler reads those two.
     * `plan_version` and `replicas`: what this worker follows (--follow-plan). */
    char *s = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    char *ds = doc ? json_dumps(json_object_get(doc, "devices"), JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!s || !ds) {
        free(s);
        free(ds);
        return -1;
    }
    md_err e = {0};
    redisReply *rep = md_redis_cmd(
        w->r, &e,
        "HSET %s json %s devices %s state %s last_seen %lld plan_version %lld replicas %s", w->wkey,
        s, ds, state, (long long)md_wall_ms(), w->plan_applied, replicas);
    free(s);
    free(ds);
    if (!rep) {
        w->broken = 1;
        return -1;
    }
    freeReplyObject(rep);
    rep = md_redis_cmd(w->r, &e, "PEXPIRE %s %d", w->wkey, 3 * w->cfg->heartbeat_ms);
    if (!rep)
        w->broken = 1;
    else
        freeReplyObject(rep);
    return 0;
}

/* Requests whose device failed go back to the stream marked idle past the visibility
 * timeout (as on stop), so another worker takes them over at once; the takeover counts a
 * delivery, so a request that breaks every device it runs on ends in the DLQ. */
void wk_hand_back(wk *w) {
    int n = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++)
        for (int i = 0; i < w->mod[m].n_jobs; i++)
            n += w->mod[m].jobs[i].used && w->mod[m].jobs[i].handback;
    if (!n)
        return;
    if (!w->broken)
        wk_renew(w, (long long)w->cfg->visibility_ms + 1000, 1);
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        int k = 0;
        for (int i = 0; i < w->mod[m].n_jobs; i++) {
            job *j = &w->mod[m].jobs[i];
            if (j->used && j->handback) {
                j->used = 0;
                j->handback = 0;
                w->live--;
                k++;
            }
        }
        if (k)
            wk_metrics_handed_back(w, m, k);
    }
    w->n_handed_back += n;
    MD_WARN("worker", "handed back %d request(s) of a failed device or stage to the queue", n);
}

/* Tell the watchdog which streams hold this worker's entries, when that changed. */
void wk_watch_streams(wk *w) {
    if (!w->wd || w->wd_gen == w->streams_gen)
        return;
    const char *keys[MAX_STREAMS];
    int n = 0;
    for (int s = 0; s < MAX_STREAMS; s++)
        if (w->st[s].state != SLOT_FREE)
            keys[n++] = w->st[s].key;
    wk_watchdog_set_streams(w->wd, keys, n);
    w->wd_gen = w->streams_gen;
}

/* The watchdog fired while a step ran and has handed back every entry this worker held:
 * forget them (renewing or handing them back again would take them from whoever has them
 * now), retire the watchdog (its work is done) and stop with the device's failure. */
void wk_after_watchdog(wk *w, const char *why) {
    long n = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++)
        for (int i = 0; i < w->mod[m].n_jobs; i++) {
            job *j = &w->mod[m].jobs[i];
            n += j->used;
            j->used = 0;
            j->handback = 0;
        }
    w->live = 0;
    w->n_handed_back += wk_watchdog_handed_back(w->wd);
    wk_watchdog_stop(w->wd);
    w->wd = NULL;
    if (!w->device_failed) {
        w->device_failed = 1;
        md_errf(&w->dev_err, MD_EDEVICE, "%s", why);
    }
    MD_ERROR("worker",
             "what the watchdog gave up on returned (%s); %ld request(s) running were "
             "already handed back",
             why, n);
}
