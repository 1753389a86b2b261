/* redis_dial.c — reaching a Redis node (see redis_dial.h): connect, AUTH and SELECT, either
 * at the address a URL names or at the primary Redis Sentinel names. hiredis 0.14 has no
 * Sentinel support, so this speaks the two commands needed: SENTINEL
 * get-master-addr-by-name on a Sentinel, ROLE on the node. */
#include "common/redis_dial.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

/* A Sentinel answers in well under a second on a healthy network; a dead one must not
 * hold up the next for the whole connect timeout. */
#define SENTINEL_TIMEOUT_MS 1000

static struct timeval tv_ms(int ms) {
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

int md_redis_dial_node(const md_redis_url *u, const char *host, int port, redisContext **out,
                       md_err *e) {
    *out = NULL;
    struct timeval ct = tv_ms(u->connect_timeout_ms > 0 ? u->connect_timeout_ms : 2000);
    redisContext *c = host ? redisConnectWithTimeout(host, port, ct)
                           : redisConnectUnixWithTimeout(u->unix_path, ct);
    char where[600];
    if (host)
        snprintf(where, sizeof where, "%s:%d", host, port);
    else
        snprintf(where, sizeof where, "unix://%s", u->unix_path);
    if (!c)
        return md_errf(e, MD_EREDIS, "cannot allocate a Redis context for %s", where);
    if (c->err) {
        md_errf(e, MD_EREDIS, "cannot connect to Redis at %s: %s", where, c->errstr);
        redisFree(c);
        return MD_EREDIS;
    }
    if (u->command_timeout_ms > 0)
        redisSetTimeout(c, tv_ms(u->command_timeout_ms));
    if (host)
        redisEnableKeepAlive(c);
    redisReply *r = NULL;
    if (u->pass[0]) {
        r = u->user[0] ? redisCommand(c, "AUTH %s %s", u->user, u->pass)
                       : redisCommand(c, "AUTH %s", u->pass);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            md_errf(e, MD_EREDIS, "Redis AUTH at %s failed: %s", where, r ? r->str : c->errstr);
            if (r)
                freeReplyObject(r);
            redisFree(c);
            return MD_EREDIS;
        }
        freeReplyObject(r);
    }
    if (u->db) {
        r = redisCommand(c, "SELECT %d", u->db);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            md_errf(e, MD_EREDIS, "Redis SELECT %d at %s failed: %s", u->db, where,
                    r ? r->str : c->errstr);
            if (r)
                freeReplyObject(r);
            redisFree(c);
            return MD_EREDIS;
        }
        freeReplyObject(r);
    }
    *out = c;
    return 0;
}

/* Connect to one Sentinel and AUTH with the sentinel credentials: *out, or MD_EREDIS. */
static int open_sentinel(const md_redis_url *u, const md_redis_addr *s, redisContext **out,
                         md_err *e) {
    *out = NULL;
    int ms = u->connect_timeout_ms > 0 && u->connect_timeout_ms < SENTINEL_TIMEOUT_MS
                 ? u->connect_timeout_ms
                 : SENTINEL_TIMEOUT_MS;
    redisContext *c = redisConnectWithTimeout(s->host, s->port, tv_ms(ms));
    if (!c)
        return md_errf(e, MD_EREDIS, "out of memory");
    if (c->err) {
        md_errf(e, MD_EREDIS, "%s", c->errstr);
        redisFree(c);
        return MD_EREDIS;
    }
    redisSetTimeout(c, tv_ms(ms));
    if (u->sentinel_pass[0]) {
        redisReply *r = u->sentinel_user[0]
                            ? redisCommand(c, "AUTH %s %s", u->sentinel_user, u->sentinel_pass)
                            : redisCommand(c, "AUTH %s", u->sentinel_pass);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            md_errf(e, MD_EREDIS, "AUTH failed: %s", r ? r->str : c->errstr);
            if (r)
                freeReplyObject(r);
            redisFree(c);
            return MD_EREDIS;
        }
        freeReplyObject(r);
    }
    *out = c;
    return 0;
}

/* Ask one Sentinel where the master is. 0 with host/port filled, else MD_EREDIS. */
static int ask(const md_redis_url *u, const md_redis_addr *s, char *host, size_t hostsz, int *port,
               md_err *e) {
    redisContext *c = NULL;
    if (open_sentinel(u, s, &c, e))
        return MD_EREDIS;
    redisReply *r = NULL;
    r = redisCommand(c, "SENTINEL get-master-addr-by-name %s", u->master);
    int rc = 0;
    if (!r)
        rc = md_errf(e, MD_EREDIS, "%s", c->errstr);
    else if (r->type == REDIS_REPLY_ERROR)
        rc = md_errf(e, MD_EREDIS, "%s", r->str);
    else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
             r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
        rc = md_errf(e, MD_EREDIS, "does not know a master named '%s'", u->master);
    else {
        int p = atoi(r->element[1]->str);
        if (p < 1 || p > 65535 || r->element[0]->len + 1 > hostsz)
            rc = md_errf(e, MD_EREDIS, "answered a bad address '%s:%s'", r->element[0]->str,
                         r->element[1]->str);
        else {
            snprintf(host, hostsz, "%s", r->element[0]->str);
            *port = p;
        }
    }
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return rc;
}

/* 1 when the Sentinel at c reports a failover of u->master under way (SENTINEL MASTER's
 * flags hold failover_in_progress), 0 when not, -1 when it could not say. */
static int failing_over(const md_redis_url *u, redisContext *c) {
    redisReply *r = redisCommand(c, "SENTINEL MASTER %s", u->master);
    int rc = -1;
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2)
        if (r->element[i]->str && !strcmp(r->element[i]->str, "flags") && r->element[i + 1]->str)
            rc = strstr(r->element[i + 1]->str, "failover_in_progress") != NULL;
    if (r)
        freeReplyObject(r);
    return rc;
}

int md_sentinel_settled(const md_redis_url *u, int max_wait_ms, char *addr, size_t addrsz,
                        md_err *e) {
    struct timeval t0, now;
    gettimeofday(&t0, NULL);
    for (;;) {
        int busy = 0, answered = 0;
        addr[0] = '\0';
        for (int i = 0; i < u->n_sentinels; i++) {
            char host[256];
            int port = 0;
            md_err se = {0};
            redisContext *c = NULL;
            if (open_sentinel(u, &u->sentinels[i], &c, &se))
                continue;
            int f = failing_over(u, c);
            redisFree(c);
            if (f < 0)
                continue;
            busy |= f;
            if (!answered && ask(u, &u->sentinels[i], host, sizeof host, &port, &se) == 0) {
                snprintf(addr, addrsz, "%s:%d", host, port);
                answered = 1;
            }
        }
        if (!answered)
            return md_errf(e, MD_EREDIS, "no Sentinel of '%s' answered", u->master);
        gettimeofday(&now, NULL);
        long waited = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_usec - t0.tv_usec) / 1000;
        if (!busy)
            return 0;
        if (waited >= max_wait_ms)
            return md_errf(e, MD_EREDIS, "a failover of '%s' was still under way after %ld ms",
                           u->master, waited);
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* 0 when ROLE on c says master; else MD_EREDIS naming the role. */
static int is_primary(redisContext *c, md_err *e) {
    redisReply *r = redisCommand(c, "ROLE");
    int rc = 0;
    if (!r)
        rc = md_errf(e, MD_EREDIS, "ROLE: %s", c->errstr);
    else if (r->type == REDIS_REPLY_ERROR)
        rc = md_errf(e, MD_EREDIS, "ROLE: %s", r->str);
    else if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
             r->element[0]->type != REDIS_REPLY_STRING)
        rc = md_errf(e, MD_EREDIS, "ROLE: unexpected reply");
    else if (strcmp(r->element[0]->str, "master"))
        rc = md_errf(e, MD_EREDIS, "it is a %s, not a primary (a failover in progress?)",
                     r->element[0]->str);
    if (r)
        freeReplyObject(r);
    return rc;
}

int md_sentinel_dial(const md_redis_url *u, const char *hint, redisContext **out, char *peer,
                     size_t peersz, md_err *e) {
    *out = NULL;
    char hhost[256];
    int hport = 0;
    if (hint && sscanf(hint, "%255[^:]:%d", hhost, &hport) == 2) {
        md_err he = {0};
        redisContext *c = NULL;
        if (md_redis_dial_node(u, hhost, hport, &c, &he) == 0 && is_primary(c, &he) == 0) {
            snprintf(peer, peersz, "%s:%d", hhost, hport);
            *out = c;
            return 0;
        }
        if (c)
            redisFree(c);
    }
    char why[512] = "";
    size_t used = 0;
    for (int i = 0; i < u->n_sentinels; i++) {
        const md_redis_addr *s = &u->sentinels[i];
        char host[256];
        int port = 0;
        md_err se = {0};
        redisContext *c = NULL;
        int rc = ask(u, s, host, sizeof host, &port, &se);
        if (rc == 0 && (rc = md_redis_dial_node(u, host, port, &c, &se)) == 0 &&
            (rc = is_primary(c, &se)) != 0) {
            redisFree(c);
            c = NULL;
        }
        if (rc == 0) {
            snprintf(peer, peersz, "%s:%d", host, port);
            *out = c;
            return 0;
        }
        if (used < sizeof why && port)
            used += (size_t)snprintf(why + used, sizeof why - used, "%s%s:%d: master at %s:%d: %s",
                                     used ? "; " : "", s->host, s->port, host, port, se.msg);
        else if (used < sizeof why)
            used += (size_t)snprintf(why + used, sizeof why - used, "%s%s:%d: %s", used ? "; " : "",
                                     s->host, s->port, se.msg);
    }
    return md_errf(e, MD_EREDIS, "no primary for master '%s' through %d sentinel(s): %s", u->master,
                   u->n_sentinels, why);
}
