/* redis_url.c — Redis URLs (see redis.h): redis://[user:pass@]host:port/db,
 * unix:///path?db=N&user=U&password=P and
 * sentinel://[user:pass@]host:port,host:port/master[/db][?sentinel_user=U&sentinel_password=P]
 * into an md_redis_url. One parser for the parts the schemes share (user info, host:port,
 * database, the query), no I/O. */
#include "common/redis.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Percent-decode src[0..n) into out; MD_EINVAL (naming `what`) on a bad escape or overflow. */
static int pct_decode(const char *src, size_t n, char *out, size_t outsz, const char *what,
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

/* A database number from s[0..n) (empty: leaves *db); MD_EINVAL unless a number >= 0. */
static int parse_db(const char *s, size_t n, int *db, md_err *e) {
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

/* host[:port] or [ipv6][:port] from p[0..n) into out; an empty host is 127.0.0.1 and a
 * missing port is defport. MD_EINVAL says what is wrong. */
static int parse_hostport(const char *p, size_t n, int defport, md_redis_addr *out, md_err *e) {
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

/* user:pass@ or pass@ (a bare password, as redis-cli -u reads it) at the start of
 * *p[0..end): the last '@' ends it (passwords may hold '@' when escaped only). *p moves past
 * it. */
static int parse_userinfo(const char **p, const char *end, md_redis_url *u, md_err *e) {
    const char *at = NULL;
    for (const char *s = *p; s < end; s++)
        if (*s == '@')
            at = s;
    if (!at)
        return 0;
    const char *colon = memchr(*p, ':', (size_t)(at - *p));
    int rc;
    if (colon) {
        if ((rc = pct_decode(*p, (size_t)(colon - *p), u->user, sizeof u->user, "user", e)) ||
            (rc = pct_decode(colon + 1, (size_t)(at - colon - 1), u->pass, sizeof u->pass,
                             "password", e)))
            return rc;
    } else if ((rc = pct_decode(*p, (size_t)(at - *p), u->pass, sizeof u->pass, "password", e))) {
        return rc;
    }
    *p = at + 1;
    return 0;
}

/* A query item a scheme takes: its value percent-decoded into text[size], or (text NULL)
 * a database number into *db. */
typedef struct {
    const char *key;
    char *text;
    size_t size;
    const char *what; /* for messages */
    int *db;
} query_item;

/* "?k=v&k=v" from q (NULL or "": none) into the items; an unknown key is MD_EINVAL naming
 * the keys the scheme takes (where: "" or " in a sentinel:// URL"). */
static int parse_query(const char *q, const query_item *items, int n_items, const char *where,
                       md_err *e) {
    while (q && *q) {
        const char *kv = q + 1;
        const char *amp = strchr(kv, '&');
        size_t kvlen = amp ? (size_t)(amp - kv) : strlen(kv);
        const char *eq = memchr(kv, '=', kvlen);
        if (!eq)
            return md_errf(e, MD_EINVAL, "Redis URL: query item '%.*s' has no '='", (int)kvlen, kv);
        size_t klen = (size_t)(eq - kv), vlen = kvlen - klen - 1;
        const query_item *it = NULL;
        for (int i = 0; i < n_items && !it; i++)
            if (strlen(items[i].key) == klen && !memcmp(kv, items[i].key, klen))
                it = &items[i];
        if (!it) {
            char keys[128] = "";
            size_t w = 0;
            for (int i = 0; i < n_items && w < sizeof keys; i++)
                w += (size_t)snprintf(keys + w, sizeof keys - w, "%s%s", i ? ", " : "",
                                      items[i].key);
            return md_errf(e, MD_EINVAL, "Redis URL: unknown query item '%.*s'%s (%s)", (int)klen,
                           kv, where, keys);
        }
        int rc = it->text ? pct_decode(eq + 1, vlen, it->text, it->size, it->what, e)
                          : parse_db(eq + 1, vlen, it->db, e);
        if (rc)
            return rc;
        q = amp;
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
    const query_item items[] = {
        {"db", NULL, 0, "database", &u->db},
        {"user", u->user, sizeof u->user, "user", NULL},
        {"password", u->pass, sizeof u->pass, "password", NULL},
    };
    return parse_query(q, items, 3, "", e);
}

/* The comma-separated Sentinel list p[0..end) into u->sentinels. */
static int parse_sentinels(const char *p, const char *end, md_redis_url *u, md_err *e) {
    if (p == end)
        return md_errf(e, MD_EINVAL, "Redis URL: a sentinel:// URL needs at least one host");
    while (p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *he = comma ? comma : end;
        if (he == p)
            return md_errf(e, MD_EINVAL, "Redis URL: empty host in the sentinel list");
        if (u->n_sentinels == MD_REDIS_MAX_SENTINELS)
            return md_errf(e, MD_EINVAL, "Redis URL: more than %d sentinels",
                           MD_REDIS_MAX_SENTINELS);
        int rc = parse_hostport(p, (size_t)(he - p), 26379, &u->sentinels[u->n_sentinels], e);
        if (rc)
            return rc;
        u->n_sentinels++;
        p = comma ? comma + 1 : end;
        if (comma && p == end)
            return md_errf(e, MD_EINVAL, "Redis URL: empty host in the sentinel list");
    }
    return 0;
}

/* The part of a sentinel:// URL after the scheme: credentials, Sentinels, master, db, query. */
static int parse_sentinel(const char *rest, md_redis_url *u, md_err *e) {
    static const char k_needs_master[] =
        "Redis URL: a sentinel:// URL needs the master name after the hosts "
        "(sentinel://host1:26379,host2:26379/mymaster[/db])";
    const char *q = strchr(rest, '?');
    const char *end = q ? q : rest + strlen(rest);
    const char *slash = memchr(rest, '/', (size_t)(end - rest));
    if (!slash)
        return md_errf(e, MD_EINVAL, "%s", k_needs_master);
    const char *p = rest;
    int rc;
    if ((rc = parse_userinfo(&p, slash, u, e)) || (rc = parse_sentinels(p, slash, u, e)))
        return rc;
    const char *name = slash + 1;
    const char *dbslash = memchr(name, '/', (size_t)(end - name));
    const char *name_end = dbslash ? dbslash : end;
    if (name_end == name)
        return md_errf(e, MD_EINVAL, "%s", k_needs_master);
    if ((rc = pct_decode(name, (size_t)(name_end - name), u->master, sizeof u->master,
                         "master name", e)))
        return rc;
    if (dbslash && (rc = parse_db(dbslash + 1, (size_t)(end - dbslash - 1), &u->db, e)))
        return rc;
    const query_item items[] = {
        {"sentinel_user", u->sentinel_user, sizeof u->sentinel_user, "sentinel user", NULL},
        {"sentinel_password", u->sentinel_pass, sizeof u->sentinel_pass, "sentinel password", NULL},
    };
    return parse_query(q, items, 2, " in a sentinel:// URL", e);
}

/* redis://[user:pass@]host:port/db */
static int parse_tcp(const char *p, md_redis_url *u, md_err *e) {
    const char *slash = strchr(p, '/');
    const char *hostend = slash ? slash : p + strlen(p);
    int rc = parse_userinfo(&p, hostend, u, e);
    if (rc)
        return rc;
    md_redis_addr a;
    if ((rc = parse_hostport(p, (size_t)(hostend - p), 6379, &a, e)))
        return rc;
    snprintf(u->host, sizeof u->host, "%s", a.host);
    u->port = a.port;
    if (slash)
        return parse_db(slash + 1, strlen(slash + 1), &u->db, e);
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
        int rc = parse_sentinel(url + 11, u, e);
        u->port = 0; /* the node comes from the Sentinels */
        return rc;
    }
    if (strncmp(url, "redis://", 8))
        return md_errf(e, MD_EINVAL,
                       "Redis URL '%s' must start with redis://, unix:// or sentinel:// "
                       "(redis://[user:pass@]host:port/db, unix:///path, "
                       "sentinel://host:26379,host:26379/master[/db])",
                       url);
    return parse_tcp(url + 8, u, e);
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
