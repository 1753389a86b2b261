/* worker_online.c — the online lane (docs/protocol.md §9) on the worker's side. An entry of
 * P online:{M} is dropped unanswered when its deadline passed or its client went away (the
 * API answered it already), else validated as an online request (q_limits.online) and
 * answered or started as a batch line is (wk_start_request), a start event then going to
 * P reply:{R}. While it runs, the text it has generated is published as delta events, the
 * part of it no stop string can take back (q_online_publishable); every 200 ms the cancel
 * keys of the running ones are looked at and a cancelled one is stopped. Its answer is the
 * done event, written by wk_online_write from wk_flush, before the XACK (the invariant of
 * worker_int.h: a crash before it redelivers the entry and another worker runs it again). */
#include "worker/worker_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "queue/online.h"

#define CANCEL_EVERY_NS 200000000ull

/* The request's stop strings into j->stops for q_online_publishable; n_stops -1 when they do
 * not fit (nothing is then published before the end). */
static void keep_stops(job *j, const q_request *req) {
    size_t at = 0;
    j->n_stops = 0;
    for (int i = 0; i < req->n_stop; i++) {
        size_t n = strlen(req->stop[i]) + 1;
        if (at + n > sizeof j->stops) {
            j->n_stops = -1;
            return;
        }
        memcpy(j->stops + at, req->stop[i], n);
        at += n;
        j->n_stops++;
    }
}

/* P reply:{R} gets `XADD * <fields>` and its TTL renewed: two commands appended to the
 * pipeline (argv[0..n) are the fields, lens their lengths). */
static void append_event(wk *w, const char *reply, int n, const char **fields, const size_t *lens) {
    char key[Q_KEY_MAX], ttl[16];
    q_key_reply(key, w->prefix, reply);
    const char *argv[3 + 8];
    size_t alen[3 + 8];
    argv[0] = "XADD";
    argv[1] = key;
    argv[2] = "*";
    for (int i = 0; i < 3; i++)
        alen[i] = strlen(argv[i]);
    for (int i = 0; i < n && i < 8; i++) {
        argv[3 + i] = fields[i];
        alen[3 + i] = lens[i];
    }
    redisContext *c = md_redis_ctx(w->r);
    redisAppendCommandArgv(c, 3 + n, argv, alen);
    snprintf(ttl, sizeof ttl, "%d", Q_REPLY_TTL_MS);
    redisAppendCommand(c, "PEXPIRE %s %s", key, ttl);
}

/* Read the two replies of an append_event: 1 written, 0 refused (why filled when empty), -1
 * when the connection failed (w->broken set). */
static int event_written(wk *w, char *why, size_t why_sz) {
    md_err e = {0};
    int ok = 1;
    for (int k = 0; k < 2; k++) {
        redisReply *rep = md_redis_get_reply(w->r, &e);
        if (!rep) {
            w->broken = 1;
            return -1;
        }
        if (k == 0 && rep->type == REDIS_REPLY_ERROR) {
            ok = 0;
            if (why && !why[0])
                snprintf(why, why_sz, "%s", rep->str);
        }
        freeReplyObject(rep);
    }
    return ok;
}

void wk_online_take(wk *w, int s, const char *id, const char *reply, const char *line, size_t len,
                    redisReply *fields, long long attempt) {
    size_t dl = 0;
    const char *d = wk_field(fields, "deadline", &dl);
    long long deadline = d ? atoll(d) : 0;
    if (deadline > 0 && md_wall_ms() > deadline) { /* the API has answered it a timeout */
        MD_INFO("worker", "online request %s waited past its deadline; dropped", reply);
        wk_ack_only(w, s, id);
        return;
    }
    char ck[Q_KEY_MAX];
    q_key_cancel(ck, w->prefix, reply);
    md_err e = {0};
    redisReply *rep = md_redis_cmd(w->r, &e, "EXISTS %s", ck);
    if (!rep) {
        w->broken = 1;
        return;
    }
    int gone = rep->type == REDIS_REPLY_INTEGER && rep->integer > 0;
    freeReplyObject(rep);
    if (gone) {
        MD_INFO("worker",
                "online request %s: cancelled before it ran (its client went away, or the API "
                "gave up on it); dropped",
                reply);
        wk_ack_only(w, s, id);
        return;
    }
    w->mod[stream_model(w, s)].online_ns = md_mono_ns(); /* the reserve holds from now */
    q_limits lim = w->cfg->limits;
    lim.online = 1;
    char cidbuf[Q_CUSTOM_ID_MAX];
    q_request req;
    q_verr ve;
    int bad = q_validate(line, len, &lim, &req, cidbuf, &ve);
    model *md = &w->mod[stream_model(w, s)];
    job *j = wk_start_request(w, s, id, reply, &req, bad, &ve, wk_waited_ms(id), attempt);
    if (j) {
        j->online = 1;
        keep_stops(j, &req);
        /* logprobs and tool calls come whole with the answer: a tool call is known only once
         * its text is complete, and logprobs belong to the text they go with */
        j->pieces =
            req.stream && !req.logprobs && req.tool_choice == Q_TOOLS_NONE && j->n_stops >= 0;
        char att[24];
        snprintf(att, sizeof att, "%lld", attempt);
        const char *f[] = {"type", "start", "worker", w->me, "attempt", att};
        size_t fl[6];
        for (int k = 0; k < 6; k++)
            fl[k] = strlen(f[k]);
        append_event(w, reply, 6, f, fl);
        char why[200] = "";
        if (event_written(w, why, sizeof why) == 0)
            MD_WARN("worker", "online request %s: its start event was refused: %s", reply, why);
    }
    wk_runner_release(md->runner, &req);
    q_request_free(&req);
}

void wk_online_publish(wk *w) {
    if (w->broken)
        return;
    int deltas = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++) {
        model *md = &w->mod[m];
        for (int i = 0; i < md->n_jobs && md->runner; i++) {
            job *j = &md->jobs[i];
            if (!j->used || !j->online || !j->pieces || j->handback)
                continue;
            size_t len = 0;
            const char *text = wk_runner_partial(md->runner, j, &len);
            const char *stop[Q_MAX_STOP];
            const char *p = j->stops;
            for (int k = 0; k < j->n_stops && k < Q_MAX_STOP; k++, p += strlen(p) + 1)
                stop[k] = p;
            size_t n = text ? q_online_publishable(text, len, stop, j->n_stops) : 0;
            if (n <= j->sent)
                continue;
            char off[24];
            snprintf(off, sizeof off, "%zu", j->sent);
            const char *f[] = {"type", "delta", "off", off, "text", text + j->sent};
            size_t fl[6] = {4, 5, 3, strlen(off), 4, n - j->sent};
            append_event(w, j->batch, 6, f, fl);
            j->sent = n;
            deltas++;
        }
    }
    char why[200] = "";
    int refused = 0;
    for (int k = 0; k < deltas; k++) {
        int rc = event_written(w, why, sizeof why);
        if (rc < 0)
            return;
        refused += rc == 0;
    }
    if (refused)
        MD_WARN("worker", "%d delta event(s) refused: %s (the answers still come whole)", refused,
                why);
    uint64_t now = md_mono_ns();
    if (now - w->last_cancel_check < CANCEL_EVERY_NS)
        return;
    w->last_cancel_check = now;
    /* EXISTS P cancel:{R} of every running online request, pipelined, in job order */
    redisContext *c = md_redis_ctx(w->r);
    int asks = 0;
    for (int m = 0; m < WK_MAX_MODELS; m++)
        for (int i = 0; i < w->mod[m].n_jobs && w->mod[m].runner; i++) {
            job *j = &w->mod[m].jobs[i];
            if (!j->used || !j->online || j->handback)
                continue;
            char ck[Q_KEY_MAX];
            q_key_cancel(ck, w->prefix, j->batch);
            redisAppendCommand(c, "EXISTS %s", ck);
            asks++;
        }
    md_err e = {0};
    for (int m = 0; m < WK_MAX_MODELS && asks; m++) {
        model *md = &w->mod[m];
        for (int i = 0; i < md->n_jobs && md->runner; i++) {
            job *j = &md->jobs[i];
            if (!j->used || !j->online || j->handback)
                continue;
            redisReply *rep = md_redis_get_reply(w->r, &e);
            if (!rep) {
                w->broken = 1;
                return;
            }
            if (rep->type == REDIS_REPLY_INTEGER && rep->integer > 0 && !j->cancelled) {
                MD_INFO("worker",
                        "online request %s: cancelled (its client went away, or the API gave "
                        "up on it); stopping it",
                        j->batch);
                j->cancelled = 1;
                wk_runner_cancel(md->runner, j);
            }
            freeReplyObject(rep);
        }
    }
}

int wk_online_write(wk *w, int *accepted, char *why, size_t why_sz) {
    int sent = 0;
    for (int i = 0; i < w->n_ans; i++) {
        answer *a = &w->ans[i];
        if (a->scripted || !w->st[a->s].online)
            continue;
        const char *f[] = {"type", "done", "line", a->line};
        size_t fl[4] = {4, 4, 4, strlen(a->line)};
        append_event(w, a->batch, 4, f, fl);
        sent++;
    }
    int refused = 0;
    for (int i = 0; i < w->n_ans && sent > 0; i++) {
        answer *a = &w->ans[i];
        if (a->scripted || !w->st[a->s].online)
            continue;
        sent--;
        int rc = event_written(w, why, why_sz);
        if (rc < 0)
            return -1;
        if (rc == 0) {
            refused++;
            continue;
        }
        a->scripted = 1;
        *accepted = 1;
    }
    return refused;
}
