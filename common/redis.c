/* redis.c — see redis.h. URL parsing, connect + AUTH + SELECT, reconnect with backoff,
 * failover replies seen as a lost connection. Sentinel lookups live in redis_sentinel.c. */
#include "common/redis.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "common/log.h"
#include "common/redis_priv.h"
#include "common/util.h"

struct md_redis {
    md_redis_url url;
    redisContext *c;
    unsigned generation;
    int dead;       /* a failover reply was seen: every call fails until reconnect */
    char peer[300]; /* host:port (or the socket path) of the live connection */
};

/* Percent-decode src[0..n) into out; MD_EINVAL on a bad escape or overflow. */
int md_redis_pct_decode(const char *src, size_t n, char *out, size_t outsz, const char *what,
                        md_err *e) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = src[i];
        if (ch == '%') {
            if (i + 2 >= n)
                return md_errf(e, MD_EINVAL, "Redis URL: truncated %%-escape in the %s", what);
            if (!isxdigit((unsigned char)src[i + 1]) || !isxdigit((unsigned char)src[i + 2]))
                return md_errf(e, MD_EINVAL, "Redis URL: bad %%-escape in the %s", what);
            char hex[3] = {src[i + 1], src[i + 2], 0};
            ch = (char)strtol(hex, NULL, 16);
            i += 2;
        }
        if (o + 1 >= outsz)
            return md_errf(e, MD_EINVAL, "Redis URL: the %s is too long", what);
        out[o++] = ch;
    }
    out[o] = '\0';
    return 0;
}

int md_redis_parse_db(const char *s, size_t n, int *db, md_err *e) {
    if (n == 0)
        return 0;
    char buf[16];
    if (n >= sizeof buf)
        return md_errf(e, MD_EINVAL, "Redis URL: database '%.*s' is not a number", (int)n, s);
    memcpy(buf, s, n);
    buf[n] = 0;
    char *end;
    long v = strtol(buf, &end, 10);
    if (*end || v < 0 || v > 100000)
        return md_errf(e, MD_EINVAL, "Redis URL: database '%s' is not a number >= 0", buf);
    *db = (int)v;
    return 0;
}

int md_redis_parse_hostport(const char *p, size_t n, int defport, md_redis_addr *out, md_err *e) {
    const char *hostend = p + n;
    const char *colon = NULL;
    out->port = defport;
    if (n > 0 && *p == '[') { /* [ipv6]:port */
        const char *rb = memchr(p, ']', n);
        if (!rb)
            return md_errf(e, MD_EINVAL, "Redis URL: unclosed '[' in the host");
        if ((size_t)(rb - p - 1) >= sizeof out->host)
            return md_errf(e, MD_EINVAL, "Redis URL: host too long");
        memcpy(out->host, p + 1, (size_t)(rb - p - 1));
        out->host[rb - p - 1] = 0;
        if (rb + 1 < hostend && rb[1] != ':')
            return md_errf(e, MD_EINVAL, "Redis URL: '%.*s' follows ']' in the host",
                           (int)(hostend - rb - 1), rb + 1);
        colon = rb + 1 < hostend ? rb + 1 : NULL;
    } else {
        colon = memchr(p, ':', n);
        const char *he = colon ? colon : hostend;
        if ((size_t)(he - p) >= sizeof out->host)
            return md_errf(e, MD_EINVAL, "Redis URL: host too long");
        memcpy(out->host, p, (size_t)(he - p));
        out->host[he - p] = 0;
    }
    if (!out->host[0])
        snprintf(out->host, sizeof out->host, "127.0.0.1");
    if (colon) {
        char buf[16];
        size_t pn = (size_t)(hostend - colon - 1);
        if (pn == 0 || pn >= sizeof buf)
            return md_errf(e, MD_EINVAL, "Redis URL: bad port in '%.*s'", (int)n, p);
        memcpy(buf, colon + 1, pn);
        buf[pn] = 0;
        char *end;
        long port = strtol(buf, &end, 10);
        if (*end || port < 1 || port > 65535)
            return md_errf(e, MD_EINVAL, "Redis URL: port '%s' is not in 1..65535", buf);
        out->port = (int)port;
    }
    return 0;
}

/* unix:///path?db=N&user=U&password=P */
static int parse_unix(const char *rest, md_redis_url *u, md_err *e) {
    const char *q = strchr(rest, '?');
    size_t plen = q ? (size_t)(q - rest) : strlen(rest);
    if (plen == 0 || rest[0] != '/')
        return md_errf(e, MD_EINVAL,
                       "Redis URL: unix:// needs an absolute socket path "
                       "(unix:///run/redis.sock)");
    if (plen >= sizeof u->unix_path)
        return md_errf(e, MD_EINVAL, "Redis URL: socket path too long");
    memcpy(u->unix_path, rest, plen);
    u->unix_path[plen] = 0;
    while (q && *q) {
        const char *kv = q + 1;
        const char *amp = strchr(kv, '&');
        size_t kvlen = amp ? (size_t)(amp - kv) : strlen(kv);
        const char *eq = memchr(kv, '=', kvlen);
        if (!eq)
            return md_errf(e, MD_EINVAL, "Redis URL: query item '%.*s' has no '='", (int)kvlen, kv);
        size_t klen = (size_t)(eq - kv), vlen = kvlen - klen - 1;
        int rc;
        if (klen == 2 && !memcmp(kv, "db", 2))
            rc = md_redis_parse_db(eq + 1, vlen, &u->db, e);
        else if (klen == 4 && !memcmp(kv, "user", 4))
            rc = md_redis_pct_decode(eq + 1, vlen, u->user, sizeof u->user, "user", e);
        else if (klen == 8 && !memcmp(kv, "password", 8))
            rc = md_redis_pct_decode(eq + 1, vlen, u->pass, sizeof u->pass, "password", e);
        else
            return md_errf(e, MD_EINVAL,
                           "Redis URL: unknown query item '%.*s' (db, user, password)", (int)klen,
                           kv);
        if (rc)
            return rc;
        q = amp;
    }
    return 0;
}

int md_redis_url_parse(const char *url, md_redis_url *u, md_err *e) {
    memset(u, 0, sizeof *u);
    u->port = 6379;
    u->connect_timeout_ms = 2000;
    u->command_timeout_ms = 10000;
    if (!url || !*url)
        return md_errf(e, MD_EINVAL, "Redis URL is empty");
    if (!strncmp(url, "unix://", 7))
        return parse_unix(url + 7, u, e);
    if (!strncmp(url, "sentinel://", 11)) {
        int rc = md_sentinel_parse(url + 11, u, e);
        u->port = 0; /* the node comes from the Sentinels */
        return rc;
    }
    if (strncmp(url, "redis://", 8))
        return md_errf(e, MD_EINVAL,
                       "Redis URL '%s' must start with redis://, unix:// or sentinel:// "
                       "(redis://[user:pass@]host:port/db, unix:///path, "
                       "sentinel://host:26379,host:26379/master[/db])",
                       url);
    const char *p = url + 8;
    const char *slash = strchr(p, '/');
    const char *hostend = slash ? slash : p + strlen(p);
    /* userinfo: the last '@' before the path (passwords may hold '@' when escaped only) */
    const char *at = NULL;
    for (const char *s = p; s < hostend; s++)
        if (*s == '@')
            at = s;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        int rc;
        if (colon) {
            if ((rc = md_redis_pct_decode(p, (size_t)(colon - p), u->user, sizeof u->user, "user",
                                          e)))
                return rc;
            if ((rc = md_redis_pct_decode(colon + 1, (size_t)(at - colon - 1), u->pass,
                                          sizeof u->pass, "password", e)))
                return rc;
        } else if ((rc = md_redis_pct_decode(p, (size_t)(at - p), u->pass, sizeof u->pass,
                                             "password", e))) {
            return rc; /* redis://secret@host: a bare password, as redis-cli -u reads it */
        }
        p = at + 1;
    }
    md_redis_addr a;
    int rc = md_redis_parse_hostport(p, (size_t)(hostend - p), 6379, &a, e);
    if (rc)
        return rc;
    snprintf(u->host, sizeof u->host, "%s", a.host);
    u->port = a.port;
    if (slash)
        return md_redis_parse_db(slash + 1, strlen(slash + 1), &u->db, e);
    return 0;
}

const char *md_redis_default_url(void) {
    const char *v = getenv("MEDLEY_REDIS");
    return (v && *v) ? v : "redis://127.0.0.1:6379/0";
}

void md_redis_url_describe(const md_redis_url *u, char *out, size_t outsz) {
    const char *pw = u->pass[0] ? "***" : "";
    if (u->master[0]) {
        size_t n =
            (size_t)snprintf(out, outsz, "sentinel://%s%s%s%s", u->user,
                             u->user[0] || pw[0] ? ":" : "", pw, u->user[0] || pw[0] ? "@" : "");
        for (int i = 0; i < u->n_sentinels && n < outsz; i++)
            n += (size_t)snprintf(out + n, outsz - n, "%s%s:%d", i ? "," : "", u->sentinels[i].host,
                                  u->sentinels[i].port);
        if (n < outsz)
            snprintf(out + n, outsz - n, "/%s/%d", u->master, u->db);
    } else if (u->unix_path[0])
        snprintf(out, outsz, "unix://%s%s%s", u->unix_path, u->user[0] || pw[0] ? "?auth" : "",
                 u->db ? " db" : "");
    else if (u->user[0] || pw[0])
        snprintf(out, outsz, "redis://%s:%s@%s:%d/%d", u->user, pw, u->host, u->port, u->db);
    else
        snprintf(out, outsz, "redis://%s:%d/%d", u->host, u->port, u->db);
}

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

/* Dial the node u names (through the Sentinels for sentinel://); peer gets its address. */
static int dial(const md_redis_url *u, redisContext **out, char *peer, size_t peersz, md_err *e) {
    if (u->master[0])
        return md_sentinel_dial(u, out, peer, peersz, e);
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
    int rc = dial(u, &r->c, r->peer, sizeof r->peer, e);
    if (rc) {
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
        if (dial(&r->url, &r->c, r->peer, sizeof r->peer, &last) == 0) {
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
        /* sleep in short slices so a stop request is seen quickly */
        for (int slept = 0; slept < backoff && !(stop && *stop); slept += 50)
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

static redisReply *dead(md_redis *r, md_err *e) {
    md_errf(e, MD_EREDIS, "Redis %s: %s", r->c ? "connection dropped" : "is not connected",
            r->c && r->c->err ? r->c->errstr : "reconnect first");
    return NULL;
}

redisReply *md_redis_cmd(md_redis *r, md_err *e, const char *fmt, ...) {
    if (!r->c || r->dead)
        return dead(r, e);
    va_list ap;
    va_start(ap, fmt);
    void *reply = redisvCommand(r->c, fmt, ap);
    va_end(ap);
    return check(r, reply, e);
}

redisReply *md_redis_cmd_argv(md_redis *r, int argc, const char **argv, const size_t *lens,
                              md_err *e) {
    if (!r->c || r->dead)
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
    if (!r->c || r->dead)
        return dead(r, e);
    if (redisGetReply(r->c, &reply) != REDIS_OK)
        reply = NULL;
    return check(r, reply, e);
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
