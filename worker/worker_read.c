/* worker_read.c — reading and claiming entries: XREADGROUP of new entries for the runners'
 * free slots, XAUTOCLAIM of entries idle past the visibility timeout (a crashed or stuck
 * worker's), and resuming the entries still pending for this consumer name. Each entry is
 * answered at once (not a medley entry, batch cancelled, failed or expired, invalid line),
 * moved to the DLQ past max_attempts, or started on its model's runner (a job: live++). It
 * owns wk.cache (batches' status) and advances the streams' XAUTOCLAIM cursors. */
#include "worker/worker_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

/* XGROUP CREATE from id 0, so entries submitted before any worker existed are delivered. */
int wk_create_group(wk *w, const char *key, md_err *e) {
    redisReply *rep = md_redis_cmd(w->r, e, "XGROUP CREATE %s %s 0 MKSTREAM", key, Q_GROUP);
    if (!rep)
        return MD_EREDIS;
    int rc = 0;
    if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "BUSYGROUP", 9))
        rc = md_errf(e, MD_EREDIS, "XGROUP CREATE %s: %s", key, rep->str);
    freeReplyObject(rep);
    return rc;
}

/* The batch's status and deadline, cached for half a second. NULL on a Redis failure. */
static batch_ent *batch_state(wk *w, const char *batch) {
    uint64_t now = md_mono_ns();
    batch_ent *slot = NULL, *oldest = &w->cache[0];
    for (int i = 0; i < BATCH_CACHE; i++) {
        batch_ent *b = &w->cache[i];
        if (b->id[0] && !strcmp(b->id, batch)) {
            slot = b;
            break;
        }
        if (b->at_ns < oldest->at_ns)
            oldest = b;
    }
    if (slot && now - slot->at_ns < BATCH_CACHE_NS)
        return slot;
    if (!slot)
        slot = oldest;
    char meta[Q_KEY_MAX];
    q_key_meta(meta, w->prefix, batch);
    md_err e = {0};
    redisReply *rep = md_redis_cmd(w->r, &e, "HMGET %s status deadline", meta);
    if (!rep) {
        w->broken = 1;
        return NULL;
    }
    memset(slot, 0, sizeof *slot);
    snprintf(slot->id, sizeof slot->id, "%s", batch);
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 && rep->element[0]->str) {
        slot->exists = 1;
        snprintf(slot->status, sizeof slot->status, "%s", rep->element[0]->str);
        slot->deadline = rep->element[1]->str ? atoll(rep->element[1]->str) : 0;
    }
    slot->at_ns = now;
    freeReplyObject(rep);
    return slot;
}

/* Free runner slots of a stream's model; 0 unless the stream is being read and the model has
 * a runner (a sharded replica not formed has none). */
static int free_slots(wk *w, int s) {
    wk_runner *r = w->mod[w->st[s].m].runner;
    if (w->st[s].state != SLOT_ON || !r)
        return 0;
    return wk_runner_capacity(r) - wk_runner_live(r);
}

/* The entry is ours already: running, or answered and waiting to be written/XACKed. */
static int running(wk *w, int s, const char *id) {
    model *md = &w->mod[w->st[s].m];
    for (int i = 0; i < md->n_jobs; i++)
        if (md->jobs[i].used && md->jobs[i].s == s && !strcmp(md->jobs[i].id, id))
            return 1;
    for (int i = 0; i < w->n_ans; i++)
        if (w->ans[i].s == s && !strcmp(w->ans[i].id, id))
            return 1;
    return 0;
}

static const char *field(redisReply *fields, const char *name, size_t *len) {
    if (!fields || fields->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i + 1 < fields->elements; i += 2)
        if (fields->element[i]->str && !strcmp(fields->element[i]->str, name)) {
            *len = fields->element[i + 1]->len;
            return fields->element[i + 1]->str;
        }
    return NULL;
}

/* Milliseconds the entry waited: now minus the time part of its id. */
static double waited_ms(const char *id) {
    long long t = atoll(id);
    double d = (double)(md_wall_ms() - t);
    return d > 0 ? d : 0;
}

static void ack_only(wk *w, int s, const char *id) {
    md_err e = {0};
    redisReply *rep = md_redis_cmd(w->r, &e, "XACK %s %s %s", w->st[s].key, Q_GROUP, id);
    if (!rep)
        w->broken = 1;
    else
        freeReplyObject(rep);
}

/* One entry: answer it at once (bad input, cancelled/expired batch) or start it. */
static void take(wk *w, int s, const char *id, redisReply *fields, long long attempt) {
    int m = stream_model(w, s);
    model *md = &w->mod[m];
    size_t blen = 0, llen = 0;
    const char *batch = field(fields, "batch", &blen);
    const char *line = field(fields, "line", &llen);
    md_err e = {0};
    if (!batch || !line || q_batch_id_check(batch, &e)) {
        /* Not a medley entry: no batch to answer to. Keep it in the DLQ for a human. */
        char dlq[Q_KEY_MAX];
        q_key_dlq(dlq, w->prefix, md->name);
        redisReply *rep =
            md_redis_cmd(w->r, &e, "XADD %s * id %s reason %s worker %s stream %s", dlq, id,
                         "entry has no valid batch or line field", w->me, w->st[s].key);
        if (!rep) {
            w->broken = 1;
            return;
        }
        freeReplyObject(rep);
        MD_WARN("worker", "entry %s of %s has no valid batch/line field; moved to the DLQ", id,
                w->st[s].key);
        ack_only(w, s, id);
        return;
    }
    batch_ent *b = batch_state(w, batch);
    if (!b)
        return; /* Redis lost: the entry stays pending and is redelivered */
    double qms = waited_ms(id);
    char cidbuf[Q_CUSTOM_ID_MAX];
    q_request req;
    q_verr ve;
    int bad = q_validate(line, llen, &w->cfg->limits, &req, cidbuf, &ve);
    const char *cid = req.custom_id;
    if (!b->exists) {
        MD_WARN("worker", "entry %s names batch %s, which does not exist; dropped", id, batch);
        ack_only(w, s, id);
    } else if (!strcmp(b->status, "cancelling") || !strcmp(b->status, "cancelled")) {
        wk_answer_error(w, s, id, batch, cid, "batch_cancelled", "the batch was cancelled", qms,
                        attempt);
    } else if (!strcmp(b->status, "failed")) {
        wk_answer_error(w, s, id, batch, cid, "batch_failed",
                        "the batch failed before this request "
                        "was run",
                        qms, attempt);
    } else if (b->deadline > 0 && md_wall_ms() > b->deadline) {
        wk_answer_error(w, s, id, batch, cid, "batch_expired",
                        "the batch's completion window ended before this request was run", qms,
                        attempt);
    } else if (bad) {
        wk_answer_invalid(w, s, id, batch, cid, &ve, qms, attempt);
    } else if (req.model && strcmp(req.model, md->name)) {
        snprintf(ve.code, sizeof ve.code, "model_not_found");
        snprintf(ve.param, sizeof ve.param, "body.model");
        snprintf(ve.message, sizeof ve.message,
                 "The model '%s' does not exist or is not this batch's model ('%s').", req.model,
                 md->name);
        ve.status = 404;
        wk_answer_invalid(w, s, id, batch, cid, &ve, qms, attempt);
    } else {
        job *j = NULL;
        for (int i = 0; i < md->n_jobs && !j; i++)
            if (!md->jobs[i].used)
                j = &md->jobs[i];
        if (!j) { /* cannot happen (reads never exceed free slots); left pending if it does */
            MD_ERROR("worker", "no free slot for entry %s; it will be taken over later", id);
            q_request_free(&req);
            return;
        }
        memset(j, 0, sizeof *j);
        j->s = s;
        snprintf(j->id, sizeof j->id, "%s", id);
        snprintf(j->batch, sizeof j->batch, "%s", batch);
        snprintf(j->custom_id, sizeof j->custom_id, "%s", cid);
        j->chat = req.chat;
        j->attempt = attempt;
        j->queue_ms = qms;
        int rc = wk_runner_start(md->runner, &req, j, &e);
        if (rc == 0) {
            j->used = 1;
            w->live++;
        } else if (rc == MD_ERANGE) {
            snprintf(ve.code, sizeof ve.code, "context_length_exceeded");
            snprintf(ve.param, sizeof ve.param, "%s", req.chat ? "messages" : "prompt");
            snprintf(ve.message, sizeof ve.message, "%s", e.msg);
            ve.status = 400;
            wk_answer_invalid(w, s, id, batch, cid, &ve, qms, attempt);
        } else {
            wk_answer_error(w, s, id, batch, cid, "server_error", e.msg, qms, attempt);
        }
    }
    q_request_free(&req);
}

/* Delivery counts of entries (XPENDING id id 1 each, pipelined); 0 when unknown. */
static int delivery_counts(wk *w, int s, redisReply *entries, long long *counts) {
    redisContext *c = md_redis_ctx(w->r);
    int n = 0;
    for (size_t i = 0; i < entries->elements; i++) {
        redisReply *en = entries->element[i];
        if (en->type != REDIS_REPLY_ARRAY || en->elements < 1 || !en->element[0]->str)
            continue;
        redisAppendCommand(c, "XPENDING %s %s %s %s 1", w->st[s].key, Q_GROUP, en->element[0]->str,
                           en->element[0]->str);
        n++;
    }
    md_err e = {0};
    int k = 0;
    for (size_t i = 0; i < entries->elements; i++) {
        redisReply *en = entries->element[i];
        counts[i] = 0;
        if (en->type != REDIS_REPLY_ARRAY || en->elements < 1 || !en->element[0]->str)
            continue;
        redisReply *rep = md_redis_get_reply(w->r, &e);
        k++;
        if (!rep) {
            w->broken = 1;
            return -1;
        }
        if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
            rep->element[0]->type == REDIS_REPLY_ARRAY && rep->element[0]->elements == 4)
            counts[i] = rep->element[0]->element[3]->integer;
        freeReplyObject(rep);
    }
    return k == n ? 0 : -1;
}

/* Entries of one stream (an array of [id, fields]); claimed ones check max_attempts. */
static void take_all(wk *w, int s, redisReply *entries, int claimed) {
    if (!entries || entries->type != REDIS_REPLY_ARRAY || entries->elements == 0)
        return;
    long long *counts = NULL;
    if (claimed) {
        counts = calloc(entries->elements, sizeof *counts);
        if (!counts || delivery_counts(w, s, entries, counts)) {
            free(counts);
            return; /* left pending; taken over again later */
        }
    }
    for (size_t i = 0; i < entries->elements && !w->broken; i++) {
        redisReply *en = entries->element[i];
        if (en->type != REDIS_REPLY_ARRAY || en->elements < 2 || !en->element[0]->str)
            continue;
        const char *id = en->element[0]->str;
        redisReply *fields = en->element[1];
        if (claimed && running(w, s, id))
            continue; /* ours already (a lapsed lease, or a resume after reconnecting) */
        long long attempt = claimed ? (counts[i] > 0 ? counts[i] : 2) : 1;
        if (fields->type != REDIS_REPLY_ARRAY) {
            ack_only(w, s, id); /* deleted from the stream (XDEL/XTRIM): nothing to answer */
            continue;
        }
        if (claimed && attempt > w->cfg->max_attempts) {
            size_t blen = 0, llen = 0;
            const char *batch = field(fields, "batch", &blen);
            const char *line = field(fields, "line", &llen);
            char dlq[Q_KEY_MAX], reason[160];
            q_key_dlq(dlq, w->prefix, w->mod[stream_model(w, s)].name);
            snprintf(reason, sizeof reason,
                     "delivered %lld times without an answer (max_attempts %d)", attempt,
                     w->cfg->max_attempts);
            md_err e = {0};
            const char *argv[] = {"XADD",
                                  dlq,
                                  "*",
                                  "id",
                                  id,
                                  "batch",
                                  batch ? batch : "",
                                  "line",
                                  line ? line : "",
                                  "reason",
                                  reason,
                                  "worker",
                                  w->me,
                                  "stream",
                                  w->st[s].key};
            size_t lens[15];
            for (int k = 0; k < 15; k++)
                lens[k] = strlen(argv[k]);
            if (line)
                lens[8] = llen;
            redisReply *rep = md_redis_cmd_argv(w->r, 15, argv, lens, &e);
            if (!rep) {
                w->broken = 1;
                break;
            }
            freeReplyObject(rep);
            MD_WARN("worker", "entry %s: %s; moved to %s", id, reason, dlq);
            char cidbuf[Q_CUSTOM_ID_MAX];
            q_request req;
            q_verr ve;
            q_validate(line ? line : "", line ? llen : 0, &w->cfg->limits, &req, cidbuf, &ve);
            if (batch && !q_batch_id_check(batch, &e))
                wk_answer_error(w, s, id, batch, req.custom_id, "max_attempts_exceeded", reason,
                                waited_ms(id), attempt);
            else
                ack_only(w, s, id);
            q_request_free(&req);
            continue;
        }
        take(w, s, id, fields, attempt);
    }
    free(counts);
}

/* XREADGROUP over every stream being read whose model has free slots. A model's free slots
 * are shared out over its streams (one COUNT applies to every stream of the command, so it
 * is the smallest share), so a read never returns more entries than the runners take. */
int wk_read_new(wk *w, int block_ms) {
    const char *argv[8 + 2 * MAX_STREAMS];
    int which[MAX_STREAMS], n = 0, count = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        if (w->mod[m].state != SLOT_ON)
            continue;
        int k = 0, first = -1;
        for (int s = 0; s < MAX_STREAMS; s++)
            if (w->st[s].state == SLOT_ON && w->st[s].m == m) {
                k++;
                if (first < 0)
                    first = s;
            }
        if (!k)
            continue;
        int f = free_slots(w, first);
        int share = f / k;
        if (share <= 0) {
            /* Fewer free slots than streams: read one stream, rotating by the clock. */
            if (f <= 0)
                continue;
            int pick = (int)((md_mono_ns() / 1000000u) % (uint64_t)k);
            for (int s = 0; s < MAX_STREAMS; s++)
                if (w->st[s].state == SLOT_ON && w->st[s].m == m && pick-- == 0)
                    which[n++] = s;
            share = 1;
        } else {
            for (int s = 0; s < MAX_STREAMS; s++)
                if (w->st[s].state == SLOT_ON && w->st[s].m == m)
                    which[n++] = s;
        }
        count = count == 0 || share < count ? share : count;
    }
    if (!n) {
        /* Nothing to read (no model, or every slot busy): wait as a blocked read would. */
        for (int t = 0; t < block_ms && !*w->stop; t += 20)
            usleep(20000);
        return 0;
    }
    char cnt[16], blk[16];
    snprintf(cnt, sizeof cnt, "%d", count);
    snprintf(blk, sizeof blk, "%d", block_ms);
    int k = 0;
    argv[k++] = "XREADGROUP";
    argv[k++] = "GROUP";
    argv[k++] = Q_GROUP;
    argv[k++] = w->me;
    argv[k++] = "COUNT";
    argv[k++] = cnt;
    if (block_ms > 0) {
        argv[k++] = "BLOCK";
        argv[k++] = blk;
    }
    argv[k++] = "STREAMS";
    for (int i = 0; i < n; i++)
        argv[k++] = w->st[which[i]].key;
    for (int i = 0; i < n; i++)
        argv[k++] = ">";
    size_t lens[8 + 2 * MAX_STREAMS];
    for (int i = 0; i < k; i++)
        lens[i] = strlen(argv[i]);
    md_err e = {0};
    redisReply *rep = md_redis_cmd_argv(w->r, k, argv, lens, &e);
    if (!rep) {
        w->broken = 1;
        return 0;
    }
    int got = 0;
    if (rep->type == REDIS_REPLY_ERROR) {
        MD_WARN("worker", "XREADGROUP: %s", rep->str);
        if (!strncmp(rep->str, "NOGROUP", 7))
            w->gen = 0; /* the stream or group vanished: set it up again */
    } else if (rep->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < rep->elements; i++) {
            redisReply *st = rep->element[i];
            if (st->type != REDIS_REPLY_ARRAY || st->elements != 2)
                continue;
            int s = -1;
            for (int j = 0; j < n && s < 0; j++)
                if (!strcmp(w->st[which[j]].key, st->element[0]->str))
                    s = which[j];
            if (s < 0)
                continue;
            got += (int)st->element[1]->elements;
            take_all(w, s, st->element[1], 0);
        }
    }
    freeReplyObject(rep);
    return got;
}

/* XAUTOCLAIM entries idle past the visibility timeout (a crashed or stuck worker's), on every
 * stream being read: the plain and the class streams alike. */
void wk_take_over(wk *w) {
    md_err e = {0};
    for (int s = 0; s < MAX_STREAMS && !w->broken; s++) {
        int f = free_slots(w, s);
        if (f <= 0)
            continue;
        redisReply *rep = md_redis_cmd(w->r, &e, "XAUTOCLAIM %s %s %s %d %s COUNT %d", w->st[s].key,
                                       Q_GROUP, w->me, w->cfg->visibility_ms, w->st[s].cursor, f);
        if (!rep) {
            w->broken = 1;
            return;
        }
        if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 2) {
            if (rep->element[0]->str)
                snprintf(w->st[s].cursor, ENTRY_ID_MAX, "%s", rep->element[0]->str);
            redisReply *entries = rep->element[1];
            if (entries->elements)
                MD_INFO("worker", "took over %zu entries of %s idle past %d ms", entries->elements,
                        w->st[s].key, w->cfg->visibility_ms);
            take_all(w, s, entries, 1);
            /* Redis 7 lists entries deleted from the stream: ack them away. */
            if (rep->elements >= 3 && rep->element[2]->type == REDIS_REPLY_ARRAY)
                for (size_t i = 0; i < rep->element[2]->elements && !w->broken; i++)
                    ack_only(w, s, rep->element[2]->element[i]->str);
        } else if (rep->type == REDIS_REPLY_ERROR) {
            MD_WARN("worker", "XAUTOCLAIM %s: %s", w->st[s].key, rep->str);
        }
        freeReplyObject(rep);
    }
}

/* Entries still pending for our own consumer name: a worker restarted with the same --id
 * after a crash resumes them at once instead of waiting out the visibility timeout. */
void wk_take_own(wk *w) {
    if (w->device_failed)
        return; /* stopping: what was handed back is others' now, not to be resumed */
    md_err e = {0};
    for (int s = 0; s < MAX_STREAMS && !w->broken; s++) {
        char start[ENTRY_ID_MAX] = "0";
        for (;;) {
            int f = free_slots(w, s);
            if (f <= 0)
                break;
            redisReply *rep =
                md_redis_cmd(w->r, &e, "XREADGROUP GROUP %s %s COUNT %d STREAMS %s %s", Q_GROUP,
                             w->me, f, w->st[s].key, start);
            if (!rep) {
                w->broken = 1;
                return;
            }
            redisReply *entries = NULL;
            if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
                rep->element[0]->type == REDIS_REPLY_ARRAY && rep->element[0]->elements == 2)
                entries = rep->element[0]->element[1];
            size_t n = entries && entries->type == REDIS_REPLY_ARRAY ? entries->elements : 0;
            if (n) {
                MD_INFO("worker", "resuming %zu entries of %s left pending by a previous %s", n,
                        w->st[s].key, w->me);
                redisReply *last = entries->element[n - 1];
                if (last->type == REDIS_REPLY_ARRAY && last->elements >= 1 && last->element[0]->str)
                    snprintf(start, sizeof start, "%s", last->element[0]->str);
                take_all(w, s, entries, 1);
            }
            freeReplyObject(rep);
            if (!n)
                break;
        }
    }
}
