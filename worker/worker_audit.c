/* worker_audit.c — the ack audit: finding queue entries that were acknowledged without an
 * answer. XACK cannot be limited to the consumer an entry was delivered to (Redis checks the
 * command, not the consumer), so a credential that may XACK may also read entries as a
 * consumer of its own and acknowledge them unanswered: the batch would wait for them for
 * good. Workers XDEL every entry they answer, so an entry still in the stream, already
 * delivered (at or before the group's last-delivered-id) and pending for nobody was
 * acknowledged by someone that is no worker. Seen so at two audits in a row (an honest
 * worker's XACK and XDEL are one round trip apart), it is run again here: the completion
 * script answers each custom_id once, so an entry answered after all is only XDELed.
 * The consumers of the group without a heartbeat (P worker:{C}) are named in the log. */
#include "worker/worker_int.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"

#define AUDIT_PAGE 64 /* entries of the stream's head looked at per audit */

/* The group's last-delivered-id into out; 0, or -1 when unknown. */
static int last_delivered(wk *w, int s, char out[ENTRY_ID_MAX]) {
    md_err e = {0};
    redisReply *rep = md_redis_cmd(w->r, &e, "XINFO GROUPS %s", w->st[s].key);
    if (!rep) {
        w->broken = 1;
        return -1;
    }
    int rc = -1;
    for (size_t i = 0; rep->type == REDIS_REPLY_ARRAY && i < rep->elements && rc; i++) {
        redisReply *g = rep->element[i];
        const char *name = NULL, *last = NULL;
        for (size_t k = 0; g->type == REDIS_REPLY_ARRAY && k + 1 < g->elements; k += 2) {
            const char *f = g->element[k]->str;
            if (f && !strcmp(f, "name"))
                name = g->element[k + 1]->str;
            else if (f && !strcmp(f, "last-delivered-id"))
                last = g->element[k + 1]->str;
        }
        if (name && last && !strcmp(name, Q_GROUP)) {
            snprintf(out, ENTRY_ID_MAX, "%s", last);
            rc = 0;
        }
    }
    freeReplyObject(rep);
    return rc;
}

/* 1 when id is in the XPENDING reply's list. */
static int pending(redisReply *pend, const char *id) {
    for (size_t i = 0; pend->type == REDIS_REPLY_ARRAY && i < pend->elements; i++) {
        redisReply *it = pend->element[i];
        if (it->type == REDIS_REPLY_ARRAY && it->elements >= 1 && it->element[0]->str &&
            !strcmp(it->element[0]->str, id))
            return 1;
    }
    return 0;
}

static int was_suspect(const stream *st, const char *id) {
    for (int i = 0; i < st->n_suspect; i++)
        if (!strcmp(st->suspect[i], id))
            return 1;
    return 0;
}

/* Log the group's consumers that have no heartbeat: who acknowledged without answering. */
static void name_unbound(wk *w, int s, const char *id) {
    md_err e = {0};
    redisReply *rep = md_redis_cmd(w->r, &e, "XINFO CONSUMERS %s %s", w->st[s].key, Q_GROUP);
    if (!rep) {
        w->broken = 1;
        return;
    }
    char names[512] = "";
    size_t used = 0;
    for (size_t i = 0; rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
        redisReply *c = rep->element[i];
        const char *name = NULL;
        for (size_t k = 0; c->type == REDIS_REPLY_ARRAY && k + 1 < c->elements; k += 2)
            if (c->element[k]->str && !strcmp(c->element[k]->str, "name"))
                name = c->element[k + 1]->str;
        if (!name || !strcmp(name, w->me))
            continue;
        char hb[Q_KEY_MAX];
        q_key_worker(hb, w->prefix, name);
        redisReply *ex = md_redis_cmd(w->r, &e, "EXISTS %s", hb);
        if (!ex) {
            w->broken = 1;
            break;
        }
        if (ex->type == REDIS_REPLY_INTEGER && ex->integer == 0 &&
            used + strlen(name) + 3 < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s'%s'", used ? ", " : "",
                                     name);
        freeReplyObject(ex);
    }
    freeReplyObject(rep);
    MD_WARN("worker",
            "entry %s of %s was acknowledged without an answer; running it again (consumers "
            "without a heartbeat: %s)",
            id, w->st[s].key, used ? names : "none");
}

/* One stream: look at the head, take the entries unanswered at two audits in a row. */
static void audit_stream(wk *w, int s) {
    stream *st = &w->st[s];
    char last[ENTRY_ID_MAX];
    if (last_delivered(w, s, last))
        return;
    md_err e = {0};
    redisReply *head = md_redis_cmd(w->r, &e, "XRANGE %s - %s COUNT %d", st->key, last, AUDIT_PAGE);
    if (!head) {
        w->broken = 1;
        return;
    }
    size_t n = head->type == REDIS_REPLY_ARRAY ? head->elements : 0;
    redisReply *pend = NULL;
    if (n > 0) {
        const char *first = head->element[0]->element[0]->str;
        pend = md_redis_cmd(w->r, &e, "XPENDING %s %s %s %s %d", st->key, Q_GROUP, first, last,
                            10 * AUDIT_PAGE);
        if (!pend) {
            w->broken = 1;
            freeReplyObject(head);
            return;
        }
    }
    char next[WK_AUDIT_MAX][ENTRY_ID_MAX];
    int n_next = 0;
    for (size_t i = 0; pend && pend->type == REDIS_REPLY_ARRAY && i < n && !w->broken; i++) {
        redisReply *en = head->element[i];
        if (en->type != REDIS_REPLY_ARRAY || en->elements < 2 || !en->element[0]->str)
            continue;
        const char *id = en->element[0]->str;
        if (pending(pend, id) || wk_holds(w, s, id))
            continue;
        if (was_suspect(st, id) && wk_free_slots(w, s) > 0) {
            name_unbound(w, s, id);
            wk_metrics_unanswered_ack(w, s);
            wk_take_entry(w, s, id, en->element[1], 1);
        } else if (n_next < WK_AUDIT_MAX) {
            snprintf(next[n_next++], ENTRY_ID_MAX, "%s", id);
        }
    }
    memcpy(st->suspect, next, sizeof next);
    st->n_suspect = n_next;
    freeReplyObject(pend);
    freeReplyObject(head);
}

void wk_audit_acks(wk *w) {
    for (int s = 0; s < MAX_STREAMS && !w->broken; s++)
        if (w->st[s].state == SLOT_ON)
            audit_stream(w, s);
}
