/* redis.c — see redis.h. Connections: open, reconnect with backoff, commands, failover
 * replies seen as a lost connection. URLs are parsed in redis_url.c; reaching the node
 * (directly or through Sentinel) is redis_dial.c. */
#include "common/redis.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/redis_dial.h"
#include "common/redis_watch.h"
#include "common/util.h"

struct md_redis {
    md_redis_url url;
    redisContext *c;
    unsigned generation;
    int dead;                 /* a failover reply was seen: every call fails until reconnect */
    char peer[300];           /* host:port (or the socket path) of the live connection */
    md_sentinel_watch *watch; /* sentinel:// only: +switch-master as announced */
    unsigned watch_seen;      /* the announcement this connection has followed */
};

/* Dial the node u names (through the Sentinels for sentinel://, the primary they last
 * announced first); peer gets its address. */
static int dial(md_redis *r, const md_redis_url *u, redisContext **out, char *peer, size_t peersz,
                md_err *e) {
    if (u->master[0]) {
        char hint[300] = "";
        if (r->watch)
            r->watch_seen = md_sentinel_watch_seq(r->watch, hint, sizeof hint);
        return md_sentinel_dial(u, hint[0] ? hint : NULL, out, peer, peersz, e);
    }
    if (u->unix_path[0])
        snprintf(peer, peersz, "%s", u->unix_path);
    else
        snprintf(peer, peersz, "%s:%d", u->host, u->port);
    return md_redis_dial_node(u, u->unix_path[0] ? NULL : u->host, u->port, out, e);
}

int md_redis_open(const md_redis_url *u, md_redis **out, md_err *e) {
    *out = NULL;
    md_redis *r = calloc(1, sizeof *r);
    if (!r)
        return md_errf(e, MD_ENOMEM, "out of memory");
    r->url = *u;
    md_err we = {0};
    if (u->master[0] && md_sentinel_watch_start(u, &r->watch, &we))
        MD_WARN("redis", "%s: a failover is followed only when the old primary refuses", we.msg);
    int rc = dial(r, u, &r->c, r->peer, sizeof r->peer, e);
    if (rc) {
        md_sentinel_watch_stop(r->watch);
        free(r);
        return rc;
    }
    if (u->master[0])
        MD_INFO("redis", "Sentinel: the primary of '%s' is %s", u->master, r->peer);
    r->generation = 1;
    *out = r;
    return 0;
}

void md_redis_close(md_redis *r) {
    if (!r)
        return;
    if (r->c)
        redisFree(r->c);
    md_sentinel_watch_stop(r->watch);
    free(r);
}

redisContext *md_redis_ctx(md_redis *r) {
    return r->c;
}
unsigned md_redis_generation(const md_redis *r) {
    return r->generation;
}
const char *md_redis_peer(const md_redis *r) {
    return r->peer;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Whether the Sentinels announced a primary since this connection last dialled. */
static int announced(md_redis *r) {
    char addr[300];
    return r->watch && md_sentinel_watch_seq(r->watch, addr, sizeof addr) != r->watch_seen;
}

int md_redis_reconnect(md_redis *r, int max_wait_ms, volatile sig_atomic_t *stop, md_err *e) {
    if (r->c) {
        redisFree(r->c);
        r->c = NULL;
    }
    r->dead = 0;
    char was[sizeof r->peer];
    snprintf(was, sizeof was, "%s", r->peer);
    uint64_t t0 = md_mono_ns();
    int backoff = 50, attempt = 0;
    md_err last = {0};
    for (;;) {
        if (stop && *stop)
            return md_errf(e, MD_ECANCEL, "stopped while reconnecting to Redis");
        if (dial(r, &r->url, &r->c, r->peer, sizeof r->peer, &last) == 0) {
            r->generation++;
            if (attempt)
                MD_INFO("redis", "reconnected after %d attempts", attempt + 1);
            if (strcmp(was, r->peer))
                MD_WARN("redis", "the primary%s%s is now %s (was %s): followed a failover",
                        r->url.master[0] ? " of " : "", r->url.master, r->peer, was);
            return 0;
        }
        attempt++;
        if (attempt == 1 || attempt % 10 == 0)
            MD_WARN("redis", "%s; retrying in %d ms", last.msg, backoff);
        uint64_t waited = (md_mono_ns() - t0) / 1000000;
        if (max_wait_ms >= 0 && waited >= (uint64_t)max_wait_ms)
            return md_errf(e, MD_EREDIS, "%s (gave up after %llu ms)", last.msg,
                           (unsigned long long)waited);
        /* sleep in short slices so a stop request, or the Sentinels announcing the new
         * primary, is seen quickly */
        for (int slept = 0; slept < backoff && !(stop && *stop) && !announced(r); slept += 50)
            sleep_ms(50);
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
    }
}

/* Error replies that mean "this node is no longer (or not yet) the primary you want": a
 * demoted primary refuses writes (READONLY, also inside scripts) and unblocks blocked reads
 * (UNBLOCKED); a replica cut from its primary says MASTERDOWN; a node loading its data says
 * LOADING; a primary with `min-replicas-to-write` that lost its replicas (the minority side
 * of a partition) says NOREPLICAS. Retrying on the same connection cannot help; a reconnect
 * (through the Sentinels) can. */
static int failover_reply(const redisReply *rep) {
    static const char *const codes[] = {"READONLY ", "UNBLOCKED ", "MASTERDOWN ", "LOADING ",
                                        "NOREPLICAS "};
    if (rep->type != REDIS_REPLY_ERROR || !rep->str)
        return 0;
    for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
        if (!strncmp(rep->str, codes[i], strlen(codes[i])))
            return 1;
    return 0;
}

static redisReply *check(md_redis *r, void *reply, md_err *e) {
    if (!reply) {
        md_errf(e, MD_EREDIS, "Redis connection lost: %s",
                r->c && r->c->err ? r->c->errstr : "no reply");
        return NULL;
    }
    redisReply *rep = reply;
    if (failover_reply(rep)) {
        /* The context stays allocated (callers may hold md_redis_ctx()), but with err set
         * hiredis sends nothing more on it, and r->dead makes every later call fail. */
        md_errf(e, MD_EREDIS, "Redis at %s: %.200s (treated as a lost connection)", r->peer,
                rep->str);
        freeReplyObject(rep);
        r->dead = 1;
        if (r->c && !r->c->err) {
            r->c->err = REDIS_ERR_OTHER;
            snprintf(r->c->errstr, sizeof r->c->errstr, "%s", e->msg);
        }
        return NULL;
    }
    return rep;
}

/* Mark the connection dead with e's sentence: every later call fails until a reconnect. */
static void kill_conn(md_redis *r, md_err *e) {
    r->dead = 1;
    if (r->c && !r->c->err) {
        r->c->err = REDIS_ERR_OTHER;
        snprintf(r->c->errstr, sizeof r->c->errstr, "%s", e->msg);
    }
}

/* 1 (connection marked dead, e set) when the Sentinels announced a primary other than the one
 * this connection talks to since it was made: stop writing to a demoted node at once. */
static int switched(md_redis *r, md_err *e) {
    if (!r->watch)
        return 0;
    char addr[300];
    unsigned seq = md_sentinel_watch_seq(r->watch, addr, sizeof addr);
    if (seq == r->watch_seen)
        return 0;
    r->watch_seen = seq;
    if (!strcmp(addr, r->peer))
        return 0;
    md_errf(e, MD_EREDIS,
            "the Sentinels switched the primary of '%s' to %s (this connection is "
            "to %s): reconnecting",
            r->url.master, addr, r->peer);
    kill_conn(r, e);
    return 1;
}

static redisReply *dead(md_redis *r, md_err *e) {
    md_errf(e, MD_EREDIS, "Redis %s: %s", r->c ? "connection dropped" : "is not connected",
            r->c && r->c->err ? r->c->errstr : "reconnect first");
    return NULL;
}

redisReply *md_redis_cmd(md_redis *r, md_err *e, const char *fmt, ...) {
    if (!r->c || r->dead || switched(r, e))
        return dead(r, e);
    va_list ap;
    va_start(ap, fmt);
    void *reply = redisvCommand(r->c, fmt, ap);
    va_end(ap);
    return check(r, reply, e);
}

redisReply *md_redis_cmd_argv(md_redis *r, int argc, const char **argv, const size_t *lens,
                              md_err *e) {
    if (!r->c || r->dead || switched(r, e))
        return dead(r, e);
    return check(r, redisCommandArgv(r->c, argc, argv, lens), e);
}

int md_redis_check_prefix(md_redis *r, const char *prefix, md_err *e) {
    redisReply *rep = md_redis_cmd(r, e, "EXISTS %splan", prefix);
    if (!rep)
        return MD_EREDIS;
    int rc = 0;
    if (rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "NOPERM", 6))
        rc = md_errf(e, MD_EINVAL,
                     "Redis refused key %splan to user '%s' (%s): with --prefix %s its ACL needs "
                     "~%s* and &%s* (docs/operations.md, \"TLS and least privilege\")",
                     prefix, r->url.user[0] ? r->url.user : "default", rep->str, prefix, prefix,
                     prefix);
    else if (rep->type == REDIS_REPLY_ERROR)
        rc = md_errf(e, MD_EREDIS, "EXISTS %splan: %s", prefix, rep->str);
    freeReplyObject(rep);
    return rc;
}

redisReply *md_redis_get_reply(md_redis *r, md_err *e) {
    void *reply = NULL;
    if (!r->c || r->dead || switched(r, e))
        return dead(r, e);
    if (redisGetReply(r->c, &reply) != REDIS_OK)
        reply = NULL;
    return check(r, reply, e);
}

int md_redis_check_primary(md_redis *r, md_err *e) {
    redisReply *rep = md_redis_cmd(r, e, "ROLE");
    if (!rep)
        return MD_EREDIS;
    int rc = 0;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 &&
        rep->element[0]->type == REDIS_REPLY_STRING && strcmp(rep->element[0]->str, "master")) {
        rc = md_errf(e, MD_EREDIS, "Redis at %s is a %s now, not a primary: reconnecting", r->peer,
                     rep->element[0]->str);
        kill_conn(r, e);
    }
    freeReplyObject(rep);
    return rc;
}

int md_redis_confirm_primary(md_redis *r, int max_wait_ms, md_err *e) {
    if (!r->url.master[0])
        return 0;
    char addr[300];
    if (md_sentinel_settled(&r->url, max_wait_ms, addr, sizeof addr, e))
        return MD_EREDIS;
    if (strcmp(addr, r->peer))
        return md_errf(e, MD_ENOTFOUND, "the Sentinels now name %s as the primary of '%s', not %s",
                       addr, r->url.master, r->peer);
    return 0;
}

int md_redis_wait_replicas(md_redis *r, int timeout_ms, int *replicas, int *acked, md_err *e) {
    *replicas = *acked = 0;
    /* ROLE, not INFO: a primary answers ["master", offset, [[ip, port, offset]...]], the
     * replicas connected to it; ROLE is the narrower grant for an ACL user. */
    redisReply *rep = md_redis_cmd(r, e, "ROLE");
    if (!rep)
        return MD_EREDIS;
    int n = 0, rc = 0;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 3 &&
        rep->element[0]->type == REDIS_REPLY_STRING && !strcmp(rep->element[0]->str, "master") &&
        rep->element[2]->type == REDIS_REPLY_ARRAY)
        n = (int)rep->element[2]->elements;
    else if (rep->type == REDIS_REPLY_ERROR)
        rc = md_errf(e, MD_EREDIS, "ROLE at %s: %s", r->peer, rep->str);
    freeReplyObject(rep);
    if (rc || n <= 0)
        return rc;
    *replicas = n;
    rep = md_redis_cmd(r, e, "WAIT %d %d", n, timeout_ms);
    if (!rep)
        return MD_EREDIS;
    if (rep->type == REDIS_REPLY_INTEGER)
        *acked = (int)rep->integer;
    else
        rc = md_errf(e, MD_EREDIS, "WAIT at %s: %s", r->peer,
                     rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    freeReplyObject(rep);
    return rc;
}
