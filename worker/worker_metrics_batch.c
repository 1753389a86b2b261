/* worker_metrics_batch.c — per-batch gauges of the worker's metrics (docs/operations.md,
 * "Metrics"): medley_batch_progress_ratio and medley_batch_deadline_at_risk for the
 * in-progress batches of the models this worker serves, among the newest BATCHES_SCANNED of
 * P batches. Read from Redis every 5 s by the loop (ZREVRANGE, then HMGET of each meta,
 * pipelined); a batch that ends or leaves the window is hidden, and its room is reused by
 * the next (common/metrics.h), so the series stay bounded by what runs, never by history.
 * Every worker of a model reports its batches: aggregate with max by (batch). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "worker/worker_int.h"

#define BATCHES_SCANNED 100
#define TRACKED_MAX 64 /* batches reported at once */

typedef struct {
    char id[Q_BATCH_ID_MAX];
    md_series *progress, *risk;
    int seen; /* in this scan */
} tracked;

struct wk_batch_mx {
    md_metric *progress, *risk;
    tracked t[TRACKED_MAX];
};

wk_batch_mx *wk_batch_mx_new(md_metrics *reg, md_err *e) {
    wk_batch_mx *b = calloc(1, sizeof *b);
    if (!b) {
        md_errf(e, MD_ENOMEM, "out of memory");
        return NULL;
    }
    const char *bm[] = {"batch", "model"};
    /* clang-format off */
    if (!(b->progress = md_metrics_gauge(reg, "medley_batch_progress_ratio", "Answered lines (completed + failed) over the total of an in-progress batch of a model served here.", 2, bm, TRACKED_MAX, e)) ||
        !(b->risk = md_metrics_gauge(reg, "medley_batch_deadline_at_risk", "1 when an in-progress batch will miss its deadline at its rate so far (or has missed it), else 0.", 2, bm, TRACKED_MAX, e))) {
        free(b);
        return NULL;
    }
    /* clang-format on */
    return b;
}

void wk_batch_mx_free(wk_batch_mx *b) {
    free(b);
}

static int served(const wk *w, const char *model) {
    for (int m = 0; m < WK_MAX_MODELS; m++)
        if (w->mod[m].state != SLOT_FREE && !strcmp(w->mod[m].name, model))
            return 1;
    return 0;
}

static long long num(const redisReply *r) {
    return r && r->type == REDIS_REPLY_STRING ? atoll(r->str) : 0;
}

/* 1 when the batch misses its deadline (ms, 0: none) at the rate since its first answer;
 * with no answer yet, when over half its window is gone. */
int wk_batch_at_risk(long long now, long long created, long long started, long long deadline,
                     long long total, long long done) {
    if (deadline <= 0 || done >= total)
        return 0;
    if (now >= deadline)
        return 1;
    if (done <= 0 || started <= 0 || now <= started)
        return now - created > (deadline - created) / 2;
    double rate = (double)done / (double)(now - started); /* lines per ms */
    return (double)now + (double)(total - done) / rate > (double)deadline;
}

static void report(wk_batch_mx *b, const char *id, const char *model, double progress, int risk) {
    tracked *free_t = NULL;
    for (int i = 0; i < TRACKED_MAX; i++) {
        if (b->t[i].id[0] && !strcmp(b->t[i].id, id)) {
            free_t = &b->t[i];
            break;
        }
        if (!b->t[i].id[0] && !free_t)
            free_t = &b->t[i];
    }
    if (!free_t)
        return; /* TRACKED_MAX batches at once: the rest unreported until one ends */
    if (!free_t->id[0]) {
        snprintf(free_t->id, sizeof free_t->id, "%s", id);
        free_t->progress = md_metric_at2(b->progress, id, model);
        free_t->risk = md_metric_at2(b->risk, id, model);
    }
    free_t->seen = 1;
    md_gauge_set(free_t->progress, progress);
    md_gauge_set(free_t->risk, risk);
}

void wk_batch_mx_tick(wk_batch_mx *b, wk *w) {
    md_err e = {0};
    char key[Q_KEY_MAX];
    q_key_batches(key, w->prefix);
    redisReply *ids = md_redis_cmd(w->r, &e, "ZREVRANGE %s 0 %d", key, BATCHES_SCANNED - 1);
    if (!ids) {
        w->broken = 1;
        return;
    }
    redisContext *c = md_redis_ctx(w->r);
    size_t n = ids->type == REDIS_REPLY_ARRAY ? ids->elements : 0;
    for (size_t i = 0; i < n; i++) {
        q_key_meta(key, w->prefix, ids->element[i]->str ? ids->element[i]->str : "");
        redisAppendCommand(c,
                           "HMGET %s status model total completed failed created_at "
                           "started_at deadline",
                           key);
    }
    for (int i = 0; i < TRACKED_MAX; i++)
        b->t[i].seen = 0;
    long long now = md_wall_ms();
    for (size_t i = 0; i < n; i++) {
        redisReply *r = md_redis_get_reply(w->r, &e);
        if (!r) {
            freeReplyObject(ids);
            w->broken = 1;
            return;
        }
        redisReply **f = r->type == REDIS_REPLY_ARRAY && r->elements == 8 ? r->element : NULL;
        if (f && f[0]->type == REDIS_REPLY_STRING && !strcmp(f[0]->str, "in_progress") &&
            f[1]->type == REDIS_REPLY_STRING && served(w, f[1]->str) && num(f[2]) > 0) {
            long long total = num(f[2]), done = num(f[3]) + num(f[4]);
            report(b, ids->element[i]->str, f[1]->str, (double)done / (double)total,
                   wk_batch_at_risk(now, num(f[5]), num(f[6]), num(f[7]), total, done));
        }
        freeReplyObject(r);
    }
    freeReplyObject(ids);
    for (int i = 0; i < TRACKED_MAX; i++)
        if (b->t[i].id[0] && !b->t[i].seen) { /* ended, or out of the window */
            md_series_hide(b->t[i].progress);
            md_series_hide(b->t[i].risk);
            b->t[i].id[0] = '\0';
        }
}
