/* redis_watch.c — see redis_watch.h. A failover is announced by the Sentinels on their
 * +promoted-slave channel the moment the chosen replica is a primary, and on +switch-master
 * ("<master> <old ip> <old port> <new ip> <new port>") once its replicas follow it (seconds
 * later with several replicas). Waiting for the old primary to refuse a write is not enough:
 * after a SENTINEL FAILOVER it accepts writes (which the new primary never sees) until a
 * Sentinel reconfigures it, up to ~10 s later. So each sentinel:// connection keeps one
 * subscriber per Sentinel (a thread with its own hiredis context, polled every 200 ms for
 * a stop), and redis.c drops its connection as soon as the announced primary is not the one
 * it talks to. */
#include "common/redis_watch.h"

#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

struct md_sentinel_watch;

typedef struct {
    struct md_sentinel_watch *w;
    md_redis_addr at;
    pthread_t tid;
    int started;
} watcher;

struct md_sentinel_watch {
    md_redis_url url;
    pthread_mutex_t mu;
    unsigned seq; /* switches announced (guarded by mu) */
    char addr[300];
    volatile int stop;
    int n;
    watcher ws[MD_REDIS_MAX_SENTINELS];
};

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Connect to one Sentinel, AUTH with the sentinel credentials, SUBSCRIBE +switch-master.
 * NULL when any step fails. */
static redisContext *sentinel_subscribe(const md_redis_url *u, const md_redis_addr *s) {
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout(s->host, s->port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    redisReply *r = NULL;
    if (u->sentinel_pass[0]) {
        r = u->sentinel_user[0] ? redisCommand(c, "AUTH %s %s", u->sentinel_user, u->sentinel_pass)
                                : redisCommand(c, "AUTH %s", u->sentinel_pass);
        int ok = r && r->type != REDIS_REPLY_ERROR;
        if (r)
            freeReplyObject(r);
        if (!ok) {
            redisFree(c);
            return NULL;
        }
    }
    r = redisCommand(c, "SUBSCRIBE +switch-master +promoted-slave");
    int ok = r && r->type == REDIS_REPLY_ARRAY;
    if (r)
        freeReplyObject(r);
    redisReply *second = NULL; /* the confirmation of the second channel */
    if (ok && redisGetReply(c, (void **)&second) != REDIS_OK)
        ok = 0;
    if (second)
        freeReplyObject(second);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* A pub/sub message: ["message", "+switch-master", "<master> <oip> <oport> <nip> <nport>"]
 * at the end of a failover, or, earlier, ["message", "+promoted-slave", "slave <name> <ip>
 * <port> @ <master> <mip> <mport>"] as soon as the chosen replica is a primary: from then on
 * a write to the old one may be lost. */
static void on_message(struct md_sentinel_watch *w, redisReply *r) {
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 || !r->element[1]->str ||
        !r->element[2]->str)
        return;
    char name[128], oip[256], nip[256], kind[16], inst[300];
    int oport = 0, nport = 0;
    if (!strcmp(r->element[1]->str, "+promoted-slave")) {
        if (sscanf(r->element[2]->str, "%15s %299s %255s %d @ %127s %255s %d", kind, inst, nip,
                   &nport, name, oip, &oport) != 7 ||
            strcmp(name, w->url.master))
            return;
    } else if (sscanf(r->element[2]->str, "%127s %255s %d %255s %d", name, oip, &oport, nip,
                      &nport) != 5 ||
               strcmp(name, w->url.master)) {
        return;
    }
    pthread_mutex_lock(&w->mu);
    char now[300];
    snprintf(now, sizeof now, "%s:%d", nip, nport);
    if (strcmp(now, w->addr)) { /* every Sentinel announces it: count it once */
        snprintf(w->addr, sizeof w->addr, "%s", now);
        w->seq++;
    }
    pthread_mutex_unlock(&w->mu);
}

/* Read what arrived on c without blocking past 200 ms; -1 when the connection failed. */
static int pump(struct md_sentinel_watch *w, redisContext *c) {
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int n = poll(&p, 1, 200);
    if (n <= 0)
        return n < 0 ? -1 : 0;
    if (redisBufferRead(c) != REDIS_OK)
        return -1;
    for (;;) {
        void *reply = NULL;
        if (redisGetReplyFromReader(c, &reply) != REDIS_OK)
            return -1;
        if (!reply)
            return 0;
        on_message(w, reply);
        freeReplyObject(reply);
    }
}

static void *watch_one(void *arg) {
    watcher *me = arg;
    struct md_sentinel_watch *w = me->w;
    while (!w->stop) {
        redisContext *c = sentinel_subscribe(&w->url, &me->at);
        while (c && !w->stop && pump(w, c) == 0) {
        }
        if (c)
            redisFree(c);
        for (int i = 0; i < 5 && !w->stop; i++)
            nap_ms(100);
    }
    return NULL;
}

int md_sentinel_watch_start(const md_redis_url *u, md_sentinel_watch **out, md_err *e) {
    *out = NULL;
    struct md_sentinel_watch *w = calloc(1, sizeof *w);
    if (!w)
        return md_errf(e, MD_ENOMEM, "out of memory");
    w->url = *u;
    pthread_mutex_init(&w->mu, NULL);
    for (int i = 0; i < u->n_sentinels; i++) {
        watcher *t = &w->ws[w->n];
        t->w = w;
        t->at = u->sentinels[i];
        if (pthread_create(&t->tid, NULL, watch_one, t) == 0) {
            t->started = 1;
            w->n++;
        }
    }
    if (w->n == 0) {
        md_sentinel_watch_stop(w);
        return md_errf(e, MD_ENOMEM, "cannot start a thread to follow the Sentinels");
    }
    *out = w;
    return 0;
}

unsigned md_sentinel_watch_seq(md_sentinel_watch *w, char *addr, size_t addrsz) {
    pthread_mutex_lock(&w->mu);
    unsigned s = w->seq;
    snprintf(addr, addrsz, "%s", w->addr);
    pthread_mutex_unlock(&w->mu);
    return s;
}

void md_sentinel_watch_stop(md_sentinel_watch *w) {
    if (!w)
        return;
    w->stop = 1;
    for (int i = 0; i < w->n; i++)
        if (w->ws[i].started)
            pthread_join(w->ws[i].tid, NULL);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
