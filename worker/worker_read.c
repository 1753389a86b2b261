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
#include "queue/online.h"

#define OWN_PAGE 100 /* XPENDING page of wk_take_own */

/* XGROUP CREATE from id 0, so entries submitted before any worker existed are delivered. */
int wk_create_group(wk *w, const char *key, md_err *e) {
    redisReply *rep = md_redis_cmd(w->r, e, "XGROUP CREATE %s %s 0 MKSTREAM", key, Q_GROUP);
    if (!rep)
        return MD_EREDIS;
    int rc = 0;
    if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "BUSYGROUP", 9))
        rc = md_errf(e, MD_EINVAL, "XGROUP CREATE %s refused: %s", key, rep->str);
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
 * a runner (a sharded replica not formed has none). Batch streams leave the model's online
 * reserve free: min(--online-reserve, capacity - 1) slots, less those online requests use,
 * while the model has taken an online request in the last WK_ONLINE_WARM_NS. */
static int free_slots(wk *w, int s) {
    model *md = &w->mod[w->st[s].m];
    wk_runner *r = md->runner;
    if (w->st[s].state != SLOT_ON || !r)
        return 0;
    int cap = wk_runner_capacity(r), f = cap - wk_runner_live(r);
    if (w->st[s].online || !md->online_ns || md_mono_ns() - md->online_ns > WK_ONLINE_WARM_NS)
        return f;
    int keep = w->cfg->online_reserve < cap - 1 ? w->cfg->online_reserve : cap - 1;
    for (int i = 0; i < md->n_jobs && keep > 0; i++)
        keep -= md->jobs[i].used && md->jobs[i].online;
    return keep > 0 ? f - keep : f;
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

const char *wk_field(redisReply *fields, const char *name, size_t *len) {
    if (!fields || fields->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i + 1 < fields->elements; i += 2)
        if (fields->element[i]->str && !strcmp(fields->element[i]->str, name)) {
            *len = fields->element[i + 1]->len;
            return fields->element[i + 1]->str;
        }
    return NULL;
}

double wk_waited_ms(const char *id) {
    long long t = atoll(id);
    double d = (double)(md_wall_ms() - t);
    return d > 0 ? d : 0;
}

/* XACK an entry nobody is to answer, and XDEL it: an entry left in the stream after its XACK
 * would look to the ack audit (worker_audit.c) like one acknowledged without an answer. */
void wk_ack_only(wk *w, int s, const char *id) {
    md_err e = {0};
    redisReply *rep = md_redis_cmd(w->r, &e, "XACK %s %s %s", w->st[s].key, Q_GROUP, id);
    if (rep) {
        freeReplyObject(rep);
        rep = md_redis_cmd(w->r, &e, "XDEL %s %s", w->st[s].key, id);
    }
    if (!rep)
        w->broken = 1;
    else
        freeReplyObject(rep);
}

/* The field naming whom an entry of stream s answers to: its batch, or on an online lane the
 * request its reply goes to. */
static const char *owner_field(const wk *w, int s) {
    return w->st[s].online ? "reply" : "batch";
}

/* 0 when owner (that field's value) can name the keys answered to: a batch id, or a request
 * id on an online lane. */
static int owner_check(const wk *w, int s, const char *owner, md_err *e) {
    if (!w->st[s].online)
        return q_batch_id_check(owner, e);
    return q_online_id_ok(owner) ? 0 : md_errf(e, MD_EINVAL, "bad request id");
}

/* One entry: answer it at once (bad input, cancelled/expired batch) or start it. */
static void take(wk *w, int s, const char *id, redisReply *fields, long long attempt) {
    int m = stream_model(w, s);
    model *md = &w->mod[m];
    size_t blen = 0, llen = 0;
    const char *batch = wk_field(fields, owner_field(w, s), &blen);
    const char *line = wk_field(fields, "line", &llen);
    md_err e = {0};
    if (!batch || !line || owner_check(w, s, batch, &e)) {
        /* Not a medley entry: no batch to answer to. Keep it in the DLQ for a human. */
        char dlq[Q_KEY_MAX];
        q_key_dlq(dlq, w->prefix, md->name);
        redisReply *rep =
            md_redis_cmd(w->r, &e, "XADD %s * id %s reason %s worker %s stream %s", dlq, id,
                         "entry has no valid batch (reply) or line field", w->me, w->st[s].key);
        if (!rep) {
            w->broken = 1;
            return;
        }
        if (rep->type == REDIS_REPLY_ERROR) { /* refused: keep it pending, try again later */
            MD_WARN("worker", "entry %s of %s has no valid batch/line field; XADD %s refused: %s",
                    id, w->st[s].key, dlq, rep->str);
            freeReplyObject(rep);
            return;
        }
        freeReplyObject(rep);
        MD_WARN("worker", "entry %s of %s has no valid batch/line field; moved to the DLQ", id,
                w->st[s].key);
        wk_metrics_dead_letter(w, s);
        wk_ack_only(w, s, id);
        return;
    }
    if (w->st[s].online) {
        wk_online_take(w, s, id, batch, line, llen, fields, attempt);
        return;
    }
    batch_ent *b = batch_state(w, batch);
    if (!b)
        return; /* Redis lost: the entry stays pending and is redelivered */
    double qms = wk_waited_ms(id);
    char cidbuf[Q_CUSTOM_ID_MAX];
    q_request req;
    q_verr ve;
    int bad = q_validate(line, llen, &w->cfg->limits, &req, cidbuf, &ve);
    const char *cid = req.custom_id;
    if (!b->exists) {
        MD_WARN("worker", "entry %s names batch %s, which does not exist; dropped", id, batch);
        wk_ack_only(w, s, id);
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
    } else {
        wk_start_request(w, s, id, batch, &req, bad, &ve, qms, attempt);
    }
    wk_runner_release(md->runner, &req);
    q_request_free(&req);
}

job *wk_start_request(wk *w, int s, const char *id, const char *batch, q_request *req, int bad,
                      q_verr *ve, double qms, long long attempt) {
    model *md = &w->mod[stream_model(w, s)];
    const char *cid = req->custom_id;
    md_err e = {0};
    if (bad) {
        wk_answer_invalid(w, s, id, batch, cid, ve, qms, attempt);
    } else if (req->model && strcmp(req->model, md->name)) {
        snprintf(ve->code, sizeof ve->code, "model_not_found");
        snprintf(ve->param, sizeof ve->param, "body.model");
        snprintf(ve->message, sizeof ve->message,
                 "The model '%s' does not exist or is not this batch's model ('%s').", req->model,
                 md->name);
        ve->status = 404;
        wk_answer_invalid(w, s, id, batch, cid, ve, qms, attempt);
    } else if (wk_runner_prepare(md->runner, req, ve)) { /* the constraint compiled */
        wk_answer_invalid(w, s, id, batch, cid, ve, qms, attempt);
    } else {
        job *j = NULL;
        for (int i = 0; i < md->n_jobs && !j; i++)
            if (!md->jobs[i].used)
                j = &md->jobs[i];
        if (!j) { /* cannot happen (reads never exceed free slots); left pending if it does */
            MD_ERROR("worker", "no free slot for entry %s; it will be taken over later", id);
            return NULL;
        }
        memset(j, 0, sizeof *j);
        j->s = s;
        snprintf(j->id, sizeof j->id, "%s", id);
        snprintf(j->batch, sizeof j->batch, "%s", batch);
        snprintf(j->custom_id, sizeof j->custom_id, "%s", cid ? cid : "");
        j->chat = req->chat;
        j->attempt = attempt;
        j->queue_ms = qms;
        int rc = wk_runner_start(md->runner, req, j, &e);
        if (rc == 0) {
            j->used = 1;
            w->live++;
            wk_metrics_started(w, s, qms);
            return j;
        } else if (rc == MD_ERANGE || (req->embed && rc == MD_EINVAL)) {
            snprintf(ve->code, sizeof ve->code, "%s",
                     rc == MD_ERANGE ? "context_length_exceeded" : "invalid_value");
            snprintf(ve->param, sizeof ve->param, "%s",
                     req->embed  ? "body.input"
                     : req->chat ? "messages"
                                 : "prompt");
            snprintf(ve->message, sizeof ve->message, "%s", e.msg);
            ve->status = 400;
            wk_answer_invalid(w, s, id, batch, cid, ve, qms, attempt);
        } else {
            wk_answer_error(w, s, id, batch, cid, "server_error", e.msg, qms, attempt);
        }
    }
    return NULL;
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

/* Move an entry delivered more than max_attempts times to the DLQ and answer it
 * max_attempts_exceeded (or only XACK it when it names no valid batch). */
static void dead_letter(wk *w, int s, const char *id, redisReply *fields, long long attempt) {
    size_t blen = 0, llen = 0;
    const char *batch = wk_field(fields, owner_field(w, s), &blen);
    const char *line = wk_field(fields, "line", &llen);
    char dlq[Q_KEY_MAX], reason[160];
    q_key_dlq(dlq, w->prefix, w->mod[stream_model(w, s)].name);
    snprintf(reason, sizeof reason, "delivered %lld times without an answer (max_attempts %d)",
             attempt, w->cfg->max_attempts);
    md_err e = {0};
    const char *argv[] = {
        "XADD",           dlq,      "*",    "id",     id,    "batch",  batch ? batch : "", "line",
        line ? line : "", "reason", reason, "worker", w->me, "stream", w->st[s].key};
    size_t lens[15];
    for (int k = 0; k < 15; k++)
        lens[k] = strlen(argv[k]);
    if (line)
        lens[8] = llen;
    redisReply *rep = md_redis_cmd_argv(w->r, 15, argv, lens, &e);
    if (!rep) {
        w->broken = 1;
        return;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        /* Refused (OOM under noeviction): no dead letter, so no answer either. The entry
         * stays pending under this worker and comes back at the next takeover. */
        MD_WARN("worker", "entry %s: %s, but XADD %s was refused: %s; left pending", id, reason,
                dlq, rep->str);
        freeReplyObject(rep);
        return;
    }
    freeReplyObject(rep);
    MD_WARN("worker", "entry %s: %s; moved to %s", id, reason, dlq);
    wk_metrics_dead_letter(w, s);
    char cidbuf[Q_CUSTOM_ID_MAX];
    q_request req;
    q_verr ve;
    q_validate(line ? line : "", line ? llen : 0, &w->cfg->limits, &req, cidbuf, &ve);
    if (batch && !owner_check(w, s, batch, &e))
        wk_answer_error(w, s, id, batch, req.custom_id, "max_attempts_exceeded", reason,
                        wk_waited_ms(id), attempt);
    else
        wk_ack_only(w, s, id);
    q_request_free(&req);
}

/* One entry read again (taken over, or resumed): its fields are NULL or not an array when it
 * was deleted from the stream (nothing to answer: XACK it); past max_attempts it goes to the
 * DLQ; otherwise it is taken as a new one. */
static void take_again(wk *w, int s, const char *id, redisReply *fields, long long attempt) {
    if (!fields || fields->type != REDIS_REPLY_ARRAY)
        wk_ack_only(w, s, id); /* deleted from the stream (XDEL/XTRIM): nothing to answer */
    else if (attempt > w->cfg->max_attempts)
        dead_letter(w, s, id, fields, attempt);
    else
        take(w, s, id, fields, attempt);
}

void wk_take_entry(wk *w, int s, const char *id, redisReply *fields, long long attempt) {
    take(w, s, id, fields, attempt);
}

int wk_free_slots(wk *w, int s) {
    return free_slots(w, s);
}

int wk_holds(wk *w, int s, const char *id) {
    return running(w, s, id);
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
        if (!claimed) {
            take(w, s, id, en->element[1], 1);
            continue;
        }
        if (running(w, s, id))
            continue; /* ours already (a lapsed lease) */
        take_again(w, s, id, en->element[1], counts[i] > 0 ? counts[i] : 2);
    }
    free(counts);
}

/* Stream s is read now for model m: on, and when it is a steal stream (a class the plan
 * routes to other replicas), only after a read that gave nothing (issue 39 item 11). */
static int reading(const wk *w, int s, int m) {
    return w->st[s].state == SLOT_ON && w->st[s].m == m && (!w->st[s].steal || w->idle);
}

/* XREADGROUP GROUP workers <me> COUNT count [BLOCK block_ms] STREAMS <which[0..n)> > ...,
 * and take what it returns. Returns how many entries were read. */
static int read_streams(wk *w, const int *which, int n, int count, int block_ms) {
    const char *argv[8 + 2 * MAX_STREAMS];
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

/* The online lanes first, without blocking: every online lane whose model has a free slot
 * (its batch streams leave the online reserve free), as many as the fullest model takes. */
static int read_online(wk *w) {
    int which[MAX_STREAMS], n = 0, count = 0;
    for (int s = 0; s < MAX_STREAMS; s++) {
        if (!w->st[s].online || w->st[s].state != SLOT_ON || w->mod[w->st[s].m].state != SLOT_ON)
            continue;
        int f = free_slots(w, s);
        if (f <= 0)
            continue;
        which[n++] = s;
        count = count == 0 || f < count ? f : count;
    }
    return n ? read_streams(w, which, n, count, 0) : 0;
}

/* XREADGROUP over every stream being read whose model has free slots. A model's free slots
 * are shared out over its streams (one COUNT applies to every stream of the command, so it
 * is the smallest share), so a read never returns more entries than the runners take. The
 * online lanes are read first (read_online) when the read does not block; a blocking read
 * (nothing runs) holds them too, so an online request wakes an idle worker at once. */
int wk_read_new(wk *w, int block_ms) {
    int which[MAX_STREAMS], n = 0, count = 0;
    int got = block_ms > 0 ? 0 : read_online(w);
    if (w->broken)
        return got;
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        if (w->mod[m].state != SLOT_ON)
            continue;
        int k = 0, f = -1;
        for (int s = 0; s < MAX_STREAMS; s++)
            if (reading(w, s, m)) {
                k++;
                int fs = free_slots(w, s);
                f = f < 0 || fs < f ? fs : f; /* a batch stream's: the reserve left free */
            }
        if (!k)
            continue;
        int share = f / k;
        if (share <= 0) {
            /* Fewer free slots than streams: read one stream, rotating by the clock. */
            if (f <= 0)
                continue;
            int pick = (int)((md_mono_ns() / 1000000u) % (uint64_t)k);
            for (int s = 0; s < MAX_STREAMS; s++)
                if (reading(w, s, m) && pick-- == 0)
                    which[n++] = s;
            share = 1;
        } else {
            for (int s = 0; s < MAX_STREAMS; s++)
                if (reading(w, s, m))
                    which[n++] = s;
        }
        count = count == 0 || share < count ? share : count;
    }
    if (!n) {
        /* Nothing to read (no model, or every slot busy): wait as a blocked read would. */
        for (int t = 0; t < block_ms && !*w->stop; t += 20)
            usleep(20000);
        w->idle = got == 0;
        return got;
    }
    got += read_streams(w, which, n, count, got ? 0 : block_ms);
    w->idle = got == 0;
    return got;
}

/* XAUTOCLAIM entries idle past the visibility timeout (a crashed or stuck worker's), on every
 * stream being read: the plain and the class streams alike. due: the periodic look at every
 * stream; otherwise only streams flagged claim_more are looked at: those where the last
 * look claimed as many as it asked for or did not finish its scan of the pending list, and
 * those that had no free slot at the periodic look. The loop calls this before each read,
 * so a dead worker's entries take the slots that free up before any new entry does, and
 * come back in full as fast as the workers' capacity allows. */
void wk_take_over(wk *w, int due) {
    md_err e = {0};
    for (int s = 0; s < MAX_STREAMS && !w->broken; s++) {
        stream *st = &w->st[s];
        if (st->state != SLOT_ON || (!due && !st->claim_more))
            continue;
        int f = free_slots(w, s);
        if (f <= 0) {
            st->claim_more |= due; /* look as soon as a slot frees */
            continue;
        }
        redisReply *rep = md_redis_cmd(w->r, &e, "XAUTOCLAIM %s %s %s %d %s COUNT %d", st->key,
                                       Q_GROUP, w->me, w->cfg->visibility_ms, st->cursor, f);
        if (!rep) {
            w->broken = 1;
            return;
        }
        st->claim_more = 0;
        if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 2) {
            if (rep->element[0]->str)
                snprintf(st->cursor, ENTRY_ID_MAX, "%s", rep->element[0]->str);
            redisReply *entries = rep->element[1];
            size_t n = entries->type == REDIS_REPLY_ARRAY ? entries->elements : 0;
            size_t gone = rep->elements >= 3 && rep->element[2]->type == REDIS_REPLY_ARRAY
                              ? rep->element[2]->elements
                              : 0;
            st->claim_more = n + gone >= (size_t)f || strcmp(st->cursor, "0-0") != 0;
            if (n) {
                MD_INFO("worker", "took over %zu entries of %s idle past %d ms", n, st->key,
                        w->cfg->visibility_ms);
                wk_metrics_taken_over(w, s, (long)n);
            }
            take_all(w, s, entries, 1);
            /* Redis 7 lists entries deleted from the stream: ack them away. */
            for (size_t i = 0; i < gone && !w->broken; i++)
                wk_ack_only(w, s, rep->element[2]->element[i]->str);
        } else if (rep->type == REDIS_REPLY_ERROR) {
            MD_WARN("worker", "XAUTOCLAIM %s: %s", st->key, rep->str);
        }
        freeReplyObject(rep);
    }
}

/* Up to max entries pending for this consumer that it does not hold (not running, no
 * answer queued), from XPENDING after *start (exclusive; "-" at first, advanced here): ids
 * and delivery counts into ids/counts. Returns how many, 0 when the list is exhausted
 * (*more = 0), -1 on a lost connection. */
static int own_pending(wk *w, int s, char *start, int max, char ids[][ENTRY_ID_MAX],
                       long long *counts, int *more) {
    md_err e = {0};
    redisReply *rep = md_redis_cmd(w->r, &e, "XPENDING %s %s %s + %d %s", w->st[s].key, Q_GROUP,
                                   start, OWN_PAGE, w->me);
    if (!rep) {
        w->broken = 1;
        return -1;
    }
    int n = 0;
    *more = 0;
    if (rep->type == REDIS_REPLY_ARRAY) {
        *more = rep->elements == OWN_PAGE;
        for (size_t i = 0; i < rep->elements; i++) {
            redisReply *it = rep->element[i];
            if (it->type != REDIS_REPLY_ARRAY || it->elements < 4 || !it->element[0]->str)
                continue;
            const char *id = it->element[0]->str;
            snprintf(start, ENTRY_ID_MAX + 1, "(%s", id);
            if (running(w, s, id))
                continue;
            if (n == max) {
                *more = 1;
                snprintf(start, ENTRY_ID_MAX + 1, "(%s", ids[n - 1]);
                break;
            }
            snprintf(ids[n], ENTRY_ID_MAX, "%s", id);
            counts[n++] = it->element[3]->integer;
        }
    } else if (rep->type == REDIS_REPLY_ERROR) {
        MD_WARN("worker", "XPENDING %s: %s", w->st[s].key, rep->str);
    }
    freeReplyObject(rep);
    return n;
}

/* Entries pending for this consumer name that this process does not hold. counted = 1
 * after a crash (a worker restarted under the same --id) or a hand-back (a sharded replica
 * re-formed): the entries are XCLAIMed with their delivery count raised by one, since that
 * delivery ended without an answer. counted = 0 after a reconnect: a read whose reply was
 * lost with the connection delivered them to this process, and their count says so already;
 * they are read with XRANGE, which leaves the count alone. Entries this process runs or has
 * answered are left as they are (their leases are renewed as usual). */
void wk_take_own(wk *w, int counted) {
    if (w->device_failed)
        return; /* stopping: what was handed back is others' now, not to be resumed */
    md_err e = {0};
    char ids[OWN_PAGE][ENTRY_ID_MAX];
    long long counts[OWN_PAGE];
    for (int s = 0; s < MAX_STREAMS && !w->broken; s++) {
        char start[ENTRY_ID_MAX + 1] = "-";
        long resumed = 0;
        int more = 1;
        while (more && !w->broken) {
            int f = free_slots(w, s);
            if (f <= 0)
                break;
            int n = own_pending(w, s, start, f < OWN_PAGE ? f : OWN_PAGE, ids, counts, &more);
            if (n <= 0)
                continue; /* a page of entries all held, or none (more = 0), or lost */
            redisContext *c = md_redis_ctx(w->r);
            if (counted) {
                const char *argv[OWN_PAGE + 8];
                size_t lens[OWN_PAGE + 8];
                int k = 0;
                argv[k++] = "XCLAIM";
                argv[k++] = w->st[s].key;
                argv[k++] = Q_GROUP;
                argv[k++] = w->me;
                argv[k++] = "0";
                for (int i = 0; i < n; i++)
                    argv[k++] = ids[i];
                for (int i = 0; i < k; i++)
                    lens[i] = strlen(argv[i]);
                redisReply *rep = md_redis_cmd_argv(w->r, k, argv, lens, &e);
                if (!rep) {
                    w->broken = 1;
                    break;
                }
                /* XCLAIM returns the entries still in the stream, each counted once more;
                 * the deleted ones are dropped from the pending list by Redis 7 (XACK them
                 * anyway for Redis 6.2, where they stay). */
                for (int i = 0; i < n && !w->broken; i++) {
                    redisReply *fields = NULL;
                    if (rep->type == REDIS_REPLY_ARRAY)
                        for (size_t j = 0; j < rep->elements; j++) {
                            redisReply *en = rep->element[j];
                            if (en->type == REDIS_REPLY_ARRAY && en->elements >= 2 &&
                                en->element[0]->str && !strcmp(en->element[0]->str, ids[i]))
                                fields = en->element[1];
                        }
                    take_again(w, s, ids[i], fields, counts[i] + 1);
                }
                freeReplyObject(rep);
            } else {
                for (int i = 0; i < n; i++)
                    redisAppendCommand(c, "XRANGE %s %s %s", w->st[s].key, ids[i], ids[i]);
                redisReply *reps[OWN_PAGE];
                int got = 0;
                for (; got < n; got++)
                    if (!(reps[got] = md_redis_get_reply(w->r, &e))) {
                        w->broken = 1;
                        break;
                    }
                for (int i = 0; i < got && !w->broken; i++) {
                    redisReply *r = reps[i], *fields = NULL;
                    if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
                        r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements >= 2)
                        fields = r->element[0]->element[1];
                    take_again(w, s, ids[i], fields, counts[i] > 0 ? counts[i] : 1);
                }
                for (int i = 0; i < got; i++)
                    freeReplyObject(reps[i]);
            }
            resumed += n;
        }
        if (resumed)
            MD_INFO("worker", "resuming %ld entries of %s %s", resumed, w->st[s].key,
                    counted ? "left pending for this worker's name (a crash or a hand-back)"
                            : "delivered by a read whose reply the lost connection took");
    }
}
