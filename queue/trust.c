/* trust.c — see client.h ("Which answers to trust"). Which lines of a batch's output stream
 * P {B}:out answer one of its own queue entries (docs/operations.md, "Threat model: a stolen
 * credential"): a line whose `entry` P {B}:ids holds is trusted at once; the others are kept
 * aside until the stream's end, and then one is kept only when its custom_id is one the
 * batch's submissions queued (P {B}:sent) and no trusted line answered it (a line whose entry
 * a killed submit queued without recording it: docs/protocol.md §5). The rest are forged.
 * `medley results` (client.c) and `medley api`'s output files (api/store.c) both read
 * through this, so they drop the same lines. */
#include <stdlib.h>
#include <string.h>

#include "queue/client.h"
#include "queue/resume.h"

struct q_trust {
    char ids[Q_KEY_MAX], prefix[128], batch[Q_BATCH_ID_MAX];
    int have_ids;       /* 0: a batch submitted before P {B}:ids existed: every line trusted */
    char **cid, **line; /* lines kept aside: custom_id, the line, ok */
    int *ok;
    size_t n, cap;
    q_sent_set seen; /* custom_ids of the trusted lines */
};

int q_trust_new(md_redis *r, const char *prefix, const char *batch, q_trust **out, md_err *e) {
    *out = NULL;
    q_trust *t = calloc(1, sizeof *t);
    if (!t)
        return md_errf(e, MD_ENOMEM, "out of memory");
    q_key_ids(t->ids, prefix, batch);
    snprintf(t->prefix, sizeof t->prefix, "%s", prefix);
    snprintf(t->batch, sizeof t->batch, "%s", batch);
    redisReply *ex = md_redis_cmd(r, e, "EXISTS %s", t->ids);
    if (!ex) {
        free(t);
        return MD_EREDIS;
    }
    t->have_ids = ex->type == REDIS_REPLY_INTEGER && ex->integer == 1;
    freeReplyObject(ex);
    *out = t;
    return 0;
}

void q_trust_free(q_trust *t) {
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++) {
        free(t->cid[i]);
        free(t->line[i]);
    }
    free(t->cid);
    free(t->line);
    free(t->ok);
    q_sent_free(&t->seen);
    free(t);
}

int q_out_entry_parse(const redisReply *en, q_out_entry *o) {
    memset(o, 0, sizeof *o);
    o->ok = 1;
    if (en->type != REDIS_REPLY_ARRAY || en->elements < 2)
        return 0;
    const redisReply *fl = en->element[1];
    for (size_t k = 0; fl->type == REDIS_REPLY_ARRAY && k + 1 < fl->elements; k += 2) {
        const redisReply *f = fl->element[k], *v = fl->element[k + 1];
        if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
            continue;
        if (!strcmp(f->str, "line")) {
            o->line = v->str;
            o->llen = v->len;
        } else if (!strcmp(f->str, "ok")) {
            o->ok = !strcmp(v->str, "1");
        } else if (!strcmp(f->str, "custom_id")) {
            o->cid = v->str;
        } else if (!strcmp(f->str, "entry")) {
            o->entry = v->str;
        }
    }
    return o->line != NULL;
}

/* For each entry of an XRANGE page, 1 when its `entry` field is a queue entry the batch had
 * (SMISMEMBER P {B}:ids), else 0; all 1 when the batch keeps no ids. 0 or MD_EREDIS. */
static int trusted_entries(q_trust *t, md_redis *r, const redisReply *page, char *ok, md_err *e) {
    size_t n = page->elements;
    memset(ok, 1, n);
    if (!t->have_ids || n == 0)
        return 0;
    const char **argv = calloc(n + 2, sizeof *argv);
    size_t *lens = calloc(n + 2, sizeof *lens);
    if (!argv || !lens) {
        free(argv);
        free(lens);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    argv[0] = "SMISMEMBER";
    argv[1] = t->ids;
    for (size_t i = 0; i < n; i++) {
        q_out_entry o;
        q_out_entry_parse(page->element[i], &o);
        argv[2 + i] = o.entry ? o.entry : "";
    }
    for (size_t i = 0; i < n + 2; i++)
        lens[i] = strlen(argv[i]);
    redisReply *rep = md_redis_cmd_argv(r, (int)n + 2, argv, lens, e);
    free(argv);
    free(lens);
    if (!rep)
        return MD_EREDIS;
    int rc = 0;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != n)
        rc = md_errf(e, MD_EREDIS, "SMISMEMBER %s: %s", t->ids,
                     rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    for (size_t i = 0; !rc && i < n; i++)
        ok[i] = rep->element[i]->integer == 1;
    freeReplyObject(rep);
    return rc;
}

static int hold(q_trust *t, const q_out_entry *o) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        char **c = realloc(t->cid, cap * sizeof *c);
        if (c)
            t->cid = c;
        char **l = c ? realloc(t->line, cap * sizeof *l) : NULL;
        if (l)
            t->line = l;
        int *k = l ? realloc(t->ok, cap * sizeof *k) : NULL;
        if (k)
            t->ok = k;
        if (!c || !l || !k)
            return MD_ENOMEM;
        t->cap = cap;
    }
    t->cid[t->n] = strdup(o->cid ? o->cid : "");
    t->line[t->n] = strndup(o->line, o->llen);
    t->ok[t->n] = o->ok;
    t->n++;
    return t->cid[t->n - 1] && t->line[t->n - 1] ? 0 : MD_ENOMEM;
}

int q_trust_page(q_trust *t, md_redis *r, const redisReply *page, char *emit, md_err *e) {
    int rc = trusted_entries(t, r, page, emit, e);
    for (size_t i = 0; !rc && i < page->elements; i++) {
        q_out_entry o;
        if (!q_out_entry_parse(page->element[i], &o)) {
            emit[i] = 0;
            continue;
        }
        if (!emit[i])
            rc = hold(t, &o);
        else if (t->have_ids && o.cid)
            rc = q_sent_add(&t->seen, o.cid);
        if (rc)
            rc = md_errf(e, MD_ENOMEM, "out of memory");
    }
    return rc;
}

int q_trust_finish(q_trust *t, md_redis *r, int (*emit)(void *ctx, const q_out_entry *o), void *ctx,
                   long long *forged, md_err *e) {
    *forged = 0;
    if (!t->n)
        return 0;
    q_sent_set sent = {0};
    int rc = q_sent_load(r, t->prefix, t->batch, &sent, e);
    q_sent_sort(&t->seen);
    for (size_t i = 0; !rc && i < t->n; i++) {
        if (!q_sent_has(&sent, t->cid[i]) || q_sent_has(&t->seen, t->cid[i])) {
            (*forged)++;
            continue;
        }
        q_out_entry o = {
            .line = t->line[i], .llen = strlen(t->line[i]), .ok = t->ok[i], .cid = t->cid[i]};
        if (!(rc = emit(ctx, &o)) && q_sent_add(&t->seen, t->cid[i]))
            rc = md_errf(e, MD_ENOMEM, "out of memory");
        q_sent_sort(&t->seen);
    }
    q_sent_free(&sent);
    return rc;
}
