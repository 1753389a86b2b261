/* redis_sentinel.c — sentinel:// URLs: parsing, and finding the primary through Redis
 * Sentinel (see redis.h). hiredis 0.14 has no Sentinel support, so this speaks the two
 * commands needed: SENTINEL get-master-addr-by-name on a Sentinel, ROLE on the node. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "common/redis_priv.h"

/* A Sentinel answers in well under a second on a healthy network; a dead one must not
 * hold up the next for the whole connect timeout. */
#define SENTINEL_TIMEOUT_MS 1000

static int parse_query(const char *q, md_redis_url *u, md_err *e) {
    while (q && *q) {
        const char *kv = q + 1;
        const char *amp = strchr(kv, '&');
        size_t kvlen = amp ? (size_t)(amp - kv) : strlen(kv);
        const char *eq = memchr(kv, '=', kvlen);
        if (!eq)
            return md_errf(e, MD_EINVAL, "Redis URL: query item '%.*s' has no '='", (int)kvlen, kv);
        size_t klen = (size_t)(eq - kv), vlen = kvlen - klen - 1;
        int rc;
        if (klen == 13 && !memcmp(kv, "sentinel_user", 13))
            rc = md_redis_pct_decode(eq + 1, vlen, u->sentinel_user, sizeof u->sentinel_user,
                                     "sentinel user", e);
        else if (klen == 17 && !memcmp(kv, "sentinel_password", 17))
            rc = md_redis_pct_decode(eq + 1, vlen, u->sentinel_pass, sizeof u->sentinel_pass,
                                     "sentinel password", e);
        else
            return md_errf(e, MD_EINVAL,
                           "Redis URL: unknown query item '%.*s' in a sentinel:// URL "
                           "(sentinel_user, sentinel_password)",
                           (int)klen, kv);
        if (rc)
            return rc;
        q = amp;
    }
    return 0;
}

int md_sentinel_parse(const char *rest, md_redis_url *u, md_err *e) {
    const char *q = strchr(rest, '?');
    const char *end = q ? q : rest + strlen(rest);
    const char *slash = memchr(rest, '/', (size_t)(end - rest));
    if (!slash)
        return md_errf(e, MD_EINVAL,
                       "Redis URL: a sentinel:// URL needs the master name after the hosts "
                       "(sentinel://host1:26379,host2:26379/mymaster[/db])");
    const char *p = rest;
    const char *at = NULL;
    for (const char *s = p; s < slash; s++)
        if (*s == '@')
            at = s;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        int rc;
        if (colon) {
            if ((rc = md_redis_pct_decode(p, (size_t)(colon - p), u->user, sizeof u->user, "user",
                                          e)) ||
                (rc = md_redis_pct_decode(colon + 1, (size_t)(at - colon - 1), u->pass,
                                          sizeof u->pass, "password", e)))
                return rc;
        } else if ((rc = md_redis_pct_decode(p, (size_t)(at - p), u->pass, sizeof u->pass,
                                             "password", e))) {
            return rc;
        }
        p = at + 1;
    }
    if (p == slash)
        return md_errf(e, MD_EINVAL, "Redis URL: a sentinel:// URL needs at least one host");
    while (p < slash) {
        const char *comma = memchr(p, ',', (size_t)(slash - p));
        const char *he = comma ? comma : slash;
        if (he == p)
            return md_errf(e, MD_EINVAL, "Redis URL: empty host in the sentinel list");
        if (u->n_sentinels == MD_REDIS_MAX_SENTINELS)
            return md_errf(e, MD_EINVAL, "Redis URL: more than %d sentinels",
                           MD_REDIS_MAX_SENTINELS);
        int rc =
            md_redis_parse_hostport(p, (size_t)(he - p), 26379, &u->sentinels[u->n_sentinels], e);
        if (rc)
            return rc;
        u->n_sentinels++;
        p = comma ? comma + 1 : slash;
        if (comma && p == slash)
            return md_errf(e, MD_EINVAL, "Redis URL: empty host in the sentinel list");
    }
    const char *name = slash + 1;
    const char *dbslash = memchr(name, '/', (size_t)(end - name));
    const char *name_end = dbslash ? dbslash : end;
    if (name_end == name)
        return md_errf(e, MD_EINVAL,
                       "Redis URL: a sentinel:// URL needs the master name after the hosts "
                       "(sentinel://host1:26379,host2:26379/mymaster[/db])");
    int rc = md_redis_pct_decode(name, (size_t)(name_end - name), u->master, sizeof u->master,
                                 "master name", e);
    if (rc)
        return rc;
    if (dbslash && (rc = md_redis_parse_db(dbslash + 1, (size_t)(end - dbslash - 1), &u->db, e)))
        return rc;
    return parse_query(q, u, e);
}

static struct timeval tv_ms(int ms) {
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

/* Ask one Sentinel where the master is. 0 with host/port filled, else MD_EREDIS. */
static int ask(const md_redis_url *u, const md_redis_addr *s, char *host, size_t hostsz, int *port,
               md_err *e) {
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
    redisReply *r = NULL;
    if (u->sentinel_pass[0]) {
        r = u->sentinel_user[0] ? redisCommand(c, "AUTH %s %s", u->sentinel_user, u->sentinel_pass)
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

int md_sentinel_dial(const md_redis_url *u, redisContext **out, char *peer, size_t peersz,
                     md_err *e) {
    *out = NULL;
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
