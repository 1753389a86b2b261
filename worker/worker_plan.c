/* worker_plan.c — model and stream slots, and following the scheduler's plan: the streams a
 * model is read from (its runner is worker_model.c's), draining and closing what the plan
 * moved away, and looking at P plan:version (--follow-plan). It owns wk's mod, st,
 * streams_gen, plan_applied and plan_seen. */
#include "worker/worker_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "queue/online.h"
#include "worker/assign.h"

static int find_model(wk *w, const char *name) {
    for (int m = 0; m < WK_MAX_MODELS; m++)
        if (w->mod[m].state != SLOT_FREE && !strcmp(w->mod[m].name, name))
            return m;
    return -1;
}

/* Start reading a stream of model m (again, when it was draining). The model's online lane
 * P online:{M} is marked online. */
int wk_add_stream(wk *w, int m, const char *key, md_err *e) {
    int s = -1;
    char lane[Q_KEY_MAX];
    q_key_online(lane, w->prefix, w->mod[m].name);
    for (int k = 0; k < MAX_STREAMS; k++)
        if (w->st[k].state != SLOT_FREE && w->st[k].m == m && !strcmp(w->st[k].key, key)) {
            w->st[k].state = SLOT_ON;
            w->st[k].steal = 0;
            return 0;
        }
    for (int k = 0; k < MAX_STREAMS && s < 0; k++)
        if (w->st[k].state == SLOT_FREE)
            s = k;
    if (s < 0)
        return md_errf(e, MD_EINVAL, "more than %d streams", MAX_STREAMS);
    int rc = w->r ? wk_create_group(w, key, e) : 0;
    if (rc == MD_EREDIS)
        return rc;
    if (rc) /* refused (OOM under noeviction): read anyway; NOGROUP makes the loop set up again */
        MD_WARN("worker", "%s; reading %s anyway", e->msg, key);
    w->st[s].state = SLOT_ON;
    w->st[s].steal = 0;
    w->st[s].online = !strcmp(key, lane);
    w->st[s].m = m;
    w->streams_gen++;
    snprintf(w->st[s].key, sizeof w->st[s].key, "%s", key);
    snprintf(w->st[s].cursor, ENTRY_ID_MAX, "0-0");
    return 0;
}

/* Free what draining left behind: streams with no running entry and no unwritten answer,
 * then models with no stream left. */
void wk_reap(wk *w) {
    for (int s = 0; s < MAX_STREAMS; s++) {
        if (w->st[s].state != SLOT_DRAIN)
            continue;
        model *md = &w->mod[w->st[s].m];
        int busy = 0;
        for (int i = 0; i < md->n_jobs && !busy; i++)
            busy = md->jobs[i].used && md->jobs[i].s == s;
        for (int i = 0; i < w->n_ans && !busy; i++)
            busy = w->ans[i].s == s;
        if (!busy) {
            w->st[s].state = SLOT_FREE;
            w->streams_gen++;
        }
    }
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        model *md = &w->mod[m];
        if (md->state != SLOT_DRAIN)
            continue;
        int streams = 0;
        for (int s = 0; s < MAX_STREAMS; s++)
            streams += w->st[s].state != SLOT_FREE && w->st[s].m == m;
        if (streams)
            continue;
        MD_INFO("worker", "model %s drained and closed", md->name);
        wk_runner_close(md->runner);
        free(md->jobs);
        memset(md, 0, sizeof *md);
    }
}

/* Serve what the plan gives this worker: models no longer named drain (their running
 * requests finish and are written; nothing new is read), new ones are opened, and each
 * served model reads P q:{M} plus the class streams of its replicas. */
static void apply_plan(wk *w, const json_t *plan) {
    wk_assign as[WK_ASSIGN_MAX];
    md_err e = {0};
    int n = plan ? wk_plan_assignment(plan, w->me, as, &e) : 0;
    long long version = plan ? q_plan_version(plan) : -1;
    if (n < 0) {
        MD_ERROR("worker", "plan v%lld: %s; keeping what is served", version, e.msg);
        w->plan_applied = version;
        return;
    }
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        model *md = &w->mod[m];
        if (md->state == SLOT_FREE)
            continue;
        int keep = 0;
        for (int a = 0; a < n; a++)
            keep |= !strcmp(as[a].model, md->name);
        if (!keep && md->state == SLOT_ON) {
            MD_INFO("worker", "plan v%lld moves %s away: finishing %d running request(s)", version,
                    md->name, md->runner ? wk_runner_live(md->runner) : 0);
            md->state = SLOT_DRAIN;
        }
        for (int s = 0; s < MAX_STREAMS; s++)
            if (w->st[s].state != SLOT_FREE && w->st[s].m == m)
                w->st[s].state = SLOT_DRAIN; /* re-enabled below when still wanted */
    }
    for (int a = 0; a < n && !w->device_failed; a++) {
        int m = find_model(w, as[a].model);
        const wk_pipe *pipe = &as[a].pipe;
        if (m < 0 && pipe->n_stages > 0) {
            MD_INFO("worker", "plan v%lld: %s as the head of pipeline replica %s (%d stages)",
                    version, as[a].model, pipe->replica, pipe->n_stages);
            if ((m = wk_new_model(w, as[a].model, &e)) < 0) {
                MD_ERROR("worker", "plan v%lld: cannot serve %s: %s", version, as[a].model, e.msg);
                continue;
            }
            wk_shard_start(w, m, pipe, NULL);
        } else if (m < 0) {
            MD_INFO("worker", "plan v%lld: loading %s (replicas %s)", version, as[a].model,
                    as[a].replicas);
            if ((m = wk_add_model(w, as[a].model, &e)) < 0) {
                MD_ERROR("worker", "plan v%lld: cannot serve %s: %s", version, as[a].model, e.msg);
                continue;
            }
        } else if (pipe->n_stages > 0 && !wk_shard_same(w, m, pipe)) {
            MD_INFO("worker", "plan v%lld: %s becomes the head of pipeline replica %s (%d stages)",
                    version, as[a].model, pipe->replica, pipe->n_stages);
            wk_shard_start(w, m, pipe, NULL);
        } else if (pipe->n_stages == 0 && w->mod[m].sh.on) {
            MD_INFO("worker", "plan v%lld: %s runs whole here again", version, as[a].model);
            if (wk_shard_stop(w, m, &e)) {
                MD_ERROR("worker", "plan v%lld: cannot serve %s: %s", version, as[a].model, e.msg);
                w->mod[m].state = SLOT_DRAIN;
                continue;
            }
        }
        model *md = &w->mod[m];
        md->state = SLOT_ON;
        snprintf(md->replicas, sizeof md->replicas, "%s", as[a].replicas);
        char key[Q_KEY_MAX];
        q_key_online(key, w->prefix, md->name);
        int rc = wk_add_stream(w, m, key, &e);
        q_key_queue(key, w->prefix, md->name);
        rc = rc ? rc : wk_add_stream(w, m, key, &e);
        for (int c = 0; c < as[a].n_classes && !rc; c++) {
            q_key_class(key, w->prefix, md->name, as[a].classes[c]);
            rc = wk_add_stream(w, m, key, &e);
        }
        for (int c = 0; c < as[a].n_steal && !rc; c++) {
            q_key_class(key, w->prefix, md->name, as[a].steal[c]);
            rc = wk_add_stream(w, m, key, &e);
            for (int s = 0; s < MAX_STREAMS && !rc; s++)
                if (w->st[s].m == m && !strcmp(w->st[s].key, key))
                    w->st[s].steal = 1;
        }
        if (rc) {
            MD_ERROR("worker", "plan v%lld: %s: %s", version, md->name, e.msg);
            if (e.code == MD_EREDIS)
                w->broken = 1;
        }
    }
    wk_role roles[WK_ROLES_MAX];
    int n_roles = plan ? wk_plan_roles(plan, w->me, roles, &e) : 0;
    if (n_roles < 0) {
        MD_ERROR("worker", "plan v%lld: %s; serving no stage", version, e.msg);
        n_roles = 0;
    }
    wk_roles_apply(w, roles, n_roles);
    w->plan_applied = version;
    wk_metrics_plan(w, plan);
    w->last_hb = 0; /* show the switch in the heartbeat at once */
    int served = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++)
        served += w->mod[m].state == SLOT_ON;
    MD_INFO("worker", "following plan v%lld: %d model(s) and %d stage(s) here", version, served,
            n_roles);
    wk_reap(w);
    wk_take_own(w, 1);
}

/* GET P plan:version into *seen; when it differs from last, GET P plan into *plan (NULL when
 * there is none; the caller decrefs). Returns 1 when it moved and the plan was read, -1 when
 * it moved but the plan could not be parsed (e says why), 0 when it did not move or the
 * connection failed (w->broken set). */
static int plan_moved(wk *w, long long last, long long *seen, json_t **plan, md_err *e) {
    char vkey[Q_KEY_MAX];
    snprintf(vkey, sizeof vkey, "%splan:version", w->prefix);
    redisReply *rep = md_redis_cmd(w->r, e, "GET %s", vkey);
    if (!rep) {
        w->broken = 1;
        return 0;
    }
    *seen = rep->type == REDIS_REPLY_STRING ? atoll(rep->str) : -1;
    freeReplyObject(rep);
    if (*seen == last)
        return 0;
    int rc = q_plan_get(w->r, w->prefix, plan, e);
    if (rc == MD_EREDIS) {
        w->broken = 1;
        return 0;
    }
    return rc ? -1 : 1;
}

/* --follow-plan: look at P plan:version; when it differs from what was applied, read the plan
 * and apply it. A plan:version ahead of the plan document (the scheduler bumps it first) is
 * looked at again next time. */
void wk_check_plan(wk *w) {
    long long seen;
    json_t *plan = NULL;
    md_err e = {0};
    int rc = plan_moved(w, w->plan_seen, &seen, &plan, &e);
    if (rc == 0)
        return;
    if (rc < 0) {
        MD_ERROR("worker", "%s; keeping what is served", e.msg);
        w->plan_seen = seen;
        return;
    }
    long long v = plan ? q_plan_version(plan) : -1;
    if (v != w->plan_applied)
        apply_plan(w, plan);
    if (v >= seen)
        w->plan_seen = seen;
    json_decref(plan);
}

/* --model: the plan may route a served model's lines to class streams P q:{M}:<C> (the
 * submitter's routing, docs/protocol.md §3); a worker serving M reads every one of them,
 * so no line is stranded. Looked at when P plan:version moves; class streams the plan no
 * longer lists drain (what runs finishes, nothing new is read). */
void wk_check_classes(wk *w) {
    long long seen;
    json_t *plan = NULL;
    md_err e = {0};
    int rc = plan_moved(w, w->cls_seen, &seen, &plan, &e);
    if (rc == 0)
        return;
    if (rc < 0) /* submitters ignore a malformed plan too: every line goes to P q:{M} */
        MD_WARN("worker", "%s; reading no class streams", e.msg);
    for (int m = 0; m < WK_MAX_MODELS && !w->broken; m++) {
        model *md = &w->mod[m];
        if (md->state != SLOT_ON)
            continue;
        q_class cls[Q_CLASS_MAX];
        int n = plan ? q_plan_classes(plan, md->name, cls, &e) : 0;
        if (n < 0) {
            MD_WARN("worker", "plan classes of %s: %s; reading no class streams", md->name, e.msg);
            n = 0;
        }
        char base[Q_KEY_MAX];
        q_key_queue(base, w->prefix, md->name);
        for (int s = 0; s < MAX_STREAMS; s++)
            if (w->st[s].state == SLOT_ON && w->st[s].m == m && !w->st[s].online &&
                strcmp(w->st[s].key, base))
                w->st[s].state = SLOT_DRAIN; /* re-enabled below when still listed */
        char names[Q_CLASS_MAX * Q_CLASS_NAME + 1] = "";
        for (int c = 0; c < n; c++) {
            char key[Q_KEY_MAX];
            q_key_class(key, w->prefix, md->name, cls[c].name);
            if ((rc = wk_add_stream(w, m, key, &e))) {
                MD_ERROR("worker", "%s: %s", md->name, e.msg);
                if (e.code == MD_EREDIS)
                    w->broken = 1;
                break;
            }
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", c ? "," : "",
                     cls[c].name);
        }
        if (n)
            MD_INFO("worker", "the plan routes %s's lines to classes %s: reading their streams too",
                    md->name, names);
        else if (w->cls_seen != -2)
            MD_INFO("worker", "the plan defines no class of %s: reading %s only", md->name, base);
    }
    json_decref(plan);
    if (!w->broken) {
        w->cls_seen = seen;
        wk_take_own(w, 1);
    }
}
